#!/bin/sh
# Start tritonserver with its restricted APIs locked by the admin key, the key never on a command line or in
# an environment: it is read from a file (a Docker or Kubernetes secret) through file descriptor 3, and
# the shim (tpserve/server/triton/triton_shim.c, LD_PRELOAD) fills the placeholder in before tritonserver's main() runs.
# The same shim keeps the Python backend's shared memory private and refuses loads that carry files.
# Arguments are tritonserver's own (--model-repository=... and so on).
set -eu
key_file="${TRITON_ADMIN_KEY_FILE:-/run/secrets/triton_admin_key}"
shim="${TRITON_SHIM:-/opt/triton_shim/libtriton_shim.so}"
if [ ! -r "$key_file" ]; then
    echo "serve.sh: no readable admin key at $key_file (TRITON_ADMIN_KEY_FILE)" >&2
    exit 2
fi
if [ ! -r "$shim" ]; then
    echo "serve.sh: the shim $shim is missing (TRITON_SHIM); without it the key would be unusable" >&2
    exit 2
fi
umask 077
restricted="model-repository,shared-memory,statistics,trace,logging:admin-key=@TRITON_ADMIN_KEY@"
export LD_PRELOAD="$shim" TRITON_SECRET_FD=3
exec "${TRITON_PROGRAM:-tritonserver}" --http-restricted-api="$restricted" --grpc-restricted-protocol="$restricted" \
    "$@" 3<"$key_file"

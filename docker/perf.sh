#!/bin/sh
# perf_analyzer with the admin key from a file (fd 3, filled in by the shim), never on its command line.
# Arguments are perf_analyzer's own; the admin header is added here.
set -eu
key_file="${TRITON_ADMIN_KEY_FILE:-/run/secrets/triton_admin_key}"
export LD_PRELOAD="${TRITON_SHIM:-/opt/triton_shim/libtriton_shim.so}" TRITON_SECRET_FD=3
exec perf_analyzer -H "triton-grpc-protocol-admin-key:@TRITON_ADMIN_KEY@" "$@" 3<"$key_file"

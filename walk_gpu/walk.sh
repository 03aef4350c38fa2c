#!/bin/bash
# The README's GPU walk on a user's tabular model (two inputs, two outputs), through the bundle with the defaults.
REPO=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p $OUT
exec > >(tee $OUT/walk.log) 2>&1
set -x
PY=${PY:-python3}
B=$REPO/dist/b
for t in dist/triton-bundle-py312*.tar.xz; do mkdir -p $B && tar -xJf $t -C $B; done
if [ -d $B/triton-bundle ]; then
  eval "$(sh $B/triton-bundle/install.sh)"
  echo "TPSERVE_STUB_PYTHON=$TPSERVE_STUB_PYTHON"
  $PY -m pip install -q --no-index --no-deps --target $B/triton-bundle/site dist/pw/*.whl
fi
export PYTHONPATH=$REPO:$PYTHONPATH
nvidia-smi -L
$PY -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__)"
$PY -c "import onnxruntime; print('onnxruntime', onnxruntime.__version__)"
W=/tmp/walk; rm -rf $W; mkdir -p $W/src/risk; touch $W/src/risk/__init__.py
cp walk_gpu/risk_model.py $W/src/risk/model.py; cp walk_gpu/models.toml $W/
cd $W
run() {  # $1: label; rest: build flags
  label=$1; shift
  echo "===== $label: build $*"
  t=$(date +%s); $PY -m tpserve.builders build --spec models.toml --repo repo_$label "$@" 2>&1 | tail -25; echo "build rc ${PIPESTATUS[0]} in $(( $(date +%s) - t )) s"
  $PY -m tpserve.server start --repo repo_$label --state-dir state_$label 2>&1 | tail -8
  $PY -m tpserve.loadtest perf --state-dir state_$label --concurrency "1 16" --interval-ms 500 --out reports_$label > perf_$label.log 2>&1 &
  perf=$!
  sleep 5; $PY $REPO/walk_gpu/check.py state_$label 2>&1 | tail -30   # under the perf sweep's load
  wait $perf; echo "perf rc $?"; tail -25 perf_$label.log
  cp -r reports_$label $OUT/ 2>/dev/null; find reports_$label -name "*.md" -exec cat {} \; | head -40
  $PY -m tpserve.server stop --state-dir state_$label 2>&1 | tail -2
}
[ -z "$SKIP_GPU" ] && run gpu --compiled fp16 --kind KIND_GPU --inprocess
run default

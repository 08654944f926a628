#!/usr/bin/env bash
# One call on the GPU machine: register NVIDIA's OpenCL driver (.gpu/setup.sh, see README), then run
# the device tests and every benchmark, each under its own time limit, writing logs and JSON to $OUT.
#   usage (on the GPU machine, from the repo root): bash bench/gpu_run.sh [seconds-per-bench]
set -u
limit=${1:-120}
out=${OUT:-bench/results}
mkdir -p "$out"
source .gpu/setup.sh > "$out/setup.txt" 2>&1 || { cat "$out/setup.txt"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NETCL_CACHE_DIR=/tmp/netcl-cache PYTHONUNBUFFERED=1
python3 -m netcl.cli devices > "$out/devices.txt" 2>&1
tests=$(ls -d tests/core tests/ops tests/jit tests/autograd tests/nn tests/optim 2>/dev/null)
timeout 240 python3 -m pytest -q -x -p no:cacheprovider $tests > "$out/tests_gpu.txt" 2>&1
tail -3 "$out/tests_gpu.txt"
for b in transfer elementwise gemm conv train_step; do
  [ -f "bench/$b.py" ] || continue
  args="--out $out/$b.json"
  [ "$b" = transfer ] && args="$args --sizes-mb 1,16,256"
  [ "$b" != transfer ] && [ "$b" != elementwise ] && args="$args --gpu"
  echo "== bench/$b.py $args"
  timeout "$limit" python3 "bench/$b.py" $args > "$out/$b.txt" 2>&1
  echo "rc=$?"; tail -25 "$out/$b.txt"
done

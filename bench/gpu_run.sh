#!/usr/bin/env bash
# One call on the GPU machine: register NVIDIA's OpenCL driver (.gpu/setup.sh, see README), then run
# the device tests and the named benchmarks, each under its own time limit, logs and JSON into $OUT.
#   usage (GPU machine, repo root): bash bench/gpu_run.sh SECONDS_PER_BENCH [tests] [bench ...]
set -u
limit=${1:-120}; shift || true
out=${OUT:-bench/results}
mkdir -p "$out"
source .gpu/setup.sh > "$out/setup.txt" 2>&1 || { cat "$out/setup.txt"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NETCL_CACHE_DIR=/tmp/netcl-cache PYTHONUNBUFFERED=1
python3 -m netcl.cli devices > "$out/devices.txt" 2>&1
for what in "$@"; do
  if [ "$what" = tests ]; then
    dirs=$(ls -d tests/core tests/ops tests/jit tests/autograd tests/nn tests/optim 2>/dev/null)
    echo "== pytest on the GPU: $dirs"
    timeout 300 python3 -m pytest -q -p no:cacheprovider $dirs > "$out/tests_gpu.txt" 2>&1
    grep -E "passed|failed|FAILED|Error" "$out/tests_gpu.txt" | tail -15
    continue
  fi
  case "$what" in
    transfer) args="--out $out/transfer.json --sizes-mb 1,16,256" ;;
    gemm) args="--gpu --json $out/gemm.json --tinygrad-timeout 90 --configs quick" ;;
    *) args="--gpu --out $out/$what.json" ;;
  esac
  [ -f "bench/$what.py" ] || { echo "== no bench/$what.py"; continue; }
  echo "== bench/$what.py $args"
  timeout "$limit" python3 "bench/$what.py" $args > "$out/$what.txt" 2>&1
  echo "rc=$?"; tail -30 "$out/$what.txt"
done

#!/usr/bin/env bash
# One call on a GPU machine: run the device tests and the named benchmarks, each under its own time
# limit, logs and JSON into $OUT (default bench/results). The GPU's OpenCL driver must be visible to
# pyopencl: either registered with the ICD loader as usual, or through an optional .gpu/setup.sh in the
# checkout, sourced first when present (a script that installs pyopencl and registers a driver that
# is not registered system-wide, as on the project's lent GPU machines).
#   usage (GPU machine, repo root): bash bench/gpu_run.sh SECONDS_PER_BENCH [tests] [suite] [bench ...]
#   tests: the kernel-level test directories (300 s at most); suite: the whole suite, scripts/test_gpu.py
#   (what `make test-gpu` runs; 400 s at most); a bench is a name (bench/NAME.py with its usual --gpu
#   arguments) or "NAME ARGS..." in one quoted word: bench/NAME.py --gpu --out ... ARGS, the words of
#   ARGS split as the shell would (quotes kept: JSON arguments pass whole), its log NAME-2.txt, -3, ...
set -u
limit=${1:-120}; shift || true
out=${OUT:-bench/results}
mkdir -p "$out"
if [ -f .gpu/setup.sh ]; then
  source .gpu/setup.sh > "$out/setup.txt" 2>&1 || { cat "$out/setup.txt"; exit 1; }
fi
if ! python3 -c "import pyopencl as cl, sys; sys.exit(not any(d.type & cl.device_type.GPU for p in cl.get_platforms() for d in p.get_devices()))" 2>/dev/null; then
  echo "bench/gpu_run.sh: python3 sees no OpenCL GPU (is pyopencl installed, and the GPU driver registered with the" >&2
  echo "ICD loader? see README, 'Running on a GPU'; a .gpu/setup.sh in the checkout is sourced first when present)" >&2
  exit 2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NETCL_CACHE_DIR=/tmp/netcl-cache PYTHONUNBUFFERED=1
python3 -m netcl.cli devices > "$out/devices.txt" 2>&1
n=0
for what in "$@"; do
  n=$((n + 1))
  if [ "$what" = suite ]; then
    echo "== the whole suite on the GPU (scripts/test_gpu.py)"
    start=$(date +%s)
    timeout 400 python3 scripts/test_gpu.py -q -p no:cacheprovider -rf > "$out/suite_gpu.txt" 2>&1
    echo "rc=$? in $(( $(date +%s) - start )) s"
    grep -E "passed|failed|FAILED|ERROR" "$out/suite_gpu.txt" | tail -15
    continue
  fi
  if [ "$what" != "${what#* }" ]; then  # "NAME ARGS...": the bench with arguments of its own
    name=${what%% *}
    [ -f "bench/$name.py" ] || { echo "== no bench/$name.py"; continue; }
    echo "== bench/$name.py --gpu ${what#* }"
    eval "timeout \"\$limit\" python3 bench/$name.py --gpu --out \"\$out/$name-$n.json\" ${what#* }" \
      > "$out/$name-$n.txt" 2>&1
    echo "rc=$?"; tail -40 "$out/$name-$n.txt"
    continue
  fi
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

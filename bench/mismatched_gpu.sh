#!/usr/bin/env bash
# One job across mismatched devices (issue 29), for the one-GPU machine: the NVIDIA GPU beside the CPU through
# PoCL (PyPI's wheel, pocl-binary-distribution: `pip install` it first, or carry the wheel), from the repo root.
#   bash bench/mismatched_gpu.sh            (output and JSON into $OUT, default bench/results)
# 1. bench/balance.py: the GPU alone, the CPU alone, then both in one job with equal and with balanced shares;
# 2. netcl lm-train (the 25m preset): the GPU alone with the global batch against --nproc 2 --devices GPU,CPU;
set -u
out=${OUT:-bench/results}
mkdir -p "$out"
[ -f .gpu/setup.sh ] && source .gpu/setup.sh > "$out/setup.txt" 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NETCL_CACHE_DIR=/tmp/netcl-cache PYTHONUNBUFFERED=1
python3 -m netcl.cli devices | tee "$out/devices.txt"
read -r gpu cpu < <(python3 - <<'EOF'
from netcl.core.device import manager
hs = [h for h in manager.devices() if not h.is_simulator]
gpu = next((h.spec for h in hs if h.kind == "gpu"), "")
cpu = next((h.spec for h in hs if h.kind == "cpu" and "portable" in h.platform_name.lower()), "")
print(gpu or "none", cpu or "none")
EOF
)
echo "GPU $gpu, CPU (PoCL) $cpu"
if [ "$gpu" = none ] || [ "$cpu" = none ]; then
  echo "need an OpenCL GPU and PoCL's CPU device (pip install pocl-binary-distribution)" >&2
  exit 2
fi

echo "== 1. bench/balance.py: GPU and CPU alone, then one job (equal, balanced)"
timeout 1200 python3 bench/balance.py --devices "$gpu,$cpu" --delays-ms 0,0 --width 2048 --layers 4 \
  --global-batch 1024 --steps 20 --warmup 25 --out "$out/balance_gpu_cpu.json" 2>&1 | tee "$out/balance_gpu_cpu.txt"

echo "== 2. netcl lm-train --preset 25m: the GPU alone with 64 sequences, then GPU + CPU sharing 64"
for run in alone job; do rm -rf "$out/lm_$run"; done
NETCL_DEVICE=$gpu timeout 1200 python3 -m netcl.cli lm-train --preset 25m --eager --steps 40 --eval-every 40 \
  --batch-size 64 --samples 0 --no-progress --out "$out/lm_alone" 2>&1 | tee "$out/lm_alone.txt"
timeout 1800 python3 -m netcl.cli lm-train --preset 25m --eager --steps 40 --eval-every 40 --batch-size 32 \
  --nproc 2 --devices "$gpu,$cpu" --samples 0 --no-progress --out "$out/lm_job" 2>&1 | tee "$out/lm_job.txt"
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
a, j = (json.load(open(f"{out}/lm_{r}/metrics.json")) for r in ("alone", "job"))
print(f"tokens/s: GPU alone {a['tokens_per_second_median']:,.0f}, GPU + CPU {j['tokens_per_second_median']:,.0f} "
      f"({j['tokens_per_second_median'] / a['tokens_per_second_median']:.2f}x), final shares {j['shares']}")
EOF

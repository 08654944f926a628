#!/usr/bin/env bash
# Data parallelism on two GPUs (issue 17), for the nvidia-h200-x2 machine: run from the repo root.
#   bash bench/dist_gpu.sh            (output and JSON into $OUT, default bench/results)
# 1. the all-reduce: netcl's shm backend between the two GPUs (device sums and host sums) beside PyTorch's NCCL
#    all_reduce on the same GPUs and sizes, and host memcpy / device copy bandwidth, in one run;
# 2. DDP scaling on a 134M-parameter MLP stack: 2 GPUs over 2 x one GPU (target >= 0.85 for the GPT model);
# 3. the CNN: `netcl train` on one GPU with the combined batch, then `netcl train --nproc 2` with half of it per
#    GPU: the per-epoch test accuracy and loss curve should match to float tolerance (same samples per step);
# 4. the GPT model, when `netcl lm-train` takes --nproc (it calls netcl.distributed.launch.spawn_ranks/join).
set -u
out=${OUT:-bench/results}
mkdir -p "$out"
[ -f .gpu/setup.sh ] && source .gpu/setup.sh > "$out/setup.txt" 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NETCL_CACHE_DIR=/tmp/netcl-cache PYTHONUNBUFFERED=1
python3 -m netcl.cli devices | tee "$out/devices.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda devices:', torch.cuda.device_count())" || \
  echo "no PyTorch with CUDA here: the NCCL column will say failed"

echo "== 1. all-reduce bus bandwidth, 2 GPUs"
timeout 1200 python3 bench/allreduce.py --gpu --devices 0:0,0:1 --sizes-mb 1,4,16,64,256,512 \
  --out "$out/allreduce_gpu.json" 2>&1 | tee "$out/allreduce_gpu.txt"

echo "== 2. DDP scaling (MLP stack, 2 GPUs over 2 x 1)"
timeout 900 python3 bench/ddp_scaling.py --gpu --devices 0:0,0:1 --out "$out/ddp_scaling_gpu.json" 2>&1 | \
  tee "$out/ddp_scaling_gpu.txt"

echo "== 3. CNN: one GPU with batch 256 (eager, as DDP runs), then 2 GPUs with 128 each"
rm -rf "$out/cnn_1gpu" "$out/cnn_2gpu"
NETCL_DEVICE=0:0 timeout 1200 python3 -m netcl.cli train --eager --batch-size 256 --epochs 3 --seed 0 \
  --out "$out/cnn_1gpu" --no-progress 2>&1 | tee "$out/cnn_1gpu.txt"
timeout 1200 python3 -m netcl.cli train --nproc 2 --batch-size 128 --epochs 3 --seed 0 \
  --out "$out/cnn_2gpu" --no-progress 2>&1 | tee "$out/cnn_2gpu.txt"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
one, two = (json.loads((out / d / "metrics.json").read_text()) for d in ("cnn_1gpu", "cnn_2gpu"))
print("epoch  acc 1 GPU  acc 2 GPUs  images/s 1 GPU  images/s 2 GPUs  efficiency")
for e, (a1, a2, r1, r2) in enumerate(zip(one["test_accuracy"], two["test_accuracy"], one["samples_per_second"],
                                         two["samples_per_second"])):
    print(f"{e + 1:>5}  {a1:>9.4f}  {a2:>10.4f}  {r1:>14,.0f}  {r2:>15,.0f}  {r2 / (2 * r1):>10.2f}")
print("(the 2-GPU run logs rank 0's loss over its half of each batch; accuracy is on the whole test set)")
PY

echo "== 4. GPT model"
if python3 -m netcl.cli lm-train --help 2>/dev/null | grep -q -- "--nproc"; then
  timeout 1200 python3 -m netcl.cli lm-train --nproc 2 --no-progress 2>&1 | tee "$out/lm_2gpu.txt"
else
  echo "netcl lm-train has no --nproc yet: not run (it needs launch.spawn_ranks(args.argv, n) and launch.join(n)"
  echo "at the top of its run(), and DistributedDataParallel around its model, as netcl/train/main.py does)"
fi

#!/usr/bin/env bash
# One job across mismatched devices (issue 29), for the one-GPU machine: the NVIDIA GPU beside the CPU through
# PoCL, from the repo root, in about 5 minutes:
#   bash bench/mismatched_gpu.sh            (logs, JSON and the runs' metrics into $OUT, default
#                                            bench/results/mismatched; the GPT checkpoints stay in /tmp)
# 0. PoCL: PyPI's pocl-binary-distribution 3.0 puts libpocl and pocl.icd into *pyopencl*/.libs, where the
#    ICD loader of PyOpenCL's wheel looks ($PYOPENCL_HOME/.libs). Installed with `pip --target DIR` beside
#    another pyopencl, its pyopencl/.libs is not the imported one, and pip will not merge it into an existing
#    pyopencl (it skips it, or with --upgrade replaces the whole package). So this script finds libpocl*.so (in
#    the PYTHONPATH directories, /tmp/pocl-site, or installs $POCL_WHEEL / a pocl_binary_distribution wheel
#    found in .gpu/pocl, dist/, .gpu/wheels or shared/gpu/wheels into /tmp/pocl-site) and registers it in an
#    OCL_ICD_VENDORS directory beside the ones already there (NVIDIA's from .gpu/setup.sh, or
#    /etc/OpenCL/vendors' copied). Its rpath finds hwloc and the kernel library in the same directory tree.
# 1. bench/balance.py: an MLP 4 x 1024, global batch 1024: the GPU alone, the CPU alone, then both in one job
#    with equal shares, balanced with one sample a rank at least, and balanced with the CPU left out when it
#    is worth less than it costs;
# 2. netcl lm-train --preset 25m on the repo's own sources (--corpus netcl: a tokenizer in seconds): the GPU
#    alone on global batches of 16 against --nproc 2 --devices GPU,CPU (8 each at first; the CPU is measured
#    and left out), tokens/s medians of 10-step windows;
# then one line: VERDICT ... (the GPU+CPU job against the GPU alone).
# Overrides, for a dry run on a machine without a GPU: FAST / SLOW (device specs for the GPU and the CPU rank),
# BALANCE_ARGS, LM_ARGS (replace the sizes), PYTHON, FORCE_POCL=1 (register the wheel's PoCL even when a PoCL
# platform is already there).
set -u
out=${OUT:-bench/results/mismatched}
mkdir -p "$out"
t_start=$(date +%s)
[ -f .gpu/setup.sh ] && source .gpu/setup.sh > "$out/setup.txt" 2>&1
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NETCL_CACHE_DIR=${NETCL_CACHE_DIR:-/tmp/netcl-cache}
export PYTHONUNBUFFERED=1 NETCL_DIST_TIMEOUT=${NETCL_DIST_TIMEOUT:-600}  # the CPU's first steps build kernels

pocl_platforms() {
  $py -c 'import pyopencl as cl; print(sum("portable" in p.name.lower() for p in cl.get_platforms()))' \
    2>/dev/null || echo 0
}

register_pocl() {  # make PyPI's PoCL visible to the ICD loader whatever pyopencl is imported
  local lib="" dir whl entry
  for dir in ${PYTHONPATH//:/ } /tmp/pocl-site; do
    [ -d "$dir" ] || continue
    lib=$(find "$dir" -maxdepth 4 -path '*pyopencl/.libs/libpocl*.so*' 2>/dev/null | head -1)
    [ -n "$lib" ] && break
  done
  if [ -z "$lib" ]; then
    whl=${POCL_WHEEL:-$(ls .gpu/pocl/pocl_binary_distribution-*.whl dist/pocl_binary_distribution-*.whl \
      .gpu/wheels/pocl_binary_distribution-*.whl \
      shared/gpu/wheels/pocl_binary_distribution-*.whl ../shared/gpu/wheels/pocl_binary_distribution-*.whl \
      2>/dev/null | head -1)}
    if [ -z "$whl" ]; then
      echo "no libpocl*.so under PYTHONPATH or /tmp/pocl-site, and no pocl_binary_distribution wheel (set POCL_WHEEL)"
      return 1
    fi
    echo "installing $whl into /tmp/pocl-site"
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pocl-site "$whl" \
      || return 1
    lib=$(find /tmp/pocl-site -maxdepth 4 -path '*pyopencl/.libs/libpocl*.so*' | head -1)
    [ -n "$lib" ] || { echo "the wheel $whl holds no pyopencl/.libs/libpocl*.so"; return 1; }
  fi
  lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
  if [ -n "${OCL_ICD_VENDORS:-}" ] && [ -d "$OCL_ICD_VENDORS" ]; then
    dir=$OCL_ICD_VENDORS
  else
    dir=/tmp/netcl-icd
    mkdir -p "$dir"
    if [ -n "${OCL_ICD_VENDORS:-}" ]; then  # a library file: keep it as the first entry
      echo "$OCL_ICD_VENDORS" > "$dir/0-first.icd"
    else
      for entry in /etc/OpenCL/vendors/*.icd; do [ -f "$entry" ] && cp "$entry" "$dir/"; done
    fi
  fi
  echo "$lib" > "$dir/pocl-wheel.icd"
  export OCL_ICD_VENDORS=$dir
  echo "registered $lib in $dir"
}

if [ "$(pocl_platforms)" = 0 ] || [ "${FORCE_POCL:-0}" = 1 ]; then
  register_pocl > "$out/pocl.txt" 2>&1  # not through a pipe: its export must reach this shell
  cat "$out/pocl.txt"
fi
$py -m netcl.cli devices > "$out/devices.txt" 2>&1
cat "$out/devices.txt"
read -r fast slow < <($py - <<'EOF'
from netcl.core.device import manager
hs = [h for h in manager.devices() if not h.is_simulator]
gpu = next((h.spec for h in hs if h.kind == "gpu"), "")
cpu = next((h.spec for h in hs if h.kind == "cpu" and "portable" in h.platform_name.lower()), "")
print(gpu or "none", cpu or "none")
EOF
)
fast=${FAST:-$fast} slow=${SLOW:-$slow}
echo "fast (GPU) $fast, slow (CPU through PoCL) $slow" | tee "$out/pair.txt"
if [ "$fast" = none ] || [ "$slow" = none ]; then
  echo "VERDICT: not run: need an OpenCL GPU and PoCL's CPU device (see $out/pocl.txt, $out/devices.txt)"
  exit 2
fi

echo "== 1. bench/balance.py: GPU and CPU alone, then one job (equal, floor of one sample, CPU left out)"
# shellcheck disable=SC2086
timeout 170 $py bench/balance.py --devices "$fast,$slow" --delays-ms 0,0 --runs off,floor,on --timeout 150 \
  ${BALANCE_ARGS:---width 1024 --layers 4 --global-batch 1024 --steps 10 --warmup 12 --alone-steps 5 --alone-warmup 3} \
  --out "$out/balance_gpu_cpu.json" 2>&1 | tee "$out/balance_gpu_cpu.txt"

echo "== 2. netcl lm-train --preset 25m: the GPU alone with 16 sequences a step, then GPU + CPU sharing 16"
lm=${LM_ARGS:---preset 25m --corpus netcl --steps 40 --eval-every 40 --eval-windows 16}
runs=/tmp/netcl-mismatch-runs  # checkpoints of the 25m GPT are ~0.8 GB a run: not under $OUT, only the metrics
rm -rf "$runs" && mkdir -p "$runs"
# shellcheck disable=SC2086
NETCL_DEVICE=$fast timeout 130 $py -m netcl.cli lm-train $lm --eager --batch-size 16 --samples 0 \
  --no-progress --cache-dir /tmp/netcl-corpus --out "$runs/lm_alone" 2>&1 | tee "$out/lm_alone.txt"
# shellcheck disable=SC2086
timeout 240 $py -m netcl.cli lm-train $lm --eager --batch-size 8 --nproc 2 --devices "$fast,$slow" --samples 0 \
  --no-progress --cache-dir /tmp/netcl-corpus --out "$runs/lm_job" 2>&1 | tee "$out/lm_job.txt"
for r in alone job; do cp "$runs/lm_$r/metrics.json" "$out/lm_${r}_metrics.json" 2>/dev/null; done

$py - "$out" "$(( $(date +%s) - t_start ))" <<'EOF' | tee "$out/verdict.txt"
import json, sys
from pathlib import Path
out, seconds = Path(sys.argv[1]), sys.argv[2]
parts = []
try:
    b = json.loads((out / "balance_gpu_cpu.json").read_text())
    on = b["job, balanced"]
    parts.append(f"MLP: job {on['samples_per_s']:,.0f} samples/s = {on['to_fastest']:.2f}x the GPU alone "
                 f"(floor of one sample {b['job, balanced, floor 1']['to_fastest']:.2f}x, equal shares "
                 f"{b['job, equal shares']['to_fastest']:.2f}x), shares {on['shares']}")
except (OSError, KeyError, ValueError) as exc:
    parts.append(f"MLP: no result ({exc!r})")
ok = False
try:
    a, j = (json.loads((out / f"lm_{r}_metrics.json").read_text()) for r in ("alone", "job"))
    ratio = j["tokens_per_second_median"] / a["tokens_per_second_median"]
    left = "is worth less than it costs" in (out / "lm_job.txt").read_text()
    ok = ratio >= 0.95
    parts.append(f"GPT: GPU alone {a['tokens_per_second_median']:,.0f} tokens/s, GPU + CPU job "
                 f"{j['tokens_per_second_median']:,.0f} ({ratio:.2f}x), final shares {j['shares']}"
                 f"{', the CPU left out' if left else ''}")
except (OSError, KeyError, ValueError) as exc:
    parts.append(f"GPT: no result ({exc!r})")
print(f"VERDICT: {'PASS' if ok else 'FAIL'} (the GPU+CPU job is {'not ' if ok else ''}slower than the GPU "
      f"alone, 0.95x allowed for noise): " + "; ".join(parts) + f"; {seconds} s in all")
EOF

"""Streaming (flash) attention: netcl.ops.flash_attention forward and forward+backward, and a decode step
(one query row against a long KV cache), beside PyTorch's scaled_dot_product_attention on the same device
in one run. One table + JSON (bench/results/attention.json).

    python bench/attention.py                 # CPU (PoCL): B=1, H=8, S=1024, D=64 beside torch CPU
    python bench/attention.py --gpu           # GPU: B=8, H=16, S=2048, D=64 float32 beside torch CUDA
                                              #   (TF32 off: cuda.matmul.allow_tf32 = cudnn.allow_tf32 =
                                              False)
    python bench/attention.py --memory        # also: S=8192, H=8, D=64 forward+backward, the BufferPool peak
    python bench/attention.py --b 2 --h 4 --s 512 --d 128 --causal-only --repeat 5
    python bench/attention.py --gpu --sweep   # also: the GPU kernels under other configurations (SWEEP:
                                              #   grids, atomics, native_exp, fused or two-pass backward,
                                              #   the deterministic dq copies or the atomic pass)
    NETCL_DETERMINISTIC=0 python bench/attention.py --gpu   # the table with dq by float atomics

FLOPs: forward 4 * B * H * Sq * Sk * D (q k^T and p v), backward 2.5x that (q k^T recomputed, dp = dO v^T,
dv, dk, dq: FlashAttention-2's single pass; the two-pass backward computes q k^T and dO v^T twice, 3.5x),
so forward+backward = 3.5x; causal rows count half (the masked half is skipped by the
kernels and by the peers' flash kernels). Limits: the H200's FP32 peak is ~67 TFLOP/s (no tensor cores
without TF32); the decode step is memory-bound (bytes = k and v of the cache read once), reported in GB/s
beside the device's buffer->buffer copy bandwidth measured in the same run. Ratios are netcl's
TFLOP/s (or GB/s) over PyTorch's: above 1 = netcl faster. Errors: max |netcl - torch| / max |torch| of
out and of dq, dk, dv.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import netcl  # noqa: E402
from netcl import profiling  # noqa: E402
from netcl.core import dtypes  # noqa: E402
from netcl.core.backend import enqueue_copy  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import attention as attn  # noqa: E402
from netcl.ops.gemm import variants as gemm_variants  # noqa: E402
from netcl.tune.tuner import time_callable  # noqa: E402

FP32_PEAK_GPU = 67e12   # H200 FP32 (CUDA cores)
HALF_MMA_GPU = 780e12   # H200 bfloat16 on the matrix units, as cuBLAS reaches it (bench/NOTES.md)


def copy_bandwidth(q, nbytes: int, repeats: int) -> float:
    src = Tensor.empty(q, (nbytes // 4,), np.float32)
    dst = Tensor.empty(q, (nbytes // 4,), np.float32)
    t = time_callable(
        lambda: enqueue_copy(q, dst.buffer, src.buffer, byte_count=nbytes), q.finish, repeats, 3
    )
    return 2 * nbytes / t


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) + 1e-30))


class Case:
    """One problem: (B, H, Sq, Sk, D), causal or not, forward or forward+backward, optionally a kv_len."""

    def __init__(self, name: str, B: int, H: int, SQ: int, SK: int, D: int, causal: bool, backward: bool,
                 decode: bool = False):
        self.name, self.B, self.H, self.SQ, self.SK, self.D = name, B, H, SQ, SK, D
        self.causal, self.backward, self.decode = causal, backward, decode

    def flops(self) -> float:
        f = 4.0 * self.B * self.H * self.SQ * self.SK * self.D
        if self.causal and self.SQ == self.SK:
            f /= 2
        return f * (3.5 if self.backward else 1.0)

    def bytes(self) -> float:
        """Bytes a decode step must read at least: k and v of the cache, q, and out written."""
        return 4.0 * self.B * self.H * (2 * self.SK * self.D + 2 * self.SQ * self.D)


def run_torch(case: Case, arrays: dict, gpu: bool, repeat: int) -> dict:
    import torch  # noqa: PLC0415 (a peer, optional: the benchmark reports it missing)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tdev = "cuda" if gpu else "cpu"
    if gpu and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    F = torch.nn.functional
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(arrays["q"].dtype.name, torch.float32)
    tq, tk, tv, tg = (torch.from_numpy(arrays[n].astype(np.float32)).to(tdev, tdt)
                      for n in ("q", "k", "v", "g"))
    res: dict = {"impl": f"torch {torch.__version__} sdpa", "device": tdev}
    # torch's is_causal is top-left aligned: one query row against a cache must attend everything
    causal = case.causal and not case.decode
    if case.backward:
        for t in (tq, tk, tv):
            t.requires_grad_(True)

        def fn():
            out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            return torch.autograd.grad(out, (tq, tk, tv), tg)

        s = time_callable(fn, sync, repeat, 2)
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        grads = torch.autograd.grad(out, (tq, tk, tv), tg)
        res["results"] = [out.detach().float().cpu().numpy()] + [g.float().cpu().numpy() for g in grads]
    else:
        with torch.no_grad():
            fn = lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
            s = time_callable(fn, sync, repeat, 2)
            res["results"] = [fn().float().cpu().numpy()]
    res["seconds"] = s
    if not gpu:
        res["note"] = f"{torch.get_num_threads()} threads"
    return res


def kernel_times(fn, q) -> list[tuple[str, float]]:
    """(kernel, device ms) of each launch one more call of `fn` makes, from the profiler's events."""
    q.finish()
    with profiling.profile() as prof:
        fn()
        q.finish()
    return [(s["name"], (s["end"] - s["start"]) / 1e6) for s in prof.device_spans()
            if s["kind"] == "kernel" and s["start"] is not None]


def run_netcl(case: Case, arrays: dict, dev, repeat: int, kernels: bool = False) -> dict:
    q = dev.queue
    nq, nk, nv, ng = (Tensor.from_host(q, arrays[n]) for n in ("q", "k", "v", "g"))
    opts: dict = {"causal": case.causal}
    if case.decode:   # a KV cache: the length lives on the device (what a recorded decode step reads)
        opts["kv_len"] = Tensor.from_host(q, np.array([case.SK], np.int32))
    if case.backward:
        def fn():
            out, lse = attn.flash_attention_forward(nq, nk, nv, **opts)
            return (out,) + attn.flash_attention_backward(nq, nk, nv, out, lse, ng, **opts)
    else:
        def fn():
            return (attn.flash_attention_forward(nq, nk, nv, **opts)[0],)
    s = time_callable(fn, q.finish, repeat, 2)
    variant = attn.variant_override or ("cpu" if dev.capabilities.kind == "cpu" else "gpu")
    return {"impl": f"netcl ({variant} kernels)", "device": dev.device_name, "seconds": s,
            "results": [t.to_host() for t in fn()], "kernels": kernel_times(fn, q) if kernels else None}


def memory_case(dev, rng) -> dict:
    """S=8192, H=8, D=64, B=1 causal forward+backward: the BufferPool's peak over what the inputs hold."""
    B, H, S, D = 1, 8, 8192, 64
    q = dev.queue
    ts = [Tensor.from_host(q, rng.standard_normal((B, H, S, D)).astype(np.float32)) for _ in range(4)]
    q.finish()
    pool = dev.pool
    pool.reset_peak()
    before = pool.stats()["in_use"]
    out, lse = attn.flash_attention_forward(*ts[:3], causal=True)
    grads = attn.flash_attention_backward(*ts[:3], out, lse, ts[3], causal=True)
    q.finish()
    peak = pool.stats()["peak"] - before
    del out, lse, grads
    tensor = B * H * S * D * 4
    return {"shape": [B, H, S, D], "peak_bytes": peak, "tensor_bytes": tensor,
            "one_head_SxS_bytes": S * S * 4, "peak_over_tensor": peak / tensor}


# --sweep: configurations of the attention_gpu.cl kernels, each timed on one problem. A row: the kernel
# ("forward"; "backward": flash_attention_backward with all three gradients, i.e. delta + the fused pass, or
# both passes with backward="two_pass"), the work-item grid (TC, TR, rows per item, columns per item:
# attn.GPU_GRIDS; the backward's grid is the fused pass's, or the dk/dv pass's), and knobs: atomic
# (attn.GPU_DQ_ATOMIC), native_exp (attn.GPU_NATIVE_EXP), backward (attn.GPU_BACKWARD), prefetch
# (attn.GPU_PREFETCH; () = none), row_shfl (attn.GPU_ROW_SHFL), deterministic (netcl.set_deterministic: False
# = dq by float atomics), split_resident (attn.GPU_DQ_SPLIT_RESIDENT: the work-groups per compute unit that
# the deterministic pass's choice of dq copies assumes), split_add (attn.GPU_DQ_SPLIT_ADD), tf32
# (attn.GPU_TF32X3: False = attention_gpu.cl's float32 kernels where the TF32 units' 3xTF32 passes would run),
# tf32_tiles (attn.TF32_TILES; the grid is then unused). The first row of
# each kernel is the default and the reference of the others' err.
SWEEP = [   # the most telling first (a run cut short by a time limit still prints them)
    ("forward", (16, 8, 8, 2), {}),
    ("backward", (16, 8, 4, 2), {}),
    ("forward", (16, 8, 8, 2), {"tf32": False}),
    ("backward", (16, 8, 4, 2), {"tf32": False}),
    ("forward", (16, 8, 8, 2), {"tf32_tiles": {"WARPS": 2, "BN": 32, "BQ": 32}}),
    ("backward", (16, 8, 4, 2), {"tf32_tiles": {"WARPS": 2, "BN": 32, "BQ": 32}}),
    ("forward", (16, 8, 8, 2), {"tf32_tiles": {"WARPS": 2, "BN": 16, "BQ": 16}}),
    ("backward", (16, 8, 4, 2), {"tf32_tiles": {"WARPS": 2, "BN": 16, "BQ": 16}}),
    ("backward", (16, 8, 4, 2), {"tf32_tiles": {"WARPS": 4, "BN": 32, "BQ": 32, "dkdv": {"WARPS": 2}}}),
    ("backward", (16, 8, 4, 2), {"deterministic": False}),
    ("backward", (16, 8, 4, 2), {"split_resident": 2}),
    ("backward", (16, 8, 4, 2), {"split_resident": 8}),
    ("backward", (16, 8, 4, 2), {"split_add": "plain"}),
    ("backward", (8, 8, 4, 4), {}),
    ("forward", (16, 8, 8, 2), {"row_shfl": False}),
    ("forward", (16, 16, 4, 2), {}),
    ("backward", (16, 4, 8, 2), {}),
    ("forward", (16, 8, 8, 2), {"prefetch": ("forward",)}),
    ("backward", (16, 8, 4, 2), {"prefetch": ("fused",)}),
    ("backward", (16, 8, 4, 2), {"backward": "two_pass"}),
]
_KNOBS = {"atomic": "GPU_DQ_ATOMIC", "native_exp": "GPU_NATIVE_EXP", "backward": "GPU_BACKWARD",
         "prefetch": "GPU_PREFETCH", "row_shfl": "GPU_ROW_SHFL", "split_resident": "GPU_DQ_SPLIT_RESIDENT",
         "split_add": "GPU_DQ_SPLIT_ADD", "tf32": "GPU_TF32X3", "tf32_tiles": "TF32_TILES"}


def check_switches(switch_sets: object) -> None:
    """ValueError unless `switch_sets` is a list of objects, each naming switches of netcl.ops.attention (an
    object for a dict switch: merged into its default); bench/ptx_offline.py checks its --switches here."""
    if not isinstance(switch_sets, list) or not all(isinstance(x, dict) for x in switch_sets):
        raise ValueError("not a list of objects")
    for switches in switch_sets:
        for name, value in switches.items():
            if not name.isupper() or not hasattr(attn, name):
                raise ValueError(f"netcl.ops.attention has no switch {name!r}")
            if isinstance(getattr(attn, name), dict) and not isinstance(value, dict):
                raise ValueError(f"{name}: an object (merged into the default's), got {value!r}")


def switched(default: object, value: object) -> object:
    """A switch's setting as netcl.ops.attention takes it: an object merged into the switch's default dict, a
    list as a tuple, anything else as it is."""
    if isinstance(default, dict):
        return {**default, **value}
    return tuple(value) if isinstance(value, list) else value


def sweep(dev, B: int, H: int, S: int, D: int, repeat: int, causal: bool, only: str = "") -> list[dict]:
    """Time each configuration of SWEEP (the rows whose kernel is in `only`, a comma list; all when empty)
    on one problem: the forward alone, or the whole backward (delta, then the fused pass or both passes)."""
    q = dev.queue
    rng = np.random.default_rng(1)
    nq, nk, nv, ng = (
        Tensor.from_host(q, rng.standard_normal((B, H, S, D)).astype(np.float32)) for _ in range(4)
    )
    opts = {"causal": causal}
    out, lse = attn.flash_attention_forward(nq, nk, nv, **opts)
    calls = {
        "forward": lambda: (attn.flash_attention_forward(nq, nk, nv, **opts)[0],),
        "backward": lambda: attn.flash_attention_backward(nq, nk, nv, out, lse, ng, **opts),
    }
    flops = {"forward": 4.0, "backward": 10.0}   # per B H S S D: 2 products, 5 products (FlashAttention-2)
    saved = {name: getattr(attn, name) for name in ("GPU_GRIDS", *_KNOBS.values())}
    deterministic = netcl.get_deterministic()
    old_variant = attn.variant_override
    attn.variant_override = "gpu"
    rows: list[dict] = []
    refs: dict = {}
    wanted = set(filter(None, only.split(",")))
    print(f"sweep of attention_gpu.cl configurations, B={B} H={H} S={S} D={D} causal={causal} (TFLOP/s at "
          "the FlashAttention-2 FLOP count; err vs the kernel's first row):")
    try:
        for kernel, grid, knobs in SWEEP:
            if wanted and kernel not in wanted:
                continue
            for name, value in saved.items():
                setattr(attn, name, value)
            netcl.set_deterministic(knobs.get("deterministic", deterministic))
            grid_key = "forward" if kernel == "forward" else "fused"
            attn.GPU_GRIDS = dict(saved["GPU_GRIDS"], **{grid_key: [grid]})
            if knobs.get("backward") == "two_pass":
                attn.GPU_GRIDS.update(dq=[saved["GPU_GRIDS"]["dq"][0]], dkdv=[grid])
            for knob, value in knobs.items():
                if knob in _KNOBS:
                    setattr(attn, _KNOBS[knob], value)
            row = {"kernel": kernel, "grid": list(grid), **knobs}
            try:
                row["tiles"] = attn.gpu_tiles(dev, grid_key, D, np.float32)
                s = time_callable(calls[kernel], q.finish, repeat, 1)
                got = [t.to_host() for t in calls[kernel]()]
                ref = refs.setdefault(kernel, got)
                row.update(
                    ms=s * 1e3,
                    tflops=flops[kernel] * B * H * S * S * D / (2 if causal else 1) / s / 1e12,
                    err=max(rel_err(g, r) for g, r in zip(got, ref, strict=True)),
                )
            except Exception as exc:  # a configuration that does not build or fit is reported, not fatal
                row["note"] = f"{type(exc).__name__}: {exc}"[:160]
            rows.append(row)
            tiles = row.get("tiles", {})
            print(f"  {kernel:<9}grid {grid} {knobs or ''} BM={tiles.get('BM')} BN={tiles.get('BN')}  "
                  f"{row.get('ms', float('nan')):8.3f} ms {row.get('tflops', float('nan')):6.2f} TFLOP/s "
                  f"err {row.get('err', float('nan')):.1e} {row.get('note', '')}", flush=True)
    finally:
        for name, value in saved.items():
            setattr(attn, name, value)
        netcl.set_deterministic(deterministic)
        attn.variant_override = old_variant
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--gpu", action="store_true", help="run on the GPU (OpenCL) with the GPU sizes; torch on CUDA"
    )
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--b", type=int)
    ap.add_argument("--h", type=int)
    ap.add_argument("--s", type=int)
    ap.add_argument("--d", type=int)
    ap.add_argument("--decode-len", type=int, help="keys in the decode case's cache")
    ap.add_argument("--causal-only", action="store_true", help="skip the non-causal rows")
    ap.add_argument("--kernels", action="store_true",
                    help="print each netcl kernel's device time in one more call of every case")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode case")
    ap.add_argument(
        "--memory", action="store_true", help="also measure the S=8192 forward+backward pool peak"
    )
    ap.add_argument(
        "--sweep", action="store_true", help="also time the GPU kernels under other configurations (SWEEP)"
    )
    ap.add_argument("--sweep-only", default="", help="with --sweep: comma list of forward,backward")
    ap.add_argument("--no-table", action="store_true", help="skip the table (e.g. only --sweep)")
    ap.add_argument("--variant", choices=["cpu", "gpu"], help="force netcl's kernel variant")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                    help="the inputs' dtype (torch sdpa in the same; float16/bfloat16 take netcl's "
                    "matrix-unit forward where the device has matrix units)")
    ap.add_argument("--skip", default="", help="comma list of peers to skip: torch")
    ap.add_argument("--mma-tiles", default="", help="also time netcl under each of these attention_mma.cl "
                    "tiles (a JSON list of dicts over attn.MMA_TILES), float16/bfloat16 only")
    ap.add_argument("--no-tf32", action="store_true",
                    help="float32 on attention_gpu.cl's kernels, not the TF32 units' 3xTF32 passes")
    ap.add_argument("--nv-verbose", action="store_true",
                    help="NVIDIA: build attention_tf32.cl with -cl-nv-verbose and print registers/spills")
    ap.add_argument("--wgmma-128", default="",
                    help="half at head dim 128: these passes on wgmma (attn.WGMMA_128, default all three; "
                    "Hopper): a comma list of forward, dq, dkdv, or none (all on mma.sync)")
    ap.add_argument("--switches", default="",
                    help="also time netcl under each of these settings of netcl.ops.attention's switches, a "
                    'JSON list of objects, e.g. \'[{"TILES_128": {"dkdv": 16}}, {"WGMMA_128": []}]\' '
                    "(an object's value, as MMA_TILES's, merged into the switch's default)")
    ap.add_argument("--out", default="bench/results/attention.json")
    args = ap.parse_args()
    try:
        switch_sets = json.loads(args.switches) if args.switches else []
        if args.mma_tiles and isinstance(switch_sets, list):
            switch_sets += [{"MMA_TILES": tiles} for tiles in json.loads(args.mma_tiles)]
        check_switches(switch_sets)
    except ValueError as exc:
        ap.error(f"--switches / --mma-tiles: {exc}")
    if args.no_tf32:
        attn.GPU_TF32X3 = False
    if args.wgmma_128:
        passes = () if args.wgmma_128 == "none" else tuple(args.wgmma_128.split(","))
        if not set(passes) <= {"forward", "dq", "dkdv"}:
            ap.error(f"--wgmma-128: a comma list of forward, dq, dkdv, got {args.wgmma_128!r}")
        attn.WGMMA_128 = passes
    if args.nv_verbose:
        gemm_variants.NV_VERBOSE = True

    B, H, S, D = (8, 16, 2048, 64) if args.gpu else (1, 8, 1024, 64)
    B, H, S, D = args.b or B, args.h or H, args.s or S, args.d or D
    decode_len = args.decode_len or (8192 if args.gpu else 4096)
    repeat = args.repeat or (10 if args.gpu else 3)
    skip = set(filter(None, args.skip.split(",")))
    if args.variant:
        attn.variant_override = args.variant
    dev = manager.get(args.device or ("gpu" if args.gpu else "auto"))
    rng = np.random.default_rng(0)
    dtype = np.dtype(dtypes.bfloat16 if args.dtype == "bfloat16" else args.dtype)

    cases = []
    for causal in ([True] if args.causal_only else [False, True]):
        tag = "causal" if causal else "full"
        cases.append(Case(f"forward {tag}", B, H, S, S, D, causal, False))
        cases.append(Case(f"fwd+bwd {tag}", B, H, S, S, D, causal, True))
    if not args.no_decode:
        cases.append(Case("decode fwd", B, H, 1, decode_len, D, True, False, decode=True))

    if args.no_table:
        cases = []
    copy_bw = copy_bandwidth(dev.queue, 256 << 20 if args.gpu else 64 << 20, 5)
    print(f"netcl device: {dev.device_name}; copy bandwidth {copy_bw / 1e9:.1f} GB/s; {args.dtype}; "
          f"repeats {repeat} (median after warm-up)")
    gpu_variant = (attn.variant_override or ("cpu" if dev.capabilities.kind == "cpu" else "gpu")) == "gpu"
    if gpu_variant and args.dtype != "float32" and attn.matrix_units(dev):
        wg = attn.WGMMA_PASSES if attn.WGMMA_PASSES is not None else (
            ("forward", "dq", "dkdv") if attn.has_wgmma(dev) else ())
        at_128 = f"; {', '.join(attn.WGMMA_128)} at 128 too" if attn.WGMMA_128 else ""
        print(f"matrix-unit kernels (attention_mma.cl): tiles {attn.MMA_TILES}; the passes on wgmma: "
              f"{', '.join(wg) or 'none'} (head dim 64{at_128})")
    elif gpu_variant and args.dtype == "float32" and D % 8 == 0 and D <= attn.TF32_MAX_HEAD_DIM and (
            attn.GPU_TF32X3 if attn.GPU_TF32X3 is not None else bool(attn.matrix_units(dev))):
        print(f"float32 on the TF32 units (attention_tf32.cl, 3xTF32): tiles {attn.TF32_TILES}; forward, dq "
              f"and dk/dv passes, no atomics")
    elif gpu_variant:
        native = attn.GPU_NATIVE_EXP if attn.GPU_NATIVE_EXP is not None else attn._nvidia(dev)
        dq_adds = (f"dq copies per work-group ({attn.GPU_DQ_SPLIT_RESIDENT} resident per CU), add "
                   f"{attn.dq_split_add(dev)}" if netcl.get_deterministic() else
                   f"float atomic add {attn.dq_atomic(dev)}")
        print(f"GPU kernels: backward {attn.GPU_BACKWARD} (deterministic {netcl.get_deterministic()}: "
              f"{dq_adds}), native_exp {native}, row_shfl {attn._row_shfl(dev)}, "
              f"prefetch {attn.GPU_PREFETCH}")
    print(f"{'case':<16}{'shape (B,H,Sq,Sk,D)':<24}{'impl':<26}{'ms':>9}{'GFLOP/s':>9}{'GB/s':>8}"
          f"{'x torch':>8}{'err':>9}")
    rows = []
    for case in cases:
        arrays = {
            "q": rng.standard_normal((case.B, case.H, case.SQ, case.D)).astype(dtype),
            "k": rng.standard_normal((case.B, case.H, case.SK, case.D)).astype(dtype),
            "v": rng.standard_normal((case.B, case.H, case.SK, case.D)).astype(dtype),
            "g": rng.standard_normal((case.B, case.H, case.SQ, case.D)).astype(dtype),
        }
        results = []
        if "torch" not in skip:
            try:
                results.append(run_torch(case, arrays, args.gpu, repeat))
            except Exception as exc:  # a missing peer is reported, not fatal
                results.append({"impl": "torch sdpa", "seconds": None, "note": f"unavailable: {exc}"[:160]})
        results.append(run_netcl(case, arrays, dev, repeat, args.kernels))
        ref = results[0].get("results") if results[0]["seconds"] else None
        torch_s = results[0]["seconds"] if len(results) > 1 else None
        for r in results:
            s = r["seconds"]
            row = {
                "case": case.name,
                "B": case.B,
                "H": case.H,
                "Sq": case.SQ,
                "Sk": case.SK,
                "D": case.D,
                "causal": case.causal,
                "impl": r["impl"],
                "device": r.get("device"),
                "note": r.get("note", ""),
            }
            if s:
                row.update(ms=s * 1e3, tflops=case.flops() / s / 1e12)
                if case.decode:
                    row.update(gbps=case.bytes() / s / 1e9, fraction_of_copy=case.bytes() / s / copy_bw)
                if torch_s and r is results[-1]:
                    row["x_torch"] = torch_s / s
                if ref is not None and r is results[-1]:
                    row["max_rel_err"] = max(rel_err(g, w) for g, w in zip(r["results"], ref, strict=True))
            rows.append(row)
            shape = f"{case.B},{case.H},{case.SQ},{case.SK},{case.D}"
            nan = float("nan")
            print(
                f"{case.name:<16}{shape:<24}{row['impl'][:25]:<26}{row.get('ms', nan):9.3f}"
                f"{row.get('tflops', nan) * 1e3:9.0f}{row.get('gbps', nan):8.0f}"
                f"{row.get('x_torch', nan):8.2f}"
                f"{row.get('max_rel_err', nan):9.1e}  {row['note']}"
            )
            if r.get("kernels"):
                row["kernels"] = r["kernels"]
                for name, ms in r["kernels"]:
                    print(f"{'':16}  kernel {name:<40}{ms:9.3f} ms")
    memory = None
    if args.memory:
        memory = memory_case(dev, rng)
        print(f"memory: S=8192 H=8 D=64 causal fwd+bwd: pool peak {memory['peak_bytes'] / 2**20:.1f} MiB = "
              f"{memory['peak_over_tensor']:.2f} x one (B,H,S,D) tensor; one head's S x S would be "
              f"{memory['one_head_SxS_bytes'] / 2**20:.0f} MiB")
    sweep_rows = sweep(dev, B, H, S, D, repeat, False, args.sweep_only) if args.sweep else None
    if switch_sets:
        saved = {name: getattr(attn, name) for x in switch_sets for name in x}
        for case in cases:
            arrays = {n: rng.standard_normal((case.B, case.H, case.SQ if n in "qg" else case.SK,
                                              case.D)).astype(dtype) for n in "qkvg"}
            ref = [np.asarray(a, np.float64) for a in run_netcl(case, arrays, dev, 1)["results"]]
            for switches in switch_sets:
                for name, value in switches.items():
                    setattr(attn, name, switched(saved[name], value))
                try:
                    r = run_netcl(case, arrays, dev, repeat, args.kernels)
                except Exception as exc:  # a setting the device cannot build is reported, not fatal
                    print(f"switches {json.dumps(switches):32} {case.name:16} failed: {exc}"[:300],
                          flush=True)
                    continue
                finally:
                    for name, value in saved.items():
                        setattr(attn, name, value)
                sec, err = r["seconds"], max(rel_err(g, w) for g, w in zip(r["results"], ref, strict=True))
                rows.append({"case": case.name, "switches": switches, "seconds": sec,
                             "rel_err_to_default": err, "kernels": r["kernels"]})
                print(f"switches {json.dumps(switches):32} {case.name:16} {sec * 1e3:9.3f} ms "
                      f"{case.flops() / sec / 1e9:9.0f} GFLOP/s  err to the default {err:.1e}", flush=True)
                for name, ms in r["kernels"] or ():
                    print(f"{'':16}  kernel {name:<40}{ms:9.3f} ms")
    if args.gpu:
        if args.dtype == "float32":
            print(f"limit: FP32 peak ~{FP32_PEAK_GPU / 1e12:.0f} TFLOP/s; target (issue 26) fwd+bwd full "
                  f">= 0.75x torch sdpa float32")
        else:
            print(f"limit: the matrix units ~{HALF_MMA_GPU / 1e12:.0f} TFLOP/s (cuBLAS bfloat16, measured); "
                  f"target (issue 26) fwd+bwd >= 0.6x torch sdpa {args.dtype}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "device": dev.device_name,
                "host": platform.node(),
                "gpu": args.gpu,
                "deterministic": netcl.get_deterministic(),
                "copy_bandwidth_gbps": copy_bw / 1e9,
                "rows": rows,
                "memory": memory,
                "sweep": sweep_rows,
                "fp32_peak_tflops": FP32_PEAK_GPU / 1e12 if args.gpu else None,
                "target": "GPU fwd+bwd B=8 H=16 S=2048 D=64 float32 >= 0.7x torch sdpa (TF32 off)",
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""k-means: netcl's fused assignment (no n x k matrix) beside scikit-learn and faiss-cpu on the host, and
PyTorch (cdist + argmin, written here) on the same device, in one run. Table + JSON.

Rows: one Lloyd iteration (assignment + update, from the same centers), a full fit of a fixed number
of iterations from the same initial centers (tol=0), and k-means++ seeding (netcl and scikit-learn).
Device memory: netcl's BufferPool peak beside torch.cuda.max_memory_allocated (both count the data).

    python bench/kmeans.py                 # CPU: N=200,000, d=64, K=256 (about 1-2 min on 2 cores)
    python bench/kmeans.py --gpu           # GPU: N=1,000,000, d=64, K=1024; PyTorch on CUDA (TF32 off)
    python bench/kmeans.py --n 50000 --k 128 --iters 5 --repeat 2 --skip faiss,torch
    python bench/kmeans.py --gpu --dtype float16   # half rows: netcl's matrix-unit assignment beside
                                                   # PyTorch's x @ c^T in half + argmin (and cdist)

--dtype float16 / bfloat16 stores the rows in that format (centers stay float32 in netcl and PyTorch);
scikit-learn and faiss, which take no half data, cluster the same half-rounded rows as float32, and so does
netcl in one more one-iteration row ("netcl, float32 rows").

Timings are medians over --repeat runs after a warm-up, contenders interleaved round-robin (other jobs on
a shared machine move absolute times; ratios within one run are what to read). FLOPs counted: 2 N K d per
assignment (the distance dot products; the update adds N d). Ratios are netcl's speed-up: the peer's
seconds over netcl's (above 1 = netcl faster).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netcl.cluster import KMeans  # noqa: E402
from netcl.cluster.kmeans import LloydBuffers  # noqa: E402
from netcl.core import dtypes  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import kmeans as km  # noqa: E402
from netcl.ops.gemm import variants as gemm_variants  # noqa: E402


def blobs(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """n float32 rows around k random centers (unit noise), in chunks to bound host memory."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k, d)).astype(np.float32) * 3
    out = np.empty((n, d), np.float32)
    for s in range(0, n, 1 << 18):
        m = min(1 << 18, n - s)
        out[s:s + m] = centers[rng.integers(0, k, m)] + rng.standard_normal((m, d), dtype=np.float32)
    return out


def round_robin(contenders: dict, repeat: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each contender's call (which must wait for its device), interleaved."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


class NetclLloyd:
    """One Lloyd iteration on device-resident data through netcl.ops.kmeans (what KMeans.fit repeats)."""

    def __init__(self, q, X: np.ndarray, C: np.ndarray):
        n, d = X.shape
        k = C.shape[0]
        self.q = q
        self.plan = km.kmeans_plan(q, X.dtype, n, d, k)
        self.x = Tensor.from_host(q, X)
        self.shift = Tensor.zeros(q, (d,), self.plan.dtype)
        self.centers = Tensor.from_host(q, C)
        self.bufs = LloydBuffers.make(self.plan)
        self.bufs.labels.fill_(-1)

    def __call__(self) -> np.ndarray:
        b, plan = self.bufs, self.plan
        km.kmeans_pack(plan, self.centers, b.packed, self.shift)
        b.changed.fill_(0)
        b.partials.zero_()
        km.kmeans_assign(plan, self.x, 0, self.shift, b.packed, self.centers, b.labels, b.dist, b.changed)
        km.kmeans_update(plan, self.x, 0, self.shift, b.labels, b.dist, None, b.partials)
        km.kmeans_finalize(plan, b.partials, self.centers, b.spare, b.sums, b.stats)
        return b.stats.to_host()  # the host read every iteration makes (convergence checks)

    def labels(self) -> np.ndarray:
        return self.bufs.labels.to_host()


def torch_peer(X: np.ndarray, C: np.ndarray, gpu: bool, matmul: bool = False):
    """PyTorch k-means as one writes it: cdist + argmin (an n x k matrix), index_add_ for the sums. Half
    rows (X float16 / bfloat16; centers C float32): the distances' cross term x @ c^T in the rows' format
    (cuBLAS on the matrix units) with `matmul`, else cdist on half rows and centers; the sums in float32."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda" if gpu else "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    half = X.dtype != np.float32
    tdtype = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}.get(X.dtype, torch.float32)
    # ml_dtypes' bfloat16 has no torch.from_numpy: its bits go over as int16
    x = (torch.from_numpy(X.view(np.int16)).to(dev).view(tdtype) if X.dtype == dtypes.bfloat16
         else torch.from_numpy(X).to(dev))
    c0 = torch.from_numpy(C).to(dev)

    def nearest(c):
        if matmul:
            return ((c * c).sum(1) - 2 * (x @ c.to(tdtype).T).float()).argmin(dim=1)
        return torch.cdist(x, c.to(tdtype)).argmin(dim=1)

    def iteration(c):
        labels = nearest(c)
        counts = torch.bincount(labels, minlength=c.shape[0]).to(c.dtype)
        sums = torch.zeros_like(c).index_add_(0, labels, x.float() if half else x)
        return torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c), labels

    def one():
        out = iteration(c0)
        sync()
        return out

    def fit(iters):
        c = c0
        for _ in range(iters):
            c, labels = iteration(c)
        sync()
        return c, labels

    return torch, dev, one, fit


RATED = ("one iteration", "assign kernel")  # rows whose GFLOP/s is 2 N K d over their seconds
# Tiles of kmeans_gpu.cl's assignment (the tiled GEMM's knobs, km.ASSIGN_TILE_KNOBS) for --sweep; {} is the
# default (the GEMM's own tile for the device: on NVIDIA 128 x 128 blocks, BK 8, 16 x 16 work-items of 8 x 8,
# VW 4, warp patches WX 8, 4-wide fetches). Each entry changes the default in the keys it names.
SWEEP_TILES = [
    {},
    {"BK": 16},
    {"BK": 4},
    {"WX": 0},
    {"GVEC": 0},  # guarded scalar fetches
    {"PADA": 0, "PADB": 0},
    {"BM": 64, "TY": 8},  # 64 x 128 blocks, 128 work-items of 8 x 8
    {"BN": 64, "TX": 8},  # 128 x 64 blocks, 128 work-items of 8 x 8
    {"BM": 64, "BN": 64, "TX": 8, "TY": 8, "BK": 16},  # the tile other GPUs' GEMM takes
    {"BM": 128, "BN": 64, "TX": 16, "TY": 16, "VW": 4},  # 8 x 4 per work-item: fewer registers
    {"BM": 64, "BN": 128, "TX": 16, "TY": 16, "VW": 4},  # 4 x 8 per work-item
    {"BM": 128, "BN": 128, "TX": 32, "TY": 8, "WX": 8},  # 16 x 4 per work-item
]


# Tiles of kmeans_mma.cl's assignment (half rows on matrix units: the matrix-unit GEMM's knobs,
# km.MMA_TILE_KNOBS) for --sweep --dtype float16/bfloat16; {} is the default (128 x 128 x 32 blocks of 8 warps
# of 64 x 32, a two-stage cp.async ring, ldmatrix).
SWEEP_MMA_TILES = [
    {},
    {"WN": 64},  # 4 warps of 64 x 64: the GEMM's own warp patch
    {"STAGES": 3, "BK": 16},
    {"BK": 64},
    {"BM": 64},
    {"BN": 64},
    {"BM": 64, "WN": 64},
    {"LDMATRIX": 0},
    {"ASYNC": 0},  # the register loader
]


def sweep_assign(q, X: np.ndarray, C: np.ndarray, repeat: int, row, note, tiles_list: list[dict],
                 variant: str = "gpu") -> None:
    """The assignment kernel of `variant` ("gpu": the tiled GEMM's block; "mma": the matrix units') alone at
    each tile of `tiles_list` (labels checked against the first's), and the update alone, each the median of
    `repeat` calls after a warm-up, waited for with finish()."""
    n, d = X.shape
    k = C.shape[0]
    x = Tensor.from_host(q, X)
    shift = Tensor.zeros(q, (d,), km.compute_dtype(X.dtype))
    centers = Tensor.from_host(q, C)
    reference = None
    for index, tiles in enumerate(tiles_list):
        try:
            plan = km.kmeans_plan(q, X.dtype, n, d, k, variant, assign_tiles=tiles)
            if variant == "mma":
                sizes = [f"{knob}={plan.mma[knob]}" for knob in ("BM", "BN", "BK", "WM", "WN", "STAGES")]
                flags = [f"{flag}={int(flag in plan.mma)}" for flag in ("ASYNC", "LDMATRIX")]
                name = "mma " + ",".join(sizes + flags)
            else:
                name = ",".join(f"{knob}={plan.defines.get(knob, 0)}" for knob in km.ASSIGN_TILE_KNOBS
                                if knob != "GVEC") + f",GVEC={int('GVEC' in plan.defines)}"
            bufs = LloydBuffers.make(plan)
            km.kmeans_pack(plan, centers, bufs.packed, shift)

            def assign(plan=plan, bufs=bufs):
                km.kmeans_assign(plan, x, 0, shift, bufs.packed, centers, bufs.labels, bufs.dist)
                q.finish()

            seconds = round_robin({name: assign}, repeat)[name]
        except Exception as exc:  # a tile a device refuses (local memory, registers) is noted, not fatal
            note(f"sweep {tiles}: {type(exc).__name__}: {exc}")
            continue
        labels = bufs.labels.to_host()
        if reference is None:
            reference = labels
        row("assign kernel", f"netcl {name}", q.device.device_name, seconds,
            labels_agree=float((labels == reference).mean()), note="assignment only, no update")
        if index == 0:
            bufs.partials.zero_()

            def update(plan=plan, bufs=bufs):
                km.kmeans_update(plan, x, 0, shift, bufs.labels, bufs.dist, None, bufs.partials)
                q.finish()

            row(
                "update kernel",
                "netcl",
                q.device.device_name,
                round_robin({"u": update}, repeat)["u"],
                note=f"partial sums: {plan.nseg} segments x {plan.nkc} cluster blocks x {plan.nfc} feature "
                     f"blocks",
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="run netcl (and PyTorch) on the GPU, at the GPU size")
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--n", type=int)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--k", type=int)
    ap.add_argument("--iters", type=int, default=None, help="iterations of the full fits (tol=0)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--skip", default="", help="comma list of peers to skip: sklearn,faiss,torch,plusplus")
    ap.add_argument("--sweep", action="store_true",
                    help="also time the GPU assignment kernel alone at several tiles (SWEEP_TILES: the tiled "
                         "GEMM's knobs BM, BN, BK, TX, TY, VW, PADA, PADB, WX, GVEC)")
    ap.add_argument("--tiles", default=None,
                    help="with --sweep: a JSON list of tile dicts to time instead of SWEEP_TILES, e.g. "
                         "'[{}, {\"BK\": 16}]' (each changes the default tile in the keys it names)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                    help="storage of the rows (half: netcl's assignment on matrix units where the device has "
                         "them; PyTorch's x @ c^T in half + argmin, and cdist)")
    ap.add_argument("--nv-verbose", action="store_true",
                    help="NVIDIA: build with -cl-nv-verbose, print registers/spills of k-means GPU builds")
    ap.add_argument("--out", default="bench/results/kmeans.json")
    args = ap.parse_args()
    if args.nv_verbose:
        gemm_variants.NV_VERBOSE = True

    n = args.n or (1_000_000 if args.gpu else 200_000)
    k = args.k or (1024 if args.gpu else 256)
    d = args.d
    iters = args.iters or (20 if args.gpu else 10)
    repeat = args.repeat or (5 if args.gpu else 3)
    skip = set(filter(None, args.skip.split(",")))
    threads = os.cpu_count() or 1
    dev = manager.get(args.device or ("gpu" if args.gpu else "auto"))
    q = dev.queue
    xdt = dtypes.normalize(args.dtype)
    X = blobs(n, d, k).astype(xdt)
    X32 = X if xdt == dtypes.float32 else X.astype(np.float32)  # the half-rounded rows, for the float peers
    C0 = X32[np.random.default_rng(1).choice(n, k, replace=False)].copy()
    flops = 2.0 * n * k * d
    rows: list[dict] = []
    notes: list[str] = []

    started = time.perf_counter()

    def note(text: str) -> None:
        notes.append(text)
        print("note:", text, flush=True)  # at once: a run cut short by a time limit keeps it

    def row(what, impl, device, seconds, memory=None, labels_agree=None, inertia=None, note=""):
        rows.append({"what": what, "impl": impl, "device": device, "seconds": seconds,
                     "gflops": flops / seconds / 1e9 if seconds and what in RATED else None,
                     "device_peak_bytes": memory, "labels_agree_with_netcl": labels_agree, "inertia": inertia,
                     "note": note})
        # each figure as it comes (a run cut short by a time limit keeps what it measured)
        print(f"[{time.perf_counter() - started:6.1f} s] {what} | {impl}: {seconds:.4f} s", flush=True)

    # -- one Lloyd iteration from the same centers --------------------------------------------------
    netcl_iter = NetclLloyd(q, X, C0)
    contenders = {"netcl": netcl_iter}
    peers_labels = {}
    sk_state = None
    if "sklearn" not in skip:
        try:
            from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense

            w = np.ones(n, np.float32)
            sk_state = (
                np.zeros_like(C0),
                np.zeros(k, np.float32),
                np.zeros(n, np.int32),
                np.zeros(k, np.float32),
            )

            from threadpoolctl import threadpool_limits

            def sk_iter():  # as sklearn's own Lloyd loop calls it: BLAS single-threaded inside its OpenMP
                with threadpool_limits(limits=1, user_api="blas"):
                    lloyd_iter_chunked_dense(
                        X32, w, C0, sk_state[0], sk_state[1], sk_state[2], sk_state[3], threads
                    )

            contenders["scikit-learn"] = sk_iter
        except Exception as exc:  # a missing peer is reported, not fatal
            notes.append(f"scikit-learn's Lloyd step unavailable: {exc}")
            try:
                import sklearn.cluster  # noqa: F401  (the fits need only its public KMeans)
            except Exception:
                skip.add("sklearn")
    faiss = None
    if "faiss" not in skip:
        try:
            import faiss

            faiss.omp_set_num_threads(threads)

            def faiss_iter():
                f = faiss.Kmeans(d, k, niter=1, max_points_per_centroid=n, min_points_per_centroid=1, seed=1)
                f.train(X32, init_centroids=C0)
                return f

            contenders["faiss"] = faiss_iter
        except Exception as exc:
            note(f"faiss-cpu skipped: it does not import ({type(exc).__name__}: {exc}); on the GPU machine "
                 "put its wheel into .gpu/wheels (see bench/NOTES.md, k-means)")
    torch_mod = torch_mm_fit = None
    if "torch" not in skip:
        try:
            torch_mod, tdev, torch_one, torch_fit = torch_peer(X, C0, args.gpu)
            contenders["pytorch cdist+argmin"] = torch_one
            if xdt != dtypes.float32:
                _, _, torch_mm_one, torch_mm_fit = torch_peer(X, C0, args.gpu, matmul=True)
                contenders["pytorch x@c^T+argmin"] = torch_mm_one
        except Exception as exc:
            notes.append(f"pytorch unavailable: {exc}")

    pool = dev.pool
    gc.collect()
    pool.reset_peak()
    netcl_iter()
    q.finish()
    netcl_iter_peak = pool.stats()["peak"]
    torch_iter_peak = None
    if torch_mod is not None and args.gpu:
        torch_mod.cuda.synchronize()
        torch_mod.cuda.reset_peak_memory_stats()
        torch_one()
        torch_iter_peak = torch_mod.cuda.max_memory_allocated()
    netcl_f32 = None
    if xdt != dtypes.float32:  # the same (half-rounded) rows as float32 through netcl, in the same run
        netcl_f32 = NetclLloyd(q, X32, C0)
        contenders["netcl, float32 rows"] = netcl_f32
    times = round_robin(contenders, repeat)
    ours = netcl_iter.labels()
    if netcl_f32 is not None:
        peers_labels["netcl, float32 rows"] = netcl_f32.labels()
    if sk_state is not None:
        peers_labels["scikit-learn"] = sk_state[2]
    if "pytorch cdist+argmin" in contenders:
        peers_labels["pytorch cdist+argmin"] = torch_one()[1].cpu().numpy()
    if "pytorch x@c^T+argmin" in contenders:
        peers_labels["pytorch x@c^T+argmin"] = torch_mm_one()[1].cpu().numpy()
    for name, s in times.items():
        device = dev.device_name if name.startswith("netcl") else (
            ("cuda" if args.gpu else "cpu") if name.startswith("pytorch") else f"host, {threads} threads")
        mem = (
            netcl_iter_peak if name == "netcl" else (torch_iter_peak if name.startswith("pytorch") else None)
        )
        agree = float((peers_labels[name] == ours).mean()) if peers_labels.get(name) is not None else None
        row("one iteration", name, device, s, mem, agree,
            note="faiss.Kmeans(niter=1).train: includes its setup" if name == "faiss" else "")

    contenders.clear()
    del netcl_iter, netcl_f32  # their copies of the data would count in the fit's peak below
    if args.sweep:
        mma = xdt != dtypes.float32 and km.takes_mma(dev, xdt)
        sweep_assign(q, X, C0, repeat, row, note,
                     json.loads(args.tiles) if args.tiles else (SWEEP_MMA_TILES if mma else SWEEP_TILES),
                     "mma" if mma else "gpu")
        if mma:  # the portable path (rows converted to float32 as they are staged) at its default tile
            sweep_assign(q, X, C0, repeat, row, note, [{}], "gpu")

    # -- full fits: `iters` iterations from C0, tol=0 ------------------------------------------------
    fits = {}
    fits["netcl"] = lambda: KMeans(k, init=C0, n_init=1, max_iter=iters, tol=0.0, device=dev).fit(X)
    if "sklearn" not in skip:
        from sklearn.cluster import KMeans as SKKMeans

        fits["scikit-learn"] = lambda: SKKMeans(k, init=C0, n_init=1, max_iter=iters, tol=0.0).fit(X32)
    if faiss is not None:
        def faiss_fit():
            f = faiss.Kmeans(d, k, niter=iters, max_points_per_centroid=n, min_points_per_centroid=1, seed=1)
            f.train(X32, init_centroids=C0)
            return f
        fits["faiss"] = faiss_fit
    if torch_mod is not None:
        fits["pytorch cdist+argmin"] = lambda: torch_fit(iters)
    if torch_mm_fit is not None:
        fits["pytorch x@c^T+argmin"] = lambda: torch_mm_fit(iters)
    gc.collect()
    pool.reset_peak()
    netcl_model = fits["netcl"]()
    netcl_fit_peak = pool.stats()["peak"]
    torch_fit_peak = None
    if torch_mod is not None and args.gpu:
        torch_mod.cuda.reset_peak_memory_stats()
        torch_fit(iters)
        torch_fit_peak = torch_mod.cuda.max_memory_allocated()
    # the same fit from rows already on the device, as PyTorch's fit starts from
    X_device = Tensor.from_host(q, X)
    fits["netcl, device Tensor"] = lambda: KMeans(k, init=C0, n_init=1, max_iter=iters, tol=0.0).fit(X_device)
    results: dict[str, object] = {}
    fit_times = round_robin({name: (lambda name=name, fn=fn: results.__setitem__(name, fn()))
                             for name, fn in fits.items()}, max(1, repeat // 2), warmup=1)
    sk_model = results.get("scikit-learn")
    for name, s in fit_times.items():
        device = dev.device_name if name.startswith("netcl") else (
            ("cuda" if args.gpu else "cpu") if name.startswith("pytorch") else f"host, {threads} threads")
        mem = netcl_fit_peak if name == "netcl" else (torch_fit_peak if name.startswith("pytorch") else None)
        agree, inertia = None, None
        if name.startswith("netcl"):
            inertia = results[name].inertia_
        elif name == "scikit-learn" and sk_model is not None:
            agree, inertia = float((sk_model.labels_ == netcl_model.labels_).mean()), float(sk_model.inertia_)
        row(f"fit, {iters} iterations", name, device, s, mem, agree, inertia,
            note={"netcl": "from host memory (includes the upload)",
                  "netcl, device Tensor": "rows already on the device",
                  "pytorch cdist+argmin": "rows already on the device",
                  "pytorch x@c^T+argmin": "rows already on the device"}.get(name, ""))
    # the same fit streamed from host memory in 8 chunks
    chunk = -(-n // 8)
    t0 = time.perf_counter()
    streamed = KMeans(k, init=C0, n_init=1, max_iter=iters, tol=0.0, device=dev, chunk_rows=chunk).fit(X)
    row(f"fit, {iters} iterations", "netcl streamed", dev.device_name, time.perf_counter() - t0, None,
        float((streamed.labels_ == netcl_model.labels_).mean()), streamed.inertia_,
        note=f"host array streamed in chunks of {chunk} rows (one run)")

    # -- k-means++ seeding ---------------------------------------------------------------------------
    if "plusplus" not in skip:
        from netcl.cluster import kmeans_plusplus

        kmeans_plusplus(X[:max(4 * k, 1024)], k, random_state=0, device=dev)  # warm-up: builds its programs
        t0 = time.perf_counter()
        _, ours_idx = kmeans_plusplus(X, k, random_state=0, device=dev)
        row("k-means++", "netcl", dev.device_name, time.perf_counter() - t0, note="one run, after a warm-up")
        if "sklearn" not in skip and args.gpu:
            notes.append("scikit-learn's k-means++ is not run with --gpu (minutes at this size on the host)")
        elif "sklearn" not in skip:
            from sklearn.cluster import kmeans_plusplus as sk_plusplus

            t0 = time.perf_counter()
            _, sk_idx = sk_plusplus(X32, k, random_state=0)
            row("k-means++", "scikit-learn", f"host, {threads} threads", time.perf_counter() - t0,
                labels_agree=float((sk_idx == ours_idx).mean()), note="one run; agree = same rows chosen")

    # -- table ---------------------------------------------------------------------------------------
    print(
        f"k-means, {xdt.name} rows: N={n} d={d} K={k}; {flops / 1e9:.1f} GFLOP per assignment; "
        f"netcl device: {dev.describe()}; host: "
        f"{platform.processor() or platform.machine()}, {threads} threads"
    )
    print(f"{'what':22s} {'impl':22s} {'device':26s} {'seconds':>9s} {'GFLOP/s':>8s} {'netcl x':>8s} "
          f"{'dev peak MB':>11s} {'agree':>6s}  note")
    for r in rows:
        base = next((b["seconds"] for b in rows if b["what"] == r["what"] and b["impl"] == "netcl"), None)
        r["netcl_speedup"] = r["seconds"] / base if base and r["seconds"] and r["impl"] != "netcl" else None
        mem = r["device_peak_bytes"]
        print(
            f"{r['what'][:22]:22s} {r['impl'][:22]:22s} {str(r['device'])[:26]:26s} {r['seconds']:9.3f} "
            f"{r['gflops'] if r['gflops'] else float('nan'):8.1f} "
            f"{r['netcl_speedup'] if r['netcl_speedup'] else float('nan'):8.2f} "
            f"{mem / 2**20 if mem else float('nan'):11.1f} "
            f"{la if (la := r['labels_agree_with_netcl']) is not None else float('nan'):6.3f} "
            f" {r['note']}"
        )
    caps = dev.capabilities
    print(
        f"limits: an assignment is {flops / 1e9:.1f} GFLOP over {n * d * xdt.itemsize / 1e6:.0f} MB of data "
        f"(compute-bound: "
        f"{flops / (n * d * xdt.itemsize):.0f} FLOP/byte); the n x k distance matrix PyTorch builds is "
        f"{n * k * 4 / 2**20:.0f} MiB; "
        f"device: {caps.compute_units} compute units at {caps.max_clock_mhz} MHz"
    )
    for note in notes:
        print("note:", note)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bench": "kmeans",
                "n": n,
                "d": d,
                "k": k,
                "dtype": xdt.name,
                "iters": iters,
                "repeat": repeat,
                "gpu": args.gpu,
                "netcl_device": dev.describe(),
                "host": platform.node(),
                "threads": threads,
                "flops_per_assignment": flops,
                "rows": rows,
                "notes": notes,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""All-reduce bus bandwidth: netcl's shared-memory backend and MPI (and PyTorch's NCCL with --gpu) beside
plain
memcpy bandwidth measured in the same run. Table + JSON.

    python bench/allreduce.py [--sizes-mb 1,4,16,64,256,512] [--ranks 2,4] [--modes shm,shm-array,tensor,mpi]
                              [--out bench/results/allreduce.json]
    python bench/allreduce.py --gpu [--devices 0:0,0:1]     (two GPUs: netcl tensors, device and host sums,
    NCCL)

Bus bandwidth is NCCL's: size / time x 2(W-1)/W, the bytes each rank must move for an all-reduce, so it can be
held against one copy's bandwidth whatever the number of ranks W. Modes, each float32 sums, in place:
  shm        netcl's shm backend on data already in the rank's shared segment (the collective itself: what a
             Tensor costs beyond its device transfers, which read into and write from the segments directly)
  shm-array  the same on a private NumPy array (copied into the segment and back out: two more copies)
  tensor     netcl.distributed.all_reduce of a Tensor on each rank's OpenCL device (device -> shm -> device)
  mpi        mpi4py's Allreduce (MPICH from the `mpi` extra) on a NumPy array, launched with mpiexec
  nccl       (--gpu) torch.distributed.all_reduce over NCCL on the same GPUs
memcpy: np.copyto of one buffer of the size into another (one process), GB/s = size / time; with --gpu also
the device's own buffer-to-buffer copy. The limit: a host all-reduce reads and writes each byte more than once
(shm: every rank reads N and writes N/W + (W-1)N/W; the copy in and out of shm-array adds 2N), so on one
memory
system busbw/memcpy of about 0.5-0.8 is the ceiling for W = 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def repeats_for(nbytes: int) -> int:
    return int(min(20, max(3, 2e9 // max(nbytes, 1))))


def median_seconds(fn, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- one rank (started by `netcl run`, mpiexec or the NCCL spawner)
# ----------------------------------------------
def worker(mode: str, sizes_mb: list[float]) -> None:
    results = {}
    if mode == "nccl":
        results = nccl_worker(sizes_mb)
    else:
        import netcl.distributed as dist

        grp = dist.init()
        for mb in sizes_mb:
            n = int(mb * (1 << 20)) // 4
            op = make_op(mode, grp, n)
            for _ in range(2):
                op()

            def timed(op=op):
                grp.barrier()
                t0 = time.perf_counter()
                op()
                return time.perf_counter() - t0

            results[str(mb)] = statistics.median(timed() for _ in range(repeats_for(n * 4)))
        if dist.rank() != 0:
            return
    if results:
        print("RESULT " + json.dumps(results), flush=True)


def make_op(mode: str, grp, n: int):
    import netcl.distributed as dist

    if mode == "shm":
        def op():
            grp.stage(n * 4)
            grp.reduce_staged(n, np.float32, "sum", gather=True)
            grp.end_call()
        grp.stage(n * 4).view(np.float32)[:n] = 1.0
        return op
    if mode in ("shm-array", "mpi"):
        a = np.ones(n, np.float32)
        return lambda: grp.all_reduce(a, "sum")
    if mode.startswith("tensor"):
        from netcl.core.device import manager
        from netcl.core.tensor import Tensor

        q = manager.default("auto").queue
        t = Tensor.from_host(q, np.ones(n, np.float32))

        def op():
            dist.all_reduce(t, "sum")
            q.finish()
        return op
    raise ValueError(mode)


def nccl_worker(sizes_mb: list[float]) -> dict:
    import torch
    import torch.distributed as tdist

    rank, world = int(os.environ["NETCL_RANK"]), int(os.environ["NETCL_WORLD_SIZE"])
    store = os.environ["NCCL_BENCH_STORE"]
    tdist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    out = {}
    for mb in sizes_mb:
        t = torch.ones(int(mb * (1 << 20)) // 4, device="cuda")
        for _ in range(3):
            tdist.all_reduce(t)
        torch.cuda.synchronize()

        def timed(t=t):
            tdist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tdist.all_reduce(t)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        out[str(mb)] = statistics.median(timed() for _ in range(repeats_for(t.numel() * 4)))
    tdist.destroy_process_group()
    return out if rank == 0 else {}


# -- the parent: launches, memcpy, the table
# ---------------------------------------------------------------------
def launch(mode: str, ranks: int, sizes_mb: list[float], devices: str | None, timeout: float) -> dict | str:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [str(Path(__file__).resolve()), "--worker", mode, "--sizes-mb", ",".join(map(str, sizes_mb))]
    if mode == "mpi":
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec), "-n", str(ranks), sys.executable, *args]
        env["NETCL_DIST_BACKEND"] = "mpi"
    else:
        cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", str(ranks)]
        cmd += ["--devices", devices] if devices and mode != "shm" and mode != "shm-array" else []
        cmd += [*args]
        if mode == "tensor-hostsum":
            env["NETCL_DIST_DEVICE_SUM"] = "0"
        if mode == "nccl":
            env["NCCL_BENCH_STORE"] = tempfile.mktemp(prefix="nccl-store-")
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, FileNotFoundError) as exc:
        return f"failed: {type(exc).__name__}"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return f"failed (rc {proc.returncode}): {last}"


def memcpy_gbs(sizes_mb: list[float]) -> dict:
    out = {}
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4
        src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
        out[str(mb)] = n * 4 / median_seconds(lambda: np.copyto(dst, src), repeats_for(n * 4), warmup=2) / 1e9
    return out


def device_copy_gbs(sizes_mb: list[float], spec: str | None) -> dict:
    from netcl.core.device import manager
    from netcl.core.tensor import Tensor

    q = manager.get(spec or "gpu").queue
    out = {}
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4
        a, b = Tensor.zeros(q, (n,)), Tensor.empty(q, (n,))

        def copy():
            b.copy_(a)
            q.finish()
        out[str(mb)] = n * 4 / median_seconds(copy, repeats_for(n * 4), warmup=2) / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="1,4,16,64,256,512")
    ap.add_argument("--ranks", default=None, help="comma-separated rank counts (default 2,4; --gpu: 2)")
    ap.add_argument(
        "--modes", default=None, help="default shm,shm-array,tensor,mpi; --gpu: tensor,tensor-hostsum,nccl"
    )
    ap.add_argument("--gpu", action="store_true", help="ranks on GPUs (one each), beside PyTorch's NCCL")
    ap.add_argument(
        "--devices", default="0:0,0:1", help="with --gpu: the ranks' devices (netcl run --devices)"
    )
    ap.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    if args.worker:
        worker(args.worker, sizes)
        return
    ranks = [int(r) for r in (args.ranks or ("2" if args.gpu else "2,4")).split(",")]
    modes = (args.modes or ("tensor,tensor-hostsum,nccl" if args.gpu else "shm,shm-array,tensor,mpi")).split(
        ","
    )
    result = {"sizes_mb": sizes, "memcpy_gbs": memcpy_gbs(sizes), "runs": {}}
    if args.gpu:
        result["device_copy_gbs"] = device_copy_gbs(sizes, args.devices.split(",")[0])
    for w in ranks:
        for mode in modes:
            t0 = time.perf_counter()
            got = launch(mode, w, sizes, args.devices if args.gpu else None, args.timeout)
            result["runs"][f"{mode}@{w}"] = got
            print(f"# {mode} with {w} ranks: {time.perf_counter() - t0:.0f} s"
                  + ("" if isinstance(got, dict) else f" ({got})"), file=sys.stderr, flush=True)
    result["memcpy_gbs_after"] = memcpy_gbs(sizes)  # the machine is shared: memcpy again at the end
    print_table(result, ranks, modes)
    out = Path(args.out or ROOT / "bench/results" / ("allreduce_gpu.json" if args.gpu else "allreduce.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


def print_table(result: dict, ranks: list[int], modes: list[str]) -> None:
    sizes = result["sizes_mb"]
    head = f"{'ranks':>5} {'MiB':>6} {'memcpy GB/s':>11}"
    for mode in modes:
        head += f" {mode + ' busbw':>17} {'/memcpy':>7}"
    print(head)
    for w in ranks:
        for mb in sizes:
            copy = min(result["memcpy_gbs"][str(mb)], result["memcpy_gbs_after"][str(mb)])
            row = f"{w:>5} {mb:>6g} {copy:>11.2f}"
            for mode in modes:
                got = result["runs"].get(f"{mode}@{w}")
                if isinstance(got, dict) and str(mb) in got:
                    bus = mb * (1 << 20) / got[str(mb)] * 2 * (w - 1) / w / 1e9
                    row += f" {bus:>17.2f} {bus / copy:>7.2f}"
                else:
                    row += f" {'-':>17} {'-':>7}"
            print(row)
    print(
        "busbw = size / time x 2(W-1)/W; /memcpy = busbw over "
        "the lower of the two memcpy runs (GB/s = 1e9 B/s)"
    )


if __name__ == "__main__":
    main()

"""`netcl tune`: measure kernel tile configurations on this device and store the winners."""

from __future__ import annotations

import argparse
import json

import numpy as np

from netcl.core.device import manager
from netcl.core.memory import format_bytes
from netcl.errors import NetclError
from netcl.kernels.tuning import database_for
from netcl.ops.gemm import flops
from netcl.tune.gemm import candidates, default_size, tune_gemm


def _parse_size(text: str) -> tuple[int, int, int]:
    try:
        parts = [int(p) for p in text.lower().replace("^3", "").split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be N or MxNxK, got {text!r}") from None
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"size must be N or MxNxK, got {text!r}")
    return parts[0], parts[1], parts[2]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


# Flags that only a measurement reads: with --show or --reset they would be silently ignored.
def _check_fits(device: object, size: tuple[int, int, int], dtype_names: list[str]) -> None:
    """A clear error where the GEMM's A, B and C of `size` do not fit the device (each one allocation) or
    this host (A and B are made here first)."""
    m, n, k = size
    caps = device.capabilities  # type: ignore[attr-defined]
    for name in dtype_names:
        item = np.dtype(name).itemsize
        largest, total = max(m * k, k * n, m * n) * item, (m * k + k * n + m * n) * item
        if largest > caps.max_alloc or total > caps.global_mem:
            raise NetclError(
                f"--size {m}x{n}x{k}: the {name} GEMM's A, B and C take {format_bytes(total)} (the largest "
                f"{format_bytes(largest)}), more than {device.describe()} holds (global "  # type: ignore[attr-defined]
                f"{format_bytes(caps.global_mem)}, largest allocation {format_bytes(caps.max_alloc)}); "
                "pick a smaller --size")


_MEASURE_FLAGS = {"quick": "--quick", "size": "--size", "limit": "--limit", "dry_run": "--dry-run",
                  "verbose": "--verbose"}


def _check_modes(args: argparse.Namespace) -> None:
    """--show and --reset are modes of their own: combined with each other or with a measuring flag, one
    of them would be ignored (--reset --dry-run would still forget the entries), so refuse the mix."""
    modes = [flag for flag, on in (("--show", args.show), ("--reset", args.reset)) if on]
    if len(modes) > 1:
        raise NetclError("--show and --reset are separate actions; give one of them")
    if modes:
        given = [flag for key, flag in _MEASURE_FLAGS.items() if getattr(args, key) not in (None, False)]
        if args.dtype != ["float32"]:
            given.insert(0, "--dtype")
        if given:
            raise NetclError(f"{modes[0]} measures nothing, so {', '.join(given)} would be "
                             f"ignored; leave {'it' if len(given) == 1 else 'them'} out")


def cmd_tune(args: argparse.Namespace) -> int:
    _check_modes(args)
    try:
        device = manager.get(args.device) if args.device else manager.default("auto")
    except NetclError as exc:
        if not args.device:
            raise
        raise NetclError(f"--device {args.device}: {exc}") from None
    db = database_for(device)
    if args.show:
        print(f"tuning database of {device.describe()}: {db.path}")
        print(json.dumps(db.entries(), indent=2, sort_keys=True) if db.entries() else "  (empty)")
        return 0
    if args.reset:
        db.remove("gemm_cpu")
        db.remove("gemm_tiled")
        print(f"removed GEMM entries from {db.path}")
        return 0
    variant = "cpu" if device.capabilities.kind == "cpu" else "tiled"
    size = args.size or default_size(device, args.quick)
    _check_fits(device, size, args.dtype)
    print(f"tuning GEMM ({variant} kernel) on {device.describe()}, size {size[0]}x{size[1]}x{size[2]}")
    for dtype_name in args.dtype:
        dt = np.dtype(dtype_name)
        if dt == np.float64 and not device.capabilities.fp64:
            print(f"  {dtype_name}: skipped (no fp64 on this device)")
            continue
        cands = candidates(device, variant, dt, args.quick)
        if args.limit:
            cands = cands[: args.limit]
        print(f"  {dtype_name}: {len(cands)} candidates")
        result = tune_gemm(device, dt, quick=args.quick, size=size, variant=variant, store=not args.dry_run,
                           verbose=args.verbose, candidate_list=cands)
        if result.best is None:
            print(f"  {dtype_name}: every candidate failed; keeping the defaults")
            continue
        default_s = result.timings[0][1]
        best_gf = flops(*size) / result.best_seconds / 1e9
        default_gf = flops(*size) / default_s / 1e9 if default_s != float("inf") else 0.0
        print(f"  {dtype_name}: best {result.best} {best_gf:.1f} GFLOP/s (default {default_gf:.1f})")
    if not args.dry_run:
        print(f"stored in {db.path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune", help="measure kernel configurations on this device (GEMM)",
        description="Measure GEMM tile configurations on one device and store the fastest per dtype in that "
        "device's tuning database (NETCL_CACHE_DIR); later programs use them instead of the defaults "
        "(NETCL_TUNING=0 ignores them). A configuration the device's compiler rejects is skipped.")
    p.add_argument("--quick", action="store_true", help="fewer candidates and a smaller problem")
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float16", "float32", "float64"])
    p.add_argument("--size", type=_parse_size, default=None, help="problem size N or MxNxK")
    p.add_argument("--device", default=None, help="device spec (default: NETCL_DEVICE or auto)")
    p.add_argument("--limit", type=_positive_int, default=None, help="measure at most this many candidates")
    p.add_argument("--dry-run", action="store_true", help="measure but store nothing")
    p.add_argument("--show", action="store_true", help="print this device's tuning database and exit")
    p.add_argument("--reset", action="store_true", help="forget this device's GEMM entries and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="print every candidate's time")
    p.set_defaults(func=cmd_tune)

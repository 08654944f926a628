"""The `netcl` command: devices, demo, profile, train and tune."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from netcl import config, profiling
from netcl.core import backend, variants
from netcl.core.device import manager, no_platform_message
from netcl.core.memory import format_bytes
from netcl.core.tensor import Tensor
from netcl.distributed import launch
from netcl.errors import NetclError
from netcl.ops.gemm import matrix_units
from netcl.train import generate as generate_cli
from netcl.train import lm as lm_main
from netcl.train import main as train_main
from netcl.tune import cli as tune_cli

# Modules that add their own subcommands (`netcl tune`, `netcl train`): each has register(subparsers),
# kept beside the code its commands run.
_SUBCOMMAND_MODULES = (tune_cli, train_main, launch, lm_main, generate_cli)


def cmd_devices(args: argparse.Namespace) -> int:
    """Print every platform and device with its capabilities; mark the one "auto" picks."""
    handles = manager.devices()
    if not handles:
        print("netcl: " + no_platform_message(), file=sys.stderr)
        return 1
    try:
        chosen = manager.default("auto")
    except NetclError as exc:
        where = f"NETCL_DEVICE={config.device_spec()!r} matches nothing: " if config.device_spec() else ""
        print(f"netcl: {where}{exc}", file=sys.stderr)
        chosen = None
    platform = None
    for h in handles:
        if h.platform is not platform:
            platform = h.platform
            print(f"Platform {h.index[0]}: {h.platform_name} ({platform.version.strip()})")
        c = h.capabilities
        mark = "  <- default" if h is chosen else ""
        print(f"  [{h.spec}] {h.device_name} ({c.kind}){mark}")
        print(
            f"      OpenCL      {c.opencl_version.strip()} / {c.opencl_c_version.strip()}, driver "
            f"{c.driver_version}"
        )
        print(
            f"      memory      global {format_bytes(c.global_mem)}, largest allocation "
            f"{format_bytes(c.max_alloc)}, "
            f"local {format_bytes(c.local_mem)}{'' if c.local_mem_dedicated else ' (emulated in global)'}"
        )
        print(f"      compute     {c.compute_units} units @ {c.max_clock_mhz} MHz, work-group <= "
              f"{c.max_work_group_size}, subgroups {list(c.subgroup_sizes) or 'n/a'}")
        fp16 = (
            "yes"
            if h.fp16
            else ("extension only (probe failed)" if c.fp16_extension else "no (storage only)")
        )
        print(f"      precision   fp64 {'yes' if c.fp64 else 'no'}, fp16 arithmetic {fp16}")
        units = matrix_units(h)
        print(
            "      matrix units "
            + (
                f"mma.sync (sm_{c.nv_compute_capability[0]}{c.nv_compute_capability[1]}): "
                "float16 GEMMs, TF32 for float32 under set_matmul_precision('high')"
                if units
                else "none netcl drives (GEMMs take the portable kernels)"
            )
        )
        widths = ", ".join(f"{k} {v}" for k, v in c.preferred_vector_width.items())
        print(f"      vectors     {widths}")
        if h.kind == "cpu" and h.compiler_unusable:
            print("      compiler    builds no program: its LLVM does not know this CPU ('unknown target CPU "
                  "generic'); passed over by auto")
        store = variants.verdicts(h)
        for key, reason in store.rejected().items():
            print(f"      rejected    {key.rsplit(' | ', 1)[0]}: {reason}")
        if store.rejected():
            print(f"                  (kernel variants this device's compiler failed on; {store.path})")
    if config.device_spec():
        print(f"NETCL_DEVICE={config.device_spec()}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """List devices, then run a small computation on the default device and check it."""
    cmd_devices(args)
    dev = manager.default("auto")
    q = dev.queue
    print(f"\nDemo on {dev.device_name} ({dev.backend})")
    x = Tensor.randn(q, (512, 256), seed=0)
    host = x.to_host()
    t0 = time.perf_counter()
    back = Tensor.from_host(q, host).transpose().contiguous().to_host()
    dt = time.perf_counter() - t0
    ok = np.array_equal(back, host.T)
    print(f"randn (512, 256): mean {host.mean():+.4f}, std {host.std():.4f}")
    print(
        f"round trip host -> device -> transpose -> host: "
        f"{'exact' if ok else 'MISMATCH'} in {dt * 1e3:.2f} ms"
    )
    print(f"pool: {dev.pool.stats()}")
    return 0 if ok else 1


def _check_writable(path: Path, flag: str) -> None:
    """A file `path` can be written (its directory made if missing), or a NetclError naming `flag`."""
    if path.is_dir():
        raise NetclError(f"{flag} {path} is a directory; give a file name (e.g. {path / 'trace.json'})")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # export makes the missing directories: the nearest existing one decides
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise NetclError(f"{flag} {path}: cannot write there ({parent} is not a writable directory)")


def cmd_profile(args: argparse.Namespace) -> int:
    """Run a script under netcl.profiling: its tables on stderr, its Chrome trace written."""
    script = Path(args.script)
    if not script.is_file():
        raise NetclError(f"no script {script} (netcl profile runs a Python file)")
    trace = Path(args.trace) if args.trace else Path(f"{script.stem}.trace.json")
    _check_writable(trace, "--trace")  # before the script runs: a bad path must not cost its profile
    status, _ = profiling.run_script(str(script), list(args.args), trace, top=args.top)
    return status


# a build from source faster than this found its program in the driver's own cache (PoCL's: ~0.02-0.03 s on a
# 2-core CPU, against 0.13 s and more for a compile)
SLOW_BUILD_SECONDS = 0.08


@contextlib.contextmanager
def announce_kernel_builds() -> Iterator[None]:
    """Inside: the first OpenCL program compiled (a first run, a new netcl or driver) prints one line on
    stderr saying so, and whether later runs load them, instead of a command sitting silent at step 0 while
    PoCL compiles for a minute. A program built from source counts where netcl's disk cache is on (it missed
    there); where it is off, only a build slower than SLOW_BUILD_SECONDS does (a faster one came from the
    driver's own cache). Ranks other than 0 of a data-parallel job say nothing (rank 0 speaks for the job)."""
    launched = config.dist_launch()
    said: list[str] = []
    lock = threading.Lock()

    def say(device: Any, name: str, seconds: float) -> None:
        if said or (launched is not None and launched[0] != 0):
            return  # (every later build: nothing read)
        ours = backend.disk_cache_enabled(device)
        if not ours and seconds < SLOW_BUILD_SECONDS:
            return
        with lock:  # builds may run on several threads
            if said:
                return
            said.append(name)
        if ours:
            later = f"kept in {config.cache_dir() / 'programs'}, so later runs skip this"
        elif backend.driver_keeps_programs(device):
            later = f"{device.platform_name} keeps them in its own cache, so later runs skip this"
        else:
            later = "NETCL_DISK_CACHE=0: every run builds them again"
        tqdm.write(f"netcl: building OpenCL kernels for {device.device_name} ({later})", file=sys.stderr)

    backend.source_build_listeners.append(say)
    try:
        yield
    finally:
        backend.source_build_listeners.remove(say)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netcl", description="netcl: deep learning on any OpenCL device")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("devices", help="list OpenCL platforms and devices").set_defaults(func=cmd_devices)
    sub.add_parser("demo", help="list devices and run a small computation").set_defaults(func=cmd_demo)
    p = sub.add_parser(
        "profile",
        help="run a Python script under the profiler: tables and a Chrome trace",
        description="Run SCRIPT [ARGS] as __main__ under netcl.profiling.profile(): print the device "
        "time per kernel, op and module scope, and write the timeline as Chrome trace-event JSON "
        "(open it in Perfetto or chrome://tracing).",
    )
    p.add_argument(
        "--trace", default=None, help="where the trace goes (default: SCRIPT's name + .trace.json here)"
    )
    p.add_argument("--top", type=launch.positive_int, default=25, help="rows per table (default 25)")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(func=cmd_profile)
    for module in _SUBCOMMAND_MODULES:
        module.register(sub)
    args = parser.parse_args(argv)
    args.argv = list(
        sys.argv[1:] if argv is None else argv
    )  # what `netcl train --nproc N` starts again per rank
    try:
        config.check_environment()  # every NETCL_* setting, before the command reads any of them
        with announce_kernel_builds():
            return args.func(args)
    except NetclError as exc:
        print(f"netcl: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Every NETCL_* environment knob, read in this one place (see the README's table). Each reader checks its
variable's value where it is read: a value it cannot use is a ConfigError naming the variable, the value and
what it takes, never a silent default. `check_environment()` reads them all at once (the `netcl` command
does, before it runs anything)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import platformdirs

from netcl.errors import ConfigError

_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def env(name: str, default: str | None = None) -> str | None:
    """os.environ.get(name, default), about 10x cheaper on POSIX (launches read NETCL_DEBUG each
    time): the environment mapping's own bytes dict, which os.environ and monkeypatch keep current."""
    if isinstance(_ENV_DATA, dict):
        raw = _ENV_DATA.get(name.encode())
        return default if raw is None else raw.decode("utf-8", "surrogateescape")
    return os.environ.get(name, default)


_ON = frozenset(("1", "true", "yes", "on"))
_OFF = frozenset(("0", "false", "no", "off"))


def _flag(name: str, default: bool = False, other: str = "") -> bool:
    """An on/off variable: 1/0, true/false, yes/no, on/off (any case); unset or empty: `default`.
    `other` names what else the variable takes, for the error."""
    raw = env(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    if not value:
        return default
    raise ConfigError(
        f"{name}={raw!r}: expected 1 or 0 (or true/false, yes/no, on/off){other} "
        f"(unset it for {int(default)})"
    )


def _int(name: str, default: int, minimum: int = 0) -> int:
    raw = env(name, "")
    if not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r}: expected an integer >= {minimum} (unset it for {default})"
        ) from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r}: expected an integer >= {minimum} (unset it for {default})")
    return value


def device_spec() -> str | None:
    """NETCL_DEVICE: `gpu`, `cpu`, `accelerator`, a name fragment, or `P:D`; None when unset (the device
    manager checks the value against the devices there are: netcl.core.device)."""
    raw = (env("NETCL_DEVICE") or "").strip()
    return raw or None


def profiling() -> bool:
    """NETCL_PROFILE=1 (or a path ending in .json): profile the whole program (netcl.profiling)."""
    raw = (env("NETCL_PROFILE") or "").strip()
    if raw.lower().endswith(".json"):
        return True
    return _flag("NETCL_PROFILE", other=", or a path ending in .json for a trace")


def profile_trace() -> str | None:
    """NETCL_PROFILE=PATH.json: where a whole-program profile writes its Chrome trace at exit (else None)."""
    raw = (env("NETCL_PROFILE") or "").strip()
    return raw if raw.lower().endswith(".json") else None


def debug_level() -> int:
    """NETCL_DEBUG: 0 silent, 1 print each launch, 2 also print generated source."""
    return _int("NETCL_DEBUG", 0)


_FUSION = b"NETCL_FUSION"
_fusion_by_value: dict[bytes | None, bool] = {}  # the variable's raw value -> what it means (valid ones)


def fusion_enabled() -> bool:
    """NETCL_FUSION=0 turns automatic elementwise fusion off (results are identical). Read at every
    elementwise op (a change takes effect at the next one): the meaning of each raw value seen is kept, so a
    read is two lookups."""
    if isinstance(_ENV_DATA, dict):
        raw = _ENV_DATA.get(_FUSION)
        known = _fusion_by_value.get(raw)
        if known is not None:
            return known
        known = _flag("NETCL_FUSION", True)  # a bad value raises here, every time
        if len(_fusion_by_value) < 64:
            _fusion_by_value[raw] = known
        return known
    return _flag("NETCL_FUSION", True)


def deterministic() -> bool:
    """NETCL_DETERMINISTIC=0 starts a program with netcl's float-atomic fast paths on (netcl.set_deterministic
    changes it at run time); default 1: the same inputs give the same bits on every run."""
    return _flag("NETCL_DETERMINISTIC", True)


def disk_cache_setting() -> bool | None:
    """NETCL_DISK_CACHE: `1` stores and loads program binaries on disk, `0` never; `auto` (unset, the default:
    None here): on, except for drivers that keep every program they build in a cache of their own
    (netcl.core.backend.disk_cache_enabled decides per device: PoCL with its kernel cache on)."""
    raw = env("NETCL_DISK_CACHE")
    if raw is None or raw.strip().lower() in ("", "auto"):
        return None
    value = raw.strip().lower()
    if value in _ON or value in _OFF:
        return value in _ON
    raise ConfigError(f"NETCL_DISK_CACHE={raw!r}: expected auto, 1 or 0 (or true/false, yes/no, on/off) "
                      "(unset it for auto)")


def cache_dir() -> Path:
    """NETCL_CACHE_DIR: where program binaries and tuning results live (default: the user cache)."""
    raw = env("NETCL_CACHE_DIR", "").strip()
    if not raw:
        return Path(platformdirs.user_cache_dir("netcl"))
    path = Path(raw).expanduser()
    if path.exists() and not path.is_dir():  # else every write fails, quietly costing a rebuild each run
        raise ConfigError(f"NETCL_CACHE_DIR={raw!r} is a file, not a directory; point it at a directory "
                          "(made if missing), or unset it for the user cache")
    return path


# Launch shapes of the JIT's elementwise and reduction kernels on GPUs, read once, at the first launch.
# bench/elementwise.py --sweep times other values (one child process each); the defaults are its winners
# on the H200 (bench/NOTES.md, elementwise). name: (default, smallest allowed, meaning)
JIT_KNOBS: dict[str, tuple[int, int, str]] = {
    "NETCL_EW_VEC": (4, 1, "elements per vector load and store of an elementwise work-item (1, 2, 4, 8, 16)"),
    "NETCL_EW_LOCAL": (256, 1, "work-group size of elementwise kernels"),
    "NETCL_EW_GROUPS_PER_CU": (
        0,
        0,
        "elementwise work-groups per compute unit, then a grid-stride loop (0: no cap)",
    ),
    "NETCL_EW_ALIGNED": (1, 0, "1: aligned vector loads where every operand's offset allows them"),
    "NETCL_RED_GROUPS_PER_CU": (4, 1, "work-groups per compute unit of a full reduction"),
    "NETCL_RED_VEC": (4, 1, "elements per vector load of a reduction (1, 2, 4, 8, 16)"),
    "NETCL_RED_UNROLL": (4, 1, "loads in flight per reduction work-item (loop unroll)"),
    "NETCL_RED_ALIGNED": (1, 0, "1: aligned vector loads in reductions where offsets allow them"),
    "NETCL_SOFTMAX_REG": (
        8,
        0,
        "softmax rows of up to 256 x 4 x this many elements stay in registers (0: never)",
    ),
}


def jit_knob(name: str) -> int:
    """The value of one of JIT_KNOBS (ConfigError naming the variable when it is not a valid integer)."""
    default, minimum, _ = JIT_KNOBS[name]
    value = _int(name, default, minimum)
    if name.endswith("_VEC") and value not in (1, 2, 4, 8, 16):
        raise ConfigError(
            f"{name}={value}: an OpenCL vector width, one of 1, 2, 4, 8, 16 (unset it for {default})"
        )
    return value


def half_mode() -> str:
    """NETCL_HALF: how float16 is computed. `auto` (default): native half arithmetic only for kernel families
    measured faster with it on a device whose cl_khr_fp16 passes the probe, float32 arithmetic on half storage
    elsewhere; `storage`: always float32 arithmetic on half storage; `native`: half arithmetic wherever a
    kernel family has it and the probe passes; `off`: no mixed precision (netcl.amp.autocast runs float32)."""
    raw = (env("NETCL_HALF") or "").strip().lower() or "auto"
    if raw not in ("auto", "off", "storage", "native"):
        raise ConfigError(f"NETCL_HALF={raw!r}: expected auto, off, storage or native (unset it for auto)")
    return raw


def tuning_enabled() -> bool:
    """NETCL_TUNING=0 ignores the tuning database (kernels use their per-device defaults)."""
    return _flag("NETCL_TUNING", True)


# -- data parallelism (netcl.distributed); `netcl run` sets NETCL_RANK, NETCL_WORLD_SIZE, NETCL_DIST_ID
# ---------
def _positive_float(name: str, default: float) -> float:
    raw = env(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name}={raw!r}: expected a number > 0 (unset it for {default:g})")
    return value


def dist_backend() -> str | None:
    """NETCL_DIST_BACKEND: `shm` (one host, shared memory) or `mpi` (mpi4py); None when unset
    (netcl.distributed
    then picks from the environment: mpiexec's variables mean mpi, `netcl run`'s mean shm)."""
    raw = env("NETCL_DIST_BACKEND", "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw not in ("shm", "mpi"):
        raise ConfigError(
            f"NETCL_DIST_BACKEND={raw!r}: expected shm or mpi (unset it to choose from the environment)"
        )
    return raw


def dist_timeout() -> float:
    """NETCL_DIST_TIMEOUT: seconds a rank waits for the others in a collective before it raises
    DistributedError naming the ranks that did not arrive (default 60)."""
    return _positive_float("NETCL_DIST_TIMEOUT", 60.0)


def dist_bucket_mb() -> float:
    """NETCL_DIST_BUCKET_MB: DistributedDataParallel's gradient bucket size in MiB (default 64: PyTorch's 25
    measured slower here, where each host-staged all-reduce costs milliseconds of fixed work; see
    bench/NOTES.md)."""
    return _positive_float("NETCL_DIST_BUCKET_MB", 64.0)


def dist_device_sum() -> str:
    """NETCL_DIST_DEVICE_SUM: where all_reduce sums the chunks it receives: `auto` (on the device for GPUs and
    accelerators, on the host for CPU devices), `1` (always on the device) or `0` (always on the host)."""
    raw = env("NETCL_DIST_DEVICE_SUM", "").strip().lower() or "auto"
    if raw not in ("auto", "0", "1"):
        raise ConfigError(f"NETCL_DIST_DEVICE_SUM={raw!r}: expected auto, 0 or 1")
    return raw


BALANCE_MODES = ("auto", "on", "off")


def dist_balance() -> str:
    """NETCL_DIST_BALANCE: how netcl.distributed.Balancer splits each global batch: `auto` (by measured speed
    when the ranks' devices differ, else equally), `on` (always by measured speed) or `off` (equally); `netcl
    run --balance` sets it for its ranks."""
    raw = env("NETCL_DIST_BALANCE", "").strip().lower() or "auto"
    if raw not in BALANCE_MODES:
        raise ConfigError(f"NETCL_DIST_BALANCE={raw!r}: expected auto, on or off")
    return raw


def dist_launch() -> tuple[int, int, str] | None:
    """(rank, world size, job id) from NETCL_RANK, NETCL_WORLD_SIZE and NETCL_DIST_ID (set by `netcl run` for
    each process it starts); None when NETCL_RANK is unset."""
    raw_rank = env("NETCL_RANK", "").strip()
    if not raw_rank:
        return None
    world = _int("NETCL_WORLD_SIZE", 0, 1)
    if world == 0:
        raise ConfigError("NETCL_RANK is set but NETCL_WORLD_SIZE is not; `netcl run` sets both")
    rank = _int("NETCL_RANK", 0, 0)
    if rank >= world:
        raise ConfigError(f"NETCL_RANK={rank} is not below NETCL_WORLD_SIZE={world}")
    job = env("NETCL_DIST_ID", "").strip()
    if not job or not all(c.isalnum() or c in "-_" for c in job):
        raise ConfigError(
            f"NETCL_DIST_ID={job!r}: expected the job id `netcl run` sets (letters, digits, - and _)"
        )
    return rank, world, job


def in_variant_probe() -> bool:
    """NETCL_VARIANT_PROBE=1: this process is a probe child of netcl.core.variants (set by netcl, not by
    users: such a child tries one risky kernel build and reports)."""
    return _flag("NETCL_VARIANT_PROBE")


# The readers check_environment runs: every variable above (the JIT knobs through jit_knob).
_READERS: tuple[Callable[[], object], ...] = (
    device_spec, profiling, debug_level, fusion_enabled, deterministic, disk_cache_setting, cache_dir,
    half_mode, tuning_enabled, dist_backend, dist_timeout, dist_bucket_mb, dist_device_sum, dist_balance,
    dist_launch, in_variant_probe,
)


def check_environment() -> None:
    """Read every NETCL_* variable once: a ConfigError for the first value netcl cannot use. The `netcl`
    command runs it before anything else, so a bad setting is one line up front instead of an error at
    whichever launch first reads it (or none, for a variable the command never reads)."""
    for read in _READERS:
        read()
    for name in JIT_KNOBS:
        jit_knob(name)

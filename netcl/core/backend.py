"""OpenCL backend: queues, program build and cache (memory and disk), kernel launch, transfers.

Every pyopencl call that can fail on user input goes through here, so raw OpenCL errors turn
into netcl exceptions (see netcl.errors) before they reach a user.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

from netcl import config
from netcl.core import capture, ptx
from netcl.core import profile_hooks as profiling  # the launch path's side of netcl.profiling
from netcl.core.files import atomic_write
from netcl.errors import DeviceError, KernelBuildError, KernelLaunchError, OutOfMemoryError, ShapeError

CL_STD = "-cl-std=CL1.2"

_OOM_CODES = {-4, -5}  # MEM_OBJECT_ALLOCATION_FAILURE, OUT_OF_RESOURCES (NVIDIA's OOM on launch)


def is_oom(exc: BaseException) -> bool:
    code = getattr(exc, "code", None)
    if code is None and getattr(exc, "args", None):
        code = getattr(exc.args[0], "code", None)
    if callable(code):
        code = code()
    return code in _OOM_CODES or "MEM_OBJECT_ALLOCATION_FAILURE" in str(exc)


class Queue:
    """An in-order OpenCL command queue on one device: the wire every tensor and launch uses."""

    def __init__(self, device: Any, profiling: bool = False):
        self.device = device
        self.profiling = profiling  # made with event timing: its launches go to the process-wide profile
        self.timed = profiling  # its OpenCL queue records event times now (a profile may switch it)
        self.cl = self._make(profiling)
        self._staging: Any = None  # pinned staging buffers (netcl.core.memory.staging makes them)
        self._lock = threading.Lock()
        self._checks: cl.Buffer | None = None
        self._arrivals: dict[int, cl.Buffer] = {}

    def __deepcopy__(self, memo: dict) -> Queue:
        """A queue is a device's wire, not data: `copy.deepcopy` of what holds one (a module, a tensor) keeps
        it."""
        return self

    def _make(self, timed: bool) -> cl.CommandQueue:
        props = cl.command_queue_properties.PROFILING_ENABLE if timed else 0
        try:
            return cl.CommandQueue(self.device.context, self.device.cl_device, properties=props)
        except cl.Error as exc:
            raise DeviceError(f"could not create a command queue on {self.device.describe()}: {exc}") from exc

    def set_timing(self, timed: bool) -> None:
        """Make this queue record event times, or stop (netcl.profiling.profile() switches queues made
        without them for its duration: OpenCL fixes a queue's properties, so the work enqueued so far is
        finished and a new OpenCL queue of the same device and context takes over, in order)."""
        timed = timed or self.profiling
        with self._lock:
            if timed == self.timed:
                return
            self.finish()
            self.cl = self._make(timed)
            self.timed = timed

    @property
    def context(self) -> cl.Context:
        return self.device.context

    def check_buffer(self) -> cl.Buffer:
        """This queue's device-check record: CHECK_WORDS int32 that a kernel fills when it meets input it
        cannot honour (a class label outside [0, C), say): [code, value low, value high, row, limit].
        The first kernel to fail wins (atomic_cmpxchg on the code); the next host read on this queue
        raises it (`raise_device_errors`). Made zeroed on first use, so queues whose kernels never
        check pay nothing."""
        checks = self._checks
        if checks is not None:  # every class-loss launch asks: no lock once it is made
            return checks
        with self._lock:
            if self._checks is None:
                zeros = np.zeros(CHECK_WORDS, np.int32)
                try:
                    self._checks = cl.Buffer(
                        self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=zeros
                    )
                except cl.Error as exc:
                    raise DeviceError(f"could not allocate the check record on {self.device.describe()}: "
                                      f"{exc}") from exc
            return self._checks

    def arrival_counts(self, n: int) -> cl.Buffer:
        """n zeroed int32 for kernels whose last work-group to arrive merges the others' partials
        (nc_last_arrival of common.cl: each launch's last arrival resets its count), so one buffer per
        queue and size serves every launch and every recorded replay: launches on one in-order queue
        never overlap. Made on first use."""
        counts = self._arrivals.get(n)
        if counts is not None:
            return counts
        with self._lock:
            if n not in self._arrivals:
                try:
                    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
                    self._arrivals[n] = cl.Buffer(self.context, flags, hostbuf=np.zeros(max(n, 1), np.int32))
                except cl.Error as exc:
                    raise DeviceError(f"could not allocate {n} arrival counts on {self.device.describe()}: "
                                      f"{exc}") from exc
            return self._arrivals[n]

    def shared_buffers(self) -> list[tuple[int, cl.Buffer]]:
        """The buffers this queue keeps for kernels to share, each with the number that asks for it again:
        (n, arrival_counts(n)) for each made, and (-1, the check record) once made (netcl.core.template: a
        replay passes the replaying queue's own)."""
        with self._lock:
            kept = list(self._arrivals.items())
            if self._checks is not None:
                kept.append((-1, self._checks))
        return kept

    def raise_device_errors(self) -> None:
        """Raise what a kernel recorded in the check record since the last look (and clear it)."""
        if self._checks is None:
            return
        record = np.empty(CHECK_WORDS, np.int32)
        cl.enqueue_copy(self.cl, record, self._checks, is_blocking=True)
        if record[0] == 0:
            return
        cl.enqueue_copy(self.cl, self._checks, np.zeros(CHECK_WORDS, np.int32), is_blocking=True)
        message = _check_messages[record[0] - 1] if 0 < record[0] <= len(_check_messages) else "unknown check"
        value = int(np.uint32(record[1])) | (int(record[2]) << 32)
        raise ShapeError(
            message.format(value=value, row=int(record[3]), limit=int(record[4]))
            + " (found by a kernel on the device; results computed since that launch are not valid)"
        )

    def finish(self) -> None:
        """Wait until everything enqueued on this queue is done."""
        try:
            self.cl.finish()
        except cl.Error as exc:
            raise KernelLaunchError(f"a command on {self.device.describe()} failed: {exc}") from exc

    synchronize = finish

    def __repr__(self) -> str:
        return f"Queue({self.device.describe()}{', profiling' if self.profiling else ''})"


# -- device-side input checks (Queue.check_buffer) -------------------------------------------------------
CHECK_WORDS = 8
_check_messages: list[str] = []


def device_check(message: str) -> np.int32:
    """The code a kernel reports a failed check under; `message` is formatted with value, row, limit
    when the host raises it, e.g. "cross_entropy: label {value} in row {row} is outside [0, {limit})"."""
    if message not in _check_messages:
        _check_messages.append(message)
    return np.int32(_check_messages.index(message) + 1)


def as_queue(q: Any) -> Queue:
    """Accept a netcl Queue (or a DeviceHandle, meaning its default queue)."""
    if isinstance(q, Queue):
        return q
    if hasattr(q, "queue") and isinstance(q.queue, Queue):
        return q.queue
    raise DeviceError(
        f"expected a netcl Queue (device.queue or device.new_queue()), got {type(q).__name__}; "
        "raw pyopencl queues are not accepted because netcl owns each device's context"
    )


# -- program builds (netcl.kernels is the one way in: it keeps the built programs) ---------------
def format_options(defines: dict[str, Any] | None = None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Build options: the OpenCL C standard, then -DNAME=VALUE for each define, then `extra`. Compiler
    warnings are off (-w, a standard option) unless NETCL_DEBUG >= 2: PoCL prints a bare "1 warning
    generated." for each one (an unroll pragma it could not honour, say), which tells a user nothing."""
    opts = [CL_STD] if config.debug_level() >= 2 else [CL_STD, "-w"]
    for name, value in sorted((defines or {}).items()):
        opts.append(f"-D{name}" if value is None else f"-D{name}={value}")
    opts.extend(extra)
    return tuple(opts)


# clang-style "<file>:LINE:COL: error" (NVIDIA, Oclgrind) and PoCL's "error: <file>:LINE:COL:"
_ERROR_LINE = re.compile(r":(\d+):\d+:\s*(?:fatal\s+)?error|error:\s*\S*?:(\d+):\d+:", re.IGNORECASE)


def _offending_lines(log: str, source: str, context: int = 1) -> str:
    lines = source.splitlines()
    errors = sorted({int(m.group(1) or m.group(2)) for m in _ERROR_LINE.finditer(log)})[:20]
    shown_numbers = sorted(
        {n for e in errors for n in range(max(1, e - context), min(len(lines), e + context) + 1)}
    )
    return "\n".join(f"{'>>' if n in errors else '  '} {n:4d} | {lines[n - 1]}" for n in shown_numbers)


class BuildStats:
    """Counts and seconds per build kind: 'source' (compiled), 'disk' (binary loaded), 'memory'."""

    def __init__(self) -> None:
        self.counts = {"source": 0, "disk": 0, "memory": 0}
        self.seconds = {"source": 0.0, "disk": 0.0, "memory": 0.0}

    def add(self, kind: str, seconds: float) -> None:
        self.counts[kind] += 1
        self.seconds[kind] += seconds


build_stats = BuildStats()

# Called as listener(device, program name, seconds) after each program built from source (not found in netcl's
# disk cache; found in the driver's own, where it keeps one, it took little time): the `netcl` command says
# once that a first run is building its kernels.
source_build_listeners: list[Callable[[Any, str, float], None]] = []


class Program:
    """A built program on one device, handing out thread-safe Kernel wrappers by name. `arg_names`
    maps each kernel to its argument names (from the compiler, kept with the binary on disk), so
    kernels can be launched with named arguments. `exact_grid` (a program of the user's own source,
    netcl.kernels.build): a launch without a local size runs exactly its global size, the driver choosing
    the work-group (OpenCL's meaning of a NULL local size), instead of netcl's work-group with the grid
    rounded up to it, which netcl's own kernels bound-check for."""

    def __init__(self, device: Any, program: cl.Program, name: str, source: str,
                 arg_names: dict[str, tuple[str, ...]] | None = None):
        self.device = device
        self.cl = program
        self.name = name
        self.source = source
        self.arg_names = arg_names or {}
        self.exact_grid = False
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()

    def kernel(self, kernel_name: str) -> Kernel:
        k = self._kernels.get(kernel_name)
        if k is not None:  # ops ask for their kernel on every launch: no lock once it is made
            return k
        with self._lock:
            k = self._kernels.get(kernel_name)
            if k is None:
                try:
                    k = Kernel(self, cl.Kernel(self.cl, kernel_name), self.arg_names.get(kernel_name))
                except cl.Error as exc:
                    raise KernelBuildError(
                        f"program {self.name} has no kernel {kernel_name!r}: {exc}"
                    ) from exc
                self._kernels[kernel_name] = k
            return k

    def __getattr__(self, kernel_name: str) -> Kernel:
        if kernel_name.startswith("_"):
            raise AttributeError(kernel_name)
        return self.kernel(kernel_name)


_build_locks: dict[tuple, threading.Lock] = {}
_build_locks_lock = threading.Lock()
# Programs are built with argument info, so kernels can be launched with named arguments
ARG_INFO = "-cl-kernel-arg-info"


def _device_fingerprint(device: Any) -> str:
    d = device.cl_device
    return "|".join([device.platform_name, device.platform.version, d.name, d.driver_version, d.version])


def disk_cache_enabled(device: Any) -> bool:
    """Whether netcl keeps `device`'s program binaries in its disk cache (NETCL_DISK_CACHE: 1, 0, or auto).
    auto: yes, except on PoCL while its own kernel cache is on (POCL_KERNEL_CACHE, on unless 0): PoCL keeps
    every program it builds and every work-group function it compiles there, so a second process building the
    same source finds it; asking PoCL for a binary (clGetProgramInfo(BINARIES)) makes it compile a generic
    work-group function of every kernel of the program besides the ones its launches compile (a first
    `netcl train` on a 2-core CPU: 22.7 s with netcl's copies, 13.4 s without; the second run 2.7 and 2.9 s:
    bench/NOTES.md, nineteenth session)."""
    setting = config.disk_cache_setting()
    return (not driver_keeps_programs(device)) if setting is None else setting


def driver_keeps_programs(device: Any) -> bool:
    """Whether `device`'s driver keeps the programs it builds in a cache of its own, where another process
    finds them: PoCL, unless POCL_KERNEL_CACHE=0."""
    pocl = "portable computing language" in str(getattr(device, "platform_name", "")).lower()
    return pocl and config.env("POCL_KERNEL_CACHE", "1").strip() != "0"


def _disk_path(device: Any, source: str, options: tuple[str, ...]) -> Path:
    h = hashlib.sha256()
    for part in (_device_fingerprint(device), source, "\0".join(options), cl.VERSION_TEXT):
        h.update(part.encode())
        h.update(b"\0")
    return config.cache_dir() / "programs" / f"{h.hexdigest()}.bin"


# seconds to wait before each further try of a build that raced the driver's cache (_driver_cache_race)
RACE_RETRY_WAITS = (0.5, 2.0)


def _build_from_source(device: Any, source: str, options: tuple[str, ...], name: str) -> cl.Program:
    for attempt in range(len(RACE_RETRY_WAITS) + 1):
        try:
            prg = cl.Program(device.context, source)
            with warnings.catch_warnings():  # compiler chatter is shown with NETCL_DEBUG=2, not warned
                warnings.simplefilter("ignore", cl.CompilerWarning)
                prg.build(options=list(options), devices=[device.cl_device])
            return prg
        except cl.Error as exc:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    log = prg.get_build_info(device.cl_device, cl.program_build_info.LOG)  # type: ignore[possibly-undefined]
            except Exception:
                log = str(exc)
            log = log.strip() or str(exc)
            if attempt < len(RACE_RETRY_WAITS) and _driver_cache_race(device, log):
                time.sleep(RACE_RETRY_WAITS[attempt])
                continue
            break
    lines = _offending_lines(log, source)
    msg = [f"OpenCL program {name} failed to build on {device.describe()}", f"options: {' '.join(options)}"]
    msg.append("build log:\n" + "\n".join(log.splitlines()[:40]))
    if "unknown target cpu" in log.lower():
        msg.append(f"The driver's compiler does not know this CPU: {CPU_DRIVER_HINT}.")
    if lines:
        msg.append("source:\n" + lines)
    raise KernelBuildError("\n".join(msg), log=log, source=source, options=options)


# what to do where PoCL's compiler does not know the CPU (a build's "unknown target CPU"; device.py's
# DeviceHandle.compiler_unusable)
CPU_DRIVER_HINT = ("install a PoCL whose LLVM knows this CPU, e.g. Debian's (`sudo apt-get install "
                   "pocl-opencl-icd`; netcl then finds it beside the pocl extra's), or name another device "
                   "with NETCL_DEVICE")


def _driver_cache_race(device: Any, log: str) -> bool:
    """Whether a failed build looks like PoCL's kernel cache raced another process building the same program
    (pocl/pocl#1480: the ranks of `netcl run` on one machine with a cold cache): PoCL with its cache on and a
    log that names no diagnostic ("Device X failed to build the program" alone). Such a build is tried again
    after RACE_RETRY_WAITS; a real compile error has clang's "error:" lines and is not."""
    return driver_keeps_programs(device) and "error" not in log.lower()


def _build_from_binary(device: Any, binary: bytes, options: tuple[str, ...]) -> cl.Program | None:
    try:
        prg = cl.Program(device.context, [device.cl_device], [binary])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            prg.build(options=list(options), devices=[device.cl_device])
        return prg
    except (cl.Error, ValueError, TypeError):
        return None


def _read_arg_names(prg: cl.Program) -> dict[str, tuple[str, ...]]:
    """Kernel name -> argument names, as the compiler reports them (empty where it does not)."""
    out: dict[str, tuple[str, ...]] = {}
    try:
        kernels = prg.all_kernels()
    except cl.Error:
        return out
    for k in kernels:
        try:
            out[k.function_name] = tuple(
                k.get_arg_info(i, cl.kernel_arg_info.NAME) for i in range(k.num_args))
        except (cl.Error, AttributeError):
            pass
    return out


NVIDIA_DEFINE = "-DNC_NVIDIA"


def nvidia_define(device: Any) -> str | None:
    """The define every program built on an NVIDIA OpenCL device gets (None elsewhere): NC_NVIDIA set to
    the compute capability as major * 10 + minor (1 where the driver does not say), so kernels take
    NVIDIA's own paths (inline PTX) and the instructions of newer parts only where they exist
    (cvt.rn.f16x2.f32: 80 and later)."""
    caps = getattr(device, "capabilities", None)
    if caps is None or "cl_nv_compiler_options" not in getattr(caps, "extensions", ""):
        return None
    cc = getattr(caps, "nv_compute_capability", None)
    return f"{NVIDIA_DEFINE}={cc[0] * 10 + cc[1] if cc else 1}"


def _retargeted(device: Any, prg: cl.Program, options: tuple[str, ...], target: str, name: str) -> cl.Program:
    """`prg` rebuilt from its own PTX for `target` (netcl.core.ptx: sm_90a instructions behind its MARK)."""
    binary = prg.get_info(cl.program_info.BINARIES)[0]
    try:
        patched = ptx.retarget(bytes(binary).decode(), target, shared_align=1024)
    except (UnicodeDecodeError, ValueError) as exc:
        raise KernelBuildError(f"OpenCL program {name}: {target} needs NVIDIA's PTX binaries ({exc})"
                               ) from None
    out = cl.Program(device.context, [device.cl_device], [patched.encode()])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            out.build(options=list(options), devices=[device.cl_device])
    except cl.Error as exc:
        try:
            log = out.get_build_info(device.cl_device, cl.program_build_info.LOG).strip()
        except Exception:
            log = ""
        raise KernelBuildError(f"OpenCL program {name} rebuilt for {target} failed on {device.describe()}: "
                               f"{log or exc}", log=log, source=patched, options=options) from None
    return out


def _capped(device: Any, prg: cl.Program, options: tuple[str, ...], caps: dict[str, int], name: str
            ) -> cl.Program:
    """`prg` assembled again from its own PTX with `.maxnreg N` for each kernel of `caps`
    (netcl.core.ptx.cap_registers); `prg` as it was, with a warning, where the driver refuses that."""
    try:
        binary = bytes(prg.get_info(cl.program_info.BINARIES)[0]).decode()
        out = _build_from_binary(device, ptx.cap_registers(binary, caps).encode(), options)
        why = "the driver did not build the capped PTX"
    except (cl.Error, UnicodeDecodeError, ValueError) as exc:
        out, why = None, str(exc)
    if out is None:
        warnings.warn(f"OpenCL program {name}: its kernels' register caps {caps} were refused ({why}); built "
                      "without them", stacklevel=3)
        return prg
    return out


def build_program(
    device: Any, source: str, options: Sequence[str] = (CL_STD,), name: str = "<generated>",
    ptx_target: str | None = None, max_registers: Sequence[tuple[str, int]] = (),
) -> Program:
    """Build `source` for `device` (or load its binary from the disk cache). Not cached in memory:
    netcl.kernels is the one place that keeps built programs (and the way everyone gets one).
    `ptx_target` (NVIDIA only, e.g. "sm_90a"): rebuild the program from its PTX for that target
    (netcl.core.ptx); the disk cache keeps the rebuilt binary. `max_registers` (NVIDIA only; elsewhere not
    read): (kernel, N) pairs, each kernel assembled again from the PTX within N registers (`_capped`)."""
    options = tuple(options)
    if ARG_INFO not in options:
        options = options + (ARG_INFO,)
    nv = nvidia_define(device)
    if nv is not None and not any(o.startswith(NVIDIA_DEFINE) for o in options):
        options = options + (nv,)
    caps = dict(max_registers) if nv is not None else {}
    key_source = source if ptx_target is None else f"{source}\0ptx_target={ptx_target}"
    if caps:
        key_source = f"{key_source}\0max_registers={sorted(caps.items())}"
    path = _disk_path(device, key_source, options) if disk_cache_enabled(device) else None
    lock_key = (
        id(device),
        str(path) if path is not None else hashlib.sha256(source.encode()).hexdigest(),
        options,
    )
    with _build_locks_lock:
        lock = _build_locks.setdefault(lock_key, threading.Lock())
    with lock:
        t0 = time.perf_counter()
        prg = None
        kind = "source"
        arg_names: dict[str, tuple[str, ...]] = {}
        if path is not None and path.exists():
            prg = _build_from_binary(device, path.read_bytes(), options)
            if prg is not None:
                kind = "disk"
                try:
                    arg_names = {
                        k: tuple(v) for k, v in json.loads(path.with_suffix(".args").read_text()).items()
                    }
                except (OSError, ValueError, AttributeError):
                    arg_names = _read_arg_names(prg)
        if prg is None:
            prg = _build_from_source(device, source, options, name)
            for listener in list(source_build_listeners):
                listener(device, name, time.perf_counter() - t0)
            arg_names = _read_arg_names(prg)
            if ptx_target is not None:
                prg = _retargeted(device, prg, options, ptx_target, name)
            if caps:
                prg = _capped(device, prg, options, caps, name)
            if path is not None:
                try:
                    binaries = prg.get_info(cl.program_info.BINARIES)
                    if binaries and binaries[0]:
                        atomic_write(path.with_suffix(".args"), json.dumps(arg_names).encode(), durable=False)
                        atomic_write(path, bytes(binaries[0]), durable=False)
                except (cl.Error, OSError):
                    pass  # a cache that cannot be written only costs a rebuild next time
        build_stats.add(kind, time.perf_counter() - t0)
        if config.debug_level() >= 2:
            print(f"[netcl] built {name} ({kind}) options={' '.join(options)}\n{source}", file=sys.stderr)
        return Program(device, prg, name, source, arg_names)


# -- launching ---------------------------------------------------------------------------------
def round_up(n: int, multiple: int) -> int:
    return ((n + multiple - 1) // multiple) * multiple


# A CPU 2-D/3-D launch without a local size of at most this many work-items gets netcl's work-group (the
# GPUs' rule below), a larger one PoCL's pick. PoCL picks the largest divisors of the grid (the whole grid as
# one group up to 4,096 items) and compiles a work-group function for each local size it meets (0.05-0.4 s
# each), so without this every new small shape (a test's odd sizes, a last partial batch, a prompt's length)
# compiled one more; a large grid's shape recurs step after step, and there PoCL's larger groups stay.
CPU_PICKED_GRID = 1 << 16

_BY_VALUE = (np.generic, np.ndarray)  # arguments set from their bytes
_enqueue_kernel = cl.enqueue_nd_range_kernel

_INT_SCALARS = frozenset({np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64})


class Kernel:
    """A kernel of a built program. Launches are thread-safe (args are set under a lock). Arguments go
    by position or by name (`k(q, gsize, lsize, x=buf, n=np.int32(5))`, the kernel's own parameter
    names), never both in one call."""

    def __init__(self, program: Program, kernel: cl.Kernel, arg_names: tuple[str, ...] | None = None):
        self.program = program
        self.cl = kernel
        self.name = kernel.function_name
        self.arg_names: tuple[str, ...] = tuple(arg_names or ())
        self.arg_index = {n: i for i, n in enumerate(self.arg_names)}
        self.num_args = int(kernel.num_args)
        self._lock = threading.Lock()
        self._max_wg: int | None = None
        self._last_args: list[Any] | None = None
        self._sizes: dict[tuple, tuple] = {}  # (global, local) asked -> (global rounded, local checked)
        self._debug = config.debug_level() >= 1  # NETCL_DEBUG is read when the program is built
        # pyopencl's setter of a by-value argument from raw bytes (set_arg on a pyopencl without it)
        self._set_raw = getattr(kernel, "_set_arg_buf", None) or (
            lambda i, raw: kernel.set_arg(i, np.frombuffer(raw, np.uint8)))

    @property
    def max_work_group_size(self) -> int:
        if self._max_wg is None:
            dev = self.program.device
            self._max_wg = int(
                self.cl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev.cl_device)
            )
        return self._max_wg

    def legal_local_size(self, global_size: Sequence[int], local_size: Sequence[int] | None) -> tuple | None:
        """Check (or, for 1-D launches without one, choose) a work-group size the device accepts."""
        caps = self.program.device.capabilities
        limit = min(self.max_work_group_size, caps.max_work_group_size)
        if local_size is None:
            if len(global_size) == 1:
                size = 1
                while size * 2 <= min(limit, 256):
                    size *= 2
                return (size,)
            if caps.kind == "cpu" and int(np.prod(global_size)) > CPU_PICKED_GRID:
                return None  # PoCL's own pick (it vectorises across the work-group)
            # 2-D/3-D grids whose first axis is the contiguous one: up to 64 work-items along it, then along
            # the second, 256 in all. NVIDIA's own pick for im2col's (positions, rows, images) grid ran it
            # ~6x slower (1.03 ms for 462 MB written on the H200). On a CPU for small grids only (see
            # CPU_PICKED_GRID): PoCL's pick depends on every odd shape.
            cap = min(limit, 256)
            lx = min(64, cap, 1 << max(0, (int(global_size[0]) - 1).bit_length()))
            ly = max(1, min(cap // lx, caps.max_work_item_sizes[1],
                            1 << max(0, (int(global_size[1]) - 1).bit_length())))
            return (lx, ly) + (1,) * (len(global_size) - 2)
        total = int(np.prod(local_size))
        if total > limit or any(size > most for size, most in zip(local_size, caps.max_work_item_sizes)):
            raise KernelLaunchError(
                f"work-group {tuple(local_size)} is too large for kernel {self.name} on "
                f"{self.program.device.describe()} (at most {limit} work-items, per dimension "
                f"{caps.max_work_item_sizes})"
            )
        return tuple(int(x) for x in local_size)

    def __call__(
        self,
        queue: Queue,
        global_size: Sequence[int],
        local_size: Sequence[int] | None,
        *args: Any,
        wait_for: Sequence[cl.Event] | None = None,
        **named: Any,
    ) -> cl.Event:
        """Enqueue on `queue`; global sizes are rounded up to multiples of the local size (netcl's pick
        where `local_size` is None, except in a program of the user's own source: Program.exact_grid), so a
        kernel must bound-check its own work-items. A grid with a zero size in a user's program runs nothing
        (OpenCL 2.1's rule: a loop of no iterations)."""
        try:
            device = queue.device
        except AttributeError:
            device = None
        if device is not self.program.device:
            if not hasattr(device, "describe"):  # not a netcl Queue; a DeviceHandle means its queue
                queue = as_queue(queue)
                device = queue.device
            if device is not self.program.device:
                raise DeviceError(
                    f"kernel {self.name} was built for {self.program.device.describe()} but launched on "
                    f"{device.describe()}"
                )
        if named:
            args = self.positional(args, named)
        elif len(args) != self.num_args:  # fewer would launch with the previous launch's values for the rest
            raise KernelLaunchError(
                f"kernel {self.name}({', '.join(self.arg_names)}) takes {self.num_args} arguments, got "
                f"{len(args)}"
            )
        global_size_asked = global_size
        global_size, local = self.geometry(global_size, local_size)
        if self.program.exact_grid and not all(global_size_asked):
            return cl.enqueue_marker(queue.cl)  # no work-items (geometry's grid has at least one)
        timed = profiling.active
        t0 = profiling.before(queue) if timed else None
        event = self._enqueue(queue, global_size, local, args, wait_for)
        if capture.open_recordings:
            for rec in capture.active():  # graph captures and ops' replay templates
                rec._record_launch(self, queue, global_size, local, args)
        next(profiling.launch_ticks)  # counts the launch (profile_hooks.launch_count)
        if timed or queue.profiling:
            profiling.launched(self, queue, event, t0)
        if self._debug:
            print(f"[netcl] launch {self.name} global={global_size} local={local}", file=sys.stderr)
        return event

    def geometry(self, global_size: Sequence[int], local_size: Sequence[int] | None) -> tuple[tuple, Any]:
        """(global size rounded up to the local size, local size checked or chosen) of a launch."""
        try:
            key = (tuple(global_size), None if local_size is None else tuple(local_size))
        except TypeError:  # not sequences: _check_sizes names them
            key = None
        sizes = self._sizes.get(key)
        if sizes is None:  # the same launch geometry recurs every step: checked once
            self._check_sizes(global_size, local_size)
            gs = tuple(int(max(1, g)) for g in global_size)
            local = None if local_size is None and self.program.exact_grid else \
                self.legal_local_size(gs, local_size)
            if local is not None:
                gs = tuple(round_up(g, size) for g, size in zip(gs, local))
            sizes = (gs, local)
            if len(self._sizes) < 4096:
                self._sizes[key] = sizes
        return sizes

    def _check_sizes(self, global_size: Any, local_size: Any) -> None:
        """KernelLaunchError for a grid that is not 1 to 3 sizes >= 0, or a work-group not as many >= 1."""
        for what, sizes, least in (("global size", global_size, 0), ("local size", local_size, 1)):
            if sizes is None and what == "local size":
                continue
            try:
                values = [operator.index(n) for n in sizes]
            except TypeError:
                values = []
            if not 1 <= len(values) <= 3 or min(values) < least:
                raise KernelLaunchError(
                    f"kernel {self.name}: the {what} is a tuple of 1 to 3 integers >= {least}, one per grid "
                    f"dimension ((n,) for n work-items), got {sizes!r}")
        if local_size is not None and len(local_size) != len(global_size):
            raise KernelLaunchError(f"kernel {self.name}: global size {tuple(global_size)} and local size "
                                    f"{tuple(local_size)} differ in their number of dimensions")

    def plan(self, global_size: Sequence[int], local_size: Sequence[int] | None, args: Sequence[Any],
             dynamic: Sequence[int]) -> Plan:
        """A Plan of this kernel: `args` fixed except at the positions `dynamic`, which each launch gives."""
        return Plan(self, global_size, local_size, args, dynamic)

    def plan_named(self, global_size: Sequence[int], local_size: Sequence[int] | None, static: dict[str, Any],
                   per_call: dict[str, Any]) -> Plan:
        """A Plan with the arguments named in `static` fixed and those named in `per_call` left open: samples
        (buffers, np.int64 offsets: a Python int given there at a launch becomes that type), listed in this
        kernel's argument order, which is the order `plan(queue, *values)` takes them in. For an op that keeps
        its plan under its own key (built once; a call then passes only its buffers and offsets)."""
        positions = [self.arg_index[n] for n in per_call]
        if positions != sorted(positions):
            raise KernelLaunchError(f"kernel {self.name}: per-call arguments {list(per_call)} are not in its "
                                    f"argument order ({', '.join(self.arg_names)})")
        return self.plan(global_size, local_size, self.positional((), {**static, **per_call}), positions)

    def planned(self, queue: Queue, global_size: Sequence[int], local_size: Sequence[int] | None,
                static: dict[str, Any], *, signature: Any = None, **dynamic: Any) -> cl.Event:
        """Launch with named arguments through the Plan of (this kernel, geometry, `static` values), kept in
        netcl.core.capture.plans: `static` holds the arguments fixed by the call's signature (sizes,
        strides, flags), `dynamic` those that change per call (buffers, offsets, per-step scalars).
        `signature`: a hashable of plain Python values that determines `static` (the op's sizes and flags),
        the plan's key in place of the static values' bytes (cheaper to make and hash each launch)."""
        key = ("kernel", self, tuple(global_size), None if local_size is None else tuple(local_size),
               tuple([(n, v.tobytes() if isinstance(v, np.generic) else v) for n, v in static.items()])
               if signature is None else signature)
        plan = capture.plans.get(key)
        if plan is None:
            args = self.positional((), {**static, **dynamic})
            order = [self.arg_index[n] for n in dynamic]
            plan = capture.plans.put(key, (self.plan(global_size, local_size, args, sorted(order)),
                                           tuple(n for _, n in sorted(zip(order, dynamic)))))
        launch, names = plan
        if len(names) != len(dynamic):
            raise KernelLaunchError(f"kernel {self.name}: the dynamic arguments {sorted(dynamic)} differ "
                                    f"from those of its plan {sorted(names)}")
        return launch(queue, *[dynamic[n] for n in names])

    def positional(self, args: Sequence[Any], named: dict[str, Any]) -> tuple:
        """The argument tuple for `named` arguments (KernelLaunchError naming what is missing or unknown)."""
        if args:
            raise KernelLaunchError(f"kernel {self.name}: pass arguments by position or by name, not both")
        names = self.arg_names
        if not names:
            raise KernelLaunchError(f"kernel {self.name}: its argument names are unknown on "
                                    f"{self.program.device.describe()}; pass arguments by position")
        if len(named) == len(names):  # the usual case: every argument, each once (on the launch path)
            try:
                return tuple([named[n] for n in names])
            except KeyError:
                pass
        unknown = sorted(set(named) - set(self.arg_index))
        missing = [n for n in self.arg_names if n not in named]
        if unknown or missing:
            raise KernelLaunchError(f"kernel {self.name}({', '.join(self.arg_names)}): "
                                    + (f"unknown arguments {unknown}" if unknown else "")
                                    + ("; " if unknown and missing else "")
                                    + (f"missing arguments {missing}" if missing else ""))
        return tuple(named[n] for n in self.arg_names)

    def _set_args(self, args: Sequence[Any]) -> None:
        """Set the arguments. By-value ones (numpy scalars and vectors) go in as their bytes through
        pyopencl's raw-buffer setter, and are skipped when their bytes equal this kernel's previous
        launch (bitwise: -0.0 is not taken for 0.0). pyopencl's generic `set_arg` costs ~10 us per
        numpy scalar (it goes through the buffer protocol), the raw setter ~1 us: for a 25-argument
        GEMM launch that is 200 us against 25 on PoCL. Memory objects are always set (cheap; and no
        reference to them is kept, so a freed buffer is never held here nor mistaken for a new one
        at the same address)."""
        last = self._last_args
        if last is None or len(last) != 2 * len(args):
            last = self._last_args = [None] * (2 * len(args))  # per argument: (object, its bytes)
        set_arg, set_raw = self.cl.set_arg, self._set_raw
        scalar = (np.generic, np.ndarray)
        for i, a in enumerate(args):
            j = 2 * i
            if type(a) is cl.Buffer:  # most arguments: set every time, nothing kept (see above)
                set_arg(i, a)
                last[j] = last[j + 1] = None
                continue
            prev = last[j]
            if a is prev and a is not None:  # the very object set last time (cached argument tuples)
                continue
            if type(a) is type(prev) and type(a) in _INT_SCALARS and a == prev:  # equal ints are equal bits
                last[j] = a
                continue
            if isinstance(a, scalar):
                raw = a.tobytes()
                if raw != last[j + 1]:
                    last[j + 1] = None  # not known to be set until the call below returns
                    set_raw(i, raw)
                    last[j + 1] = raw
                last[j] = a if isinstance(a, np.generic) else None  # arrays may be mutated in place
            else:
                set_arg(i, a)
                last[j] = last[j + 1] = None

    def _enqueue(self, queue, global_size, local, args, wait_for) -> cl.Event:
        for attempt in (0, 1):
            try:
                with self._lock:
                    try:
                        self._set_args(args)
                    except BaseException as exc:
                        self._last_args = None
                        if isinstance(exc, (cl.Error, TypeError, ValueError)):
                            raise self._refused_argument(args, exc) from None
                        raise
                    return _enqueue_kernel(queue.cl, self.cl, global_size, local, wait_for=wait_for)
            except cl.Error as exc:
                if is_oom(exc) and attempt == 0:
                    queue.device.pool.empty_cache()
                    continue
                raise self.launch_error(exc, queue, global_size, local) from None
        raise AssertionError("unreachable")

    def _refused_argument(self, args: Sequence[Any], exc: Exception) -> Exception:
        """The KernelLaunchError for arguments the driver refused (`exc`): each is set again alone to find
        the first one refused, named with its position, its name and the kernel's type for it where the
        program says them, and what was given."""
        if len(args) != self.cl.num_args:
            return KernelLaunchError(f"kernel {self.name} takes {self.cl.num_args} arguments, got "
                                     f"{len(args)}")
        for i, a in enumerate(args):
            try:
                if isinstance(a, np.generic):
                    self.cl.set_arg(i, np.frombuffer(a.tobytes(), np.uint8))
                else:
                    self.cl.set_arg(i, a)
            except (cl.Error, TypeError, ValueError) as refused:
                exc = refused
                break
        else:
            return KernelLaunchError(f"kernel {self.name}: its arguments were refused: {exc}")
        name = f" ({self.arg_names[i]})" if i < len(self.arg_names) else ""
        try:
            wanted = f", which the kernel declares {self.cl.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME)}"
        except (cl.Error, AttributeError):  # (programs built without argument information)
            wanted = ""
        given = type(a).__name__ + (f" {a!r}" if isinstance(a, (int, float, np.generic)) else "")
        return KernelLaunchError(
            f"kernel {self.name}: argument {i}{name} = {given}{wanted}, was refused ({exc}). A pointer "
            "argument takes a buffer (a Tensor's .buffer, its .offset passed on its own where the kernel "
            "takes one), a by-value one a NumPy scalar of its C type (np.int32 for int, np.int64 for long, "
            "np.uint32 for uint, np.float32 for float), or a pyopencl vector (pyopencl.cltypes) for int4 etc."
        )

    def launch_error(self, exc: cl.Error, queue: Queue, global_size: Any, local: Any) -> Exception:
        """The netcl exception for a failed enqueue of this kernel."""
        if is_oom(exc):
            return OutOfMemoryError(
                f"launching {self.name} on {queue.device.describe()} ran out of device memory "
                f"({exc}); {queue.device.pool.describe_usage()}. Try a smaller batch, or free "
                f"tensors you no longer need.\n{queue.device.pool.summary()}"
            )
        return KernelLaunchError(
            f"launching {self.name} (global {global_size}, local {local}) on "
            f"{queue.device.describe()} failed: {exc}"
        )


class Plan:
    """One launch of a kernel with everything but a few arguments fixed: the kernel, its static arguments,
    the positions of the dynamic ones (buffers, offsets, by-value parameters that change from call to call)
    and the launch geometry. A plan owns an OpenCL kernel object of its own, so its static arguments are set
    once, when it is built, and a launch sets only its dynamic ones (skipping those equal to its previous
    launch) and enqueues: a GEMM of 25 arguments sets its 5-10 slot arguments instead of checking all 25.
    Configuration (NETCL_DEBUG's launch printing) is read when the plan is built. Ops keep their plans in
    `netcl.core.capture.plans`, one cache under one invalidation rule; a Recording's template (an op's
    replayed launches) is a list of plans.

    `plan(queue, *values)` launches with `values` at the dynamic positions, in order. Under a graph capture
    or a profile the launch is recorded and counted like any Kernel call (the recording keeps the shared
    Kernel and the whole argument list)."""

    __slots__ = ("kernel", "device", "global_size", "local", "args", "dynamic", "raw", "_set_raw", "_last",
                 "_kinds", "_lock", "_debug")

    def __init__(self, kernel: Kernel, global_size: Sequence[int], local_size: Sequence[int] | None,
                 args: Sequence[Any], dynamic: Sequence[int]):
        self.kernel = kernel
        self.device = kernel.program.device
        self.global_size, self.local = kernel.geometry(global_size, local_size)
        self.dynamic = tuple(dynamic)
        self.args = list(args)
        # the NumPy scalar type of each dynamic by-value argument (what a Python int given there becomes)
        self._kinds = tuple(type(args[i]) if isinstance(args[i], np.generic) else None for i in self.dynamic)
        for i in self.dynamic:
            self.args[i] = None  # a plan keeps no buffer of the call that built it alive
        try:
            self.raw = cl.Kernel(kernel.program.cl, kernel.name)
        except cl.Error as exc:
            raise KernelBuildError(
                f"program {kernel.program.name} has no kernel {kernel.name!r}: {exc}") from exc
        self._set_raw = getattr(self.raw, "_set_arg_buf", None) or (
            lambda i, raw: self.raw.set_arg(i, np.frombuffer(raw, np.uint8)))
        self._last: list[Any] = [None] * len(self.dynamic)
        self._lock = threading.Lock()
        self._debug = config.debug_level() >= 1
        fixed = set(self.dynamic)
        for i, a in enumerate(self.args):
            if i not in fixed:
                self._set(i, a)

    def _set(self, i: int, a: Any) -> None:
        try:
            if isinstance(a, (np.generic, np.ndarray)):
                self._set_raw(i, a.tobytes())
            else:
                self.raw.set_arg(i, a)
        except cl.Error as exc:
            raise KernelLaunchError(f"kernel {self.kernel.name}: argument {i} "
                                    f"({self.kernel.arg_names[i] if i < len(self.kernel.arg_names) else '?'})"
                                    f" = {type(a).__name__} was refused: {exc}") from None

    def __call__(self, queue: Queue, *values: Any) -> cl.Event:
        """Set the dynamic arguments (under the plan's lock): buffers always, by-value ones when their bytes
        differ from this plan's previous launch; then enqueue. A Python int or float at a position whose
        build-time value was a NumPy scalar is set as that scalar type (a slot's offset: np.int64; a
        hyperparameter: np.float32). A failed launch that ran out of memory is tried once more after
        emptying the pool's cache; anything else is the kernel's launch error. (One frame per launch: the
        argument loop is inlined here, not a method.)"""
        if queue.device is not self.device:
            raise DeviceError(f"kernel {self.kernel.name} was built for {self.device.describe()} but "
                              f"launched on {queue.device.describe()}")
        timed = profiling.active
        t0 = profiling.before(queue) if timed else None
        raw, kinds, set_raw = self.raw, self._kinds, self._set_raw
        for attempt in (0, 1):
            try:
                with self._lock:
                    last = self._last
                    j = 0
                    for i in self.dynamic:
                        a = values[j]
                        if type(a) is cl.Buffer:
                            raw.set_arg(i, a)
                        elif type(a) is int and kinds[j] is not None:  # an offset or size as a Python int: no
                            if a != last[j]:  # NumPy scalar made unless it changed (last: the int, or bytes)
                                last[j] = None
                                set_raw(i, kinds[j](a).tobytes())
                                last[j] = a
                        elif type(a) is float and kinds[j] is not None:  # a Python float: the same, but a
                            if a != last[j] or not a:  # zero is set every time and not remembered (-0.0 ==
                                last[j] = None  # 0.0 == 0, and their bits differ)
                                set_raw(i, kinds[j](a).tobytes())
                                last[j] = a if a else None
                        elif isinstance(a, _BY_VALUE):
                            data = a.tobytes()
                            if data != last[j]:
                                last[j] = None  # not known to be set until the call below returns
                                set_raw(i, data)
                                last[j] = data
                        else:  # a memory object: always set (no reference kept, see Kernel._set_args)
                            raw.set_arg(i, a)
                        j += 1
                    event = _enqueue_kernel(queue.cl, raw, self.global_size, self.local)
                break
            except cl.Error as exc:
                self._last = [None] * len(self.dynamic)
                if attempt or not is_oom(exc):
                    raise self.kernel.launch_error(exc, queue, self.global_size, self.local) from None
                queue.device.pool.empty_cache()
        if capture.open_recordings and capture.recording_now():
            args = self.arguments(values)
            for rec in capture.active():
                rec._record_launch(self.kernel, queue, self.global_size, self.local, args)
        next(profiling.launch_ticks)  # counts the launch (profile_hooks.launch_count)
        if timed or queue.profiling:
            profiling.launched(self.kernel, queue, event, t0)
        if self._debug:
            print(f"[netcl] launch {self.kernel.name} global={self.global_size} local={self.local} (plan)",
                  file=sys.stderr)
        return event

    def arguments(self, values: Sequence[Any]) -> list[Any]:
        """The whole argument list of a launch with `values` at the dynamic positions."""
        args = list(self.args)
        for i, kind, a in zip(self.dynamic, self._kinds, values):
            args[i] = kind(a) if (type(a) is int or type(a) is float) and kind is not None else a
        return args


def enqueue_copy(queue: Queue, dst: Any, src: Any, **kwargs: Any) -> cl.Event:
    """pyopencl.enqueue_copy with netcl's errors (out of memory retried once after emptying the cache).
    Under a graph capture, device-to-device copies are recorded; host transfers are refused."""
    for rec in capture.active():
        rec._record_copy(queue, dst, src, kwargs)  # a graph raises GraphCaptureError for host memory
    timed = profiling.active
    t0 = profiling.before(queue) if timed else None
    for attempt in (0, 1):
        try:
            event = cl.enqueue_copy(queue.cl, dst, src, **kwargs)
            if timed or queue.profiling:
                profiling.copied(queue, event, t0, dst, src, kwargs, cl)
            return event
        except cl.Error as exc:
            if is_oom(exc) and attempt == 0:
                queue.device.pool.empty_cache()
                continue
            if is_oom(exc):
                raise OutOfMemoryError(
                    f"a copy on {queue.device.describe()} ran out of device memory; "
                    f"{queue.device.pool.describe_usage()}"
                ) from None
            raise KernelLaunchError(f"a copy on {queue.device.describe()} failed: {exc}") from None
    raise AssertionError("unreachable")


def handoff(queue: Queue) -> cl.Event:
    """A marker after everything enqueued on `queue` so far, flushed, for another queue or thread to wait on.
    OpenCL lets a command wait on another queue's event only once that queue is flushed; NVIDIA's driver holds
    unflushed commands back, so without the flush the waiting side stalls until something else flushes (a
    DDP gradient copy waited for the end of backward)."""
    marker = cl.enqueue_marker(queue.cl)
    queue.cl.flush()
    return marker

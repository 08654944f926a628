"""Device discovery: the DeviceManager `manager`, DeviceHandle, and what each device can do."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl

from netcl import config
from netcl.core import variants
from netcl.core.backend import CPU_DRIVER_HINT, Queue
from netcl.core.memory import BufferPool
from netcl.core.profile_hooks import start_whole_program
from netcl.errors import DeviceError, NoPlatformError

_KIND_ORDER = ("gpu", "accelerator", "cpu")


def _device_kind(dev: cl.Device) -> str:
    t = dev.type
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.ACCELERATOR:
        return "accelerator"
    if t & cl.device_type.CPU:
        return "cpu"
    return "other"


def _query(fn, default):
    try:
        return fn()
    except (cl.Error, AttributeError, TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Capabilities:
    """What one OpenCL device offers, read once from the driver (and a probe kernel for fp16)."""

    kind: str
    opencl_version: str
    opencl_c_version: str
    driver_version: str
    fp16_extension: bool
    fp64: bool
    global_mem: int
    max_alloc: int
    local_mem: int
    local_mem_dedicated: bool
    compute_units: int
    max_clock_mhz: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    preferred_vector_width: dict[str, int]
    subgroup_sizes: tuple[int, ...]
    extensions: frozenset[str] = field(repr=False)
    # NVIDIA's compute capability (cl_nv_device_attribute_query), e.g. (9, 0) for an H100/H200; None elsewhere
    nv_compute_capability: tuple[int, int] | None = None
    # bytes of a kernel's arguments together (CL_DEVICE_MAX_PARAMETER_SIZE; 1024 is OpenCL's minimum)
    max_parameter_size: int = 1024

    @classmethod
    def read(cls, dev: cl.Device) -> Capabilities:
        exts = frozenset(dev.extensions.split())
        widths = {}
        for name in ("char", "short", "int", "long", "half", "float", "double"):
            widths[name] = int(_query(lambda n=name: getattr(dev, f"preferred_vector_width_{n}"), 0))
        subgroups: tuple[int, ...] = ()
        nv_cc = None
        if "cl_nv_device_attribute_query" in exts:
            major = int(_query(lambda: dev.compute_capability_major_nv, 0))
            nv_cc = (major, int(_query(lambda: dev.compute_capability_minor_nv, 0))) if major else None
        if "cl_intel_required_subgroup_size" in exts:
            subgroups = tuple(_query(lambda: dev.sub_group_sizes_intel, ()))
        elif "cl_nv_device_attribute_query" in exts:
            warp = _query(lambda: dev.warp_size_nv, 0)
            subgroups = (int(warp),) if warp else ()
        elif "cl_amd_device_attribute_query" in exts:
            wave = _query(lambda: dev.wavefront_width_amd, 0)
            subgroups = (int(wave),) if wave else ()
        return cls(
            kind=_device_kind(dev),
            opencl_version=dev.version,
            opencl_c_version=_query(lambda: dev.opencl_c_version, ""),
            driver_version=dev.driver_version,
            fp16_extension="cl_khr_fp16" in exts,
            fp64="cl_khr_fp64" in exts or bool(_query(lambda: dev.double_fp_config, 0)),
            global_mem=int(dev.global_mem_size),
            max_alloc=int(dev.max_mem_alloc_size),
            local_mem=int(dev.local_mem_size),
            local_mem_dedicated=dev.local_mem_type == cl.device_local_mem_type.LOCAL,
            compute_units=int(dev.max_compute_units),
            max_clock_mhz=int(_query(lambda: dev.max_clock_frequency, 0)),
            max_work_group_size=int(dev.max_work_group_size),
            max_work_item_sizes=tuple(int(x) for x in dev.max_work_item_sizes),
            preferred_vector_width=widths,
            subgroup_sizes=subgroups,
            extensions=exts,
            nv_compute_capability=nv_cc,
            max_parameter_size=int(_query(lambda: dev.max_parameter_size, 1024)),
        )


_FP16_PROBE = r"""
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
__kernel void probe(__global const half *a, __global half *out) {
    half x = a[0], y = a[1];
    out[0] = x * y + (half)0.5f;
    out[1] = x / y;
    out[2] = x - y;
}
"""


class DeviceHandle:
    """One OpenCL device: its context, default queue, buffer pool and capabilities.

    Handles are made by the manager, one per device, so every caller shares a context.
    """

    def __deepcopy__(self, memo: dict) -> DeviceHandle:
        """One handle per device: `copy.deepcopy` of what holds one keeps it."""
        return self

    def __init__(self, platform: cl.Platform, device: cl.Device, index: tuple[int, int]):
        self.platform = platform
        self.cl_device = device
        self.index = index
        self.capabilities = Capabilities.read(device)
        self._lock = threading.RLock()
        self._context: cl.Context | None = None
        self._queue = None
        self._pool = None
        self._fp16: bool | None = None
        self._unusable: str | None = None

    # -- identity -------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return self.cl_device.name.strip()

    @property
    def platform_name(self) -> str:
        return self.platform.name.strip()

    @property
    def backend(self) -> str:
        """Platform and OpenCL version, e.g. 'NVIDIA CUDA, OpenCL 3.0 CUDA 12.4'."""
        return f"{self.platform_name}, {self.capabilities.opencl_version.strip()}"

    @property
    def kind(self) -> str:
        return self.capabilities.kind

    @property
    def is_simulator(self) -> bool:
        """Oclgrind and the like: correct but very slow, so never picked unless named."""
        return "oclgrind" in self.platform_name.lower()

    @property
    def is_pocl_3_0(self) -> bool:
        """PyPI's PoCL 3.0 (LLVM 14) on a CPU, whose compiler is known to get some of the GPUs' kernels wrong
        (the gemv's RMSNorm prologue on half rows: variants.gemv_rms_miscompiled) or to abort on them."""
        return self.kind == "cpu" and self.capabilities.driver_version.startswith("3.0") and \
            "Portable" in str(self.platform_name)

    @property
    def compiler_unusable(self) -> str | None:
        """Why this device's compiler builds no program at all, else None: PoCL on a CPU its LLVM does not
        know names the CPU 'generic' (its version string's HSTR ends so), a target LLVM refuses ("unknown
        target CPU 'generic'", pocl/pocl#1049: PyPI's PoCL 3.0 with LLVM 14 on AMD's Zen 5). Only such a
        device is tried, with a one-line program; "auto" and the kinds pass over it."""
        if self._unusable is None:
            self._unusable = ""
            if "portable" in self.platform_name.lower() \
                    and self.capabilities.opencl_version.strip().endswith("-generic"):
                try:
                    cl.Program(self.context, "__kernel void k(__global int *x) { x[0] = 1; }").build()
                except cl.Error as exc:
                    if "unknown target cpu" in str(exc).lower():
                        self._unusable = (f"{self.describe()} builds no program: its compiler (PoCL "
                                          f"{self.capabilities.driver_version}) does not know this CPU "
                                          "(LLVM's 'unknown target CPU generic')")
        return self._unusable or None

    @property
    def spec(self) -> str:
        return f"{self.index[0]}:{self.index[1]}"

    def describe(self) -> str:
        return f"[{self.spec}] {self.device_name} ({self.kind}, {self.platform_name})"

    def __repr__(self) -> str:
        return f"DeviceHandle({self.describe()})"

    # -- lazily made OpenCL objects ---------------------------------------------------------
    @property
    def context(self) -> cl.Context:
        with self._lock:
            if self._context is None:
                try:
                    self._context = cl.Context([self.cl_device])
                except cl.Error as exc:
                    raise DeviceError(f"could not open a context on {self.describe()}: {exc}") from exc
            return self._context

    @property
    def queue(self):
        """The device's default command queue (a netcl Queue)."""
        with self._lock:
            if self._queue is None:
                self._queue = self.new_queue()
            return self._queue

    def new_queue(self, profiling: bool | None = None) -> Queue:
        """A new in-order command queue on this device (profiling follows NETCL_PROFILE by default)."""
        if profiling is None:
            profiling = config.profiling()
            if profiling:
                start_whole_program()  # NETCL_PROFILE set: the whole program, from its first queue on
        return Queue(self, profiling=profiling)

    @property
    def pool(self):
        """The BufferPool of this device's context."""
        pool = self._pool
        if pool is not None:  # every allocation asks: no lock once it exists
            return pool
        with self._lock:
            if self._pool is None:
                self._pool = BufferPool(self)
            return self._pool

    # -- capabilities that need a kernel -----------------------------------------------------
    @property
    def fp16(self) -> bool:
        """float16 arithmetic: cl_khr_fp16 is advertised *and* a probe kernel computes correctly."""
        if self._fp16 is None:
            self._fp16 = self.capabilities.fp16_extension and self._probe_fp16()
        return self._fp16

    @property
    def fp64(self) -> bool:
        return self.capabilities.fp64

    def _probe_fp16(self) -> bool:
        """Half arithmetic is code a CPU compiler can abort the process on (LLVM), so the probe kernel
        runs in a child process once per device; the verdict is kept with the kernel variants'."""
        if variants.in_probe_child():
            check_fp16_arithmetic(self)
            return True
        store = variants.verdicts(self)
        key = "fp16 arithmetic | probe kernel | " + variants.source_digest(_FP16_PROBE)[:16]
        verdict = store.get(key)
        if verdict is None:
            ok, reason = variants.run_probe(self, "netcl.core.device:check_fp16_arithmetic", ())
            store.put(key, ok, reason)
            return ok
        return bool(verdict["ok"])

    def synchronize(self) -> None:
        if self._queue is not None:
            self._queue.finish()


def check_fp16_arithmetic(device: DeviceHandle) -> None:
    """Run the fp16 probe kernel on `device`; raise unless it computes what NumPy's float16 does."""
    ctx = device.context
    prg = cl.Program(ctx, _FP16_PROBE).build()
    q = cl.CommandQueue(ctx, device.cl_device)
    a = np.array([1.5, 0.75], dtype=np.float16)
    mf = cl.mem_flags
    a_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    out = np.zeros(3, dtype=np.float16)
    out_buf = cl.Buffer(ctx, mf.WRITE_ONLY, out.nbytes)
    prg.probe(q, (1,), None, a_buf, out_buf)
    cl.enqueue_copy(q, out, out_buf)
    q.finish()
    want = np.array([1.5 * 0.75 + 0.5, 1.5 / 0.75, 0.75], dtype=np.float16)
    if not np.array_equal(out, want):
        raise AssertionError(f"fp16 arithmetic on {device.describe()} gave {out}, not {want}")


def no_platform_message() -> str:
    return (
        "no OpenCL platform was found on this machine. Install a driver: "
        "`pip install \"netcl[pocl]\"` gives a CPU device (PoCL) anywhere; "
        "a GPU needs its vendor's OpenCL driver (NVIDIA, AMD ROCm, Intel compute-runtime)."
    )


def _get_platforms() -> list[cl.Platform]:
    try:
        return list(cl.get_platforms())
    except cl.Error as exc:
        if "PLATFORM_NOT_FOUND" in str(exc) or getattr(exc, "code", None) == -1001:
            return []
        raise DeviceError(f"OpenCL platform discovery failed: {exc}") from exc


class DeviceManager:
    """Finds every OpenCL platform and device; picks the default one (see `default`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._handles: list[DeviceHandle] | None = None
        self._defaults: dict[str, DeviceHandle] = {}

    def devices(self) -> list[DeviceHandle]:
        """Every device of every platform, in platform order (index `P:D`)."""
        with self._lock:
            if self._handles is None:
                handles = []
                for p_index, platform in enumerate(_get_platforms()):
                    try:
                        devs = platform.get_devices()
                    except cl.Error:
                        devs = []
                    for d_index, dev in enumerate(devs):
                        handles.append(DeviceHandle(platform, dev, (p_index, d_index)))
                self._handles = handles
            return list(self._handles)

    def refresh(self) -> None:
        """Forget what was discovered (handles already given out keep working)."""
        with self._lock:
            self._handles = None
            self._defaults.clear()

    def _require_devices(self) -> list[DeviceHandle]:
        handles = self.devices()
        if not handles:
            raise NoPlatformError(no_platform_message())
        return handles

    def listing(self) -> str:
        return "\n".join("  " + h.describe() for h in self.devices()) or "  (none)"

    def get(self, spec: str) -> DeviceHandle:
        """The device named by `spec`: auto, gpu, cpu, accelerator, `P:D`, or a name fragment."""
        handles = self._require_devices()
        raw = spec.strip()
        key = raw.lower()
        real = [h for h in handles if not h.is_simulator] or handles
        if key == "auto" or key in _KIND_ORDER:
            passed = []   # devices whose compiler builds nothing (compiler_unusable)
            for kind in _KIND_ORDER if key == "auto" else (key,):
                for h in real:
                    if h.kind == kind:
                        if not h.compiler_unusable:
                            return h
                        passed.append(h.compiler_unusable)
            simulators = [h for h in handles if h.is_simulator]
            if passed and key == "auto" and simulators:   # correct, if slow, where nothing else compiles
                warnings.warn_explicit(
                    f"no device here compiles ({'; '.join(passed)}), so netcl runs on "
                    f"{simulators[0].describe()}: correct but very slow. To fix: {CPU_DRIVER_HINT}",
                    RuntimeWarning, filename="netcl", lineno=0, module="netcl.core.device")
                return simulators[0]
            if passed:
                raise DeviceError("no usable " + ("OpenCL" if key == "auto" else key) + " device: "
                                  + "; ".join(passed) + f". To fix: {CPU_DRIVER_HINT}. Devices here:\n"
                                  + self.listing())
            if key == "auto":
                return real[0]
            raise DeviceError(f"no {key} device is present; devices here:\n{self.listing()}")
        if ":" in key:
            parts = key.split(":")
            if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
                want = (int(parts[0]), int(parts[1]))
                for h in handles:
                    if h.index == want:
                        return h
                raise DeviceError(f"no device at index {raw}; devices here:\n{self.listing()}")
        for h in sorted(handles, key=lambda h: (h.is_simulator, bool(h.compiler_unusable))):  # usable first
            hay = f"{h.platform_name} {h.device_name} {h.cl_device.vendor}".lower()
            if key and key in hay:
                return h
        raise DeviceError(
            f"unknown device {raw!r} (from NETCL_DEVICE or the program). Use auto, gpu, cpu, "
            f"accelerator, P:D indices, or a name fragment. Devices here:\n{self.listing()}"
        )

    def default(self, kind: str = "auto") -> DeviceHandle:
        """The device programs use: NETCL_DEVICE when set, otherwise `kind`.

        "auto" prefers a GPU, then an accelerator, then the CPU; simulators (Oclgrind) only when named, or
        (with a warning) where no other device's compiler builds a program (compiler_unusable)."""
        spec = config.device_spec() or kind
        with self._lock:
            if spec not in self._defaults:
                self._defaults[spec] = self.get(spec)
            return self._defaults[spec]

    def handle_for(self, cl_device: Any) -> DeviceHandle:
        """The handle of a pyopencl Device (to adopt queues made outside netcl)."""
        for h in self.devices():
            if h.cl_device == cl_device:
                return h
        raise DeviceError(f"{cl_device!r} is not one of the devices netcl found:\n{self.listing()}")


manager = DeviceManager()

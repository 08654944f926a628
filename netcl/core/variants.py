"""Kernel variants a device's compiler may reject or crash on: tried best first, the risky ones probed
once per device in a child process, every rejection remembered on disk.

A kernel family (the CPU GEMM, say) lists its variants best first, each with a `build` that builds
it in this process and a `probe` for the risky ones. `first_usable(device, variants)` returns the
first variant the device can use:

- a variant whose build fails (a compile error, or a program that comes back without its kernels)
  is rejected;
- a risky variant (a construct some compiler aborts the whole process on, which no `except` can
  catch: an LLVM fatal error in PoCL's code generator, say) runs first in a child process, where its
  probe builds it, runs it on small problems and checks the results against NumPy; a crash, a
  timeout or a wrong result rejects it, and this process never builds it.

Each rejection is said once, as a `KernelVariantWarning` naming the device, the kernel, its options
and the reason, and kept in NETCL_CACHE_DIR/variants/, so later runs skip it without trying again
(`netcl devices` lists them; delete the file to judge again). A probe's pass is kept there too.
When no variant works, `first_usable` raises a KernelBuildError with every reason, the last build
log and what to install.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from netcl import config
from netcl.core.files import atomic_write
from netcl.errors import KernelBuildError, KernelVariantWarning

PROBE_ENV = "NETCL_VARIANT_PROBE"  # set in a probe's child process: build risky variants in-process
PROBE_TIMEOUT_S = 300.0


@dataclass
class Variant:
    """One way to build a kernel family on a device.

    family: the kernel ("gemm_cpu"); label: what tells this variant apart ("float32 VN=16");
    options: its build options, for messages; digest: a hash of its sources, so an edited kernel is
    judged again; build(): builds it in this process (raising KernelBuildError when it cannot) and
    returns what the caller needs; probe: ("package.module:function", args) for a risky variant,
    called in a child as function(device, *args), which raises when the variant misbehaves;
    probe_key: names the risky construct the probe judges, so variants that share it (tile sizes
    around the same vector width, say) share one probe; payload: the caller's own description."""

    family: str
    label: str
    options: tuple[str, ...]
    digest: str
    build: Callable[[], Any]
    probe: tuple[str, tuple] | None = None
    probe_key: str | None = None
    payload: Any = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return f"{self.family} | {self.label} | {self.digest[:16]}"


def source_digest(*parts: str) -> str:
    """A short hash of kernel sources and settings (a variant's `digest`)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def fingerprint(device: Any) -> str:
    """What identifies a device's compiler: platform, versions, device name and target (PoCL puts its
    LLVM target CPU in the device version)."""
    d = device.cl_device
    return "|".join([device.platform_name, device.platform.version, d.name, d.driver_version, d.version])


# -- verdicts ---------------------------------------------------------------------------------------
class Verdicts:
    """The verdicts of one device: key -> {"ok": bool, "reason": str, "when": str}, in memory and in
    NETCL_CACHE_DIR/variants/<device hash>.json. NETCL_DISK_CACHE=0 does not stop them: it is about program
    binaries, and without the file every process would run each probe again (a child process importing netcl
    and compiling its variant, ~3-5 CPU s on a CPU)."""

    def __init__(self, device: Any):
        self.device_text = device.describe()
        self.fingerprint = fingerprint(device)
        digest = hashlib.sha256(self.fingerprint.encode()).hexdigest()[:20]
        self.path = config.cache_dir() / "variants" / f"{digest}.json"
        self._memory: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _read_disk(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
            entries = data.get("verdicts", {}) if isinstance(data, dict) else {}
            return {k: v for k, v in entries.items() if isinstance(v, dict) and "ok" in v}
        except (OSError, ValueError):
            return {}  # missing or unreadable: judged again (a verdict is only a saving)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        found = self._read_disk().get(key)
        if found is not None:
            with self._lock:
                self._memory[key] = found
        return found

    def put(self, key: str, ok: bool, reason: str = "") -> None:
        entry = {"ok": bool(ok), "reason": reason, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        with self._lock:
            self._memory[key] = entry
        entries = self._read_disk()
        entries[key] = entry
        data = {"device": self.device_text, "fingerprint": self.fingerprint, "verdicts": entries}
        try:
            atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode(), durable=False)
        except OSError:
            pass  # unwritable cache: the verdict lives in this process only

    def rejected(self) -> dict[str, str]:
        """key -> reason of every rejected variant known for this device."""
        merged = {**self._read_disk(), **self._memory}
        return {k: v.get("reason", "") for k, v in sorted(merged.items()) if not v.get("ok")}


_verdicts: dict[tuple, Verdicts] = {}
_verdicts_lock = threading.Lock()


def verdicts(device: Any) -> Verdicts:
    """The verdict store of `device` (one per device and cache directory in this process)."""
    key = (id(device), str(config.cache_dir()))
    with _verdicts_lock:
        store = _verdicts.get(key)
        if store is None:
            store = _verdicts[key] = Verdicts(device)
        return store


def forget_memory() -> None:
    """Drop the in-memory verdicts (tests; disk verdicts stay)."""
    with _verdicts_lock:
        _verdicts.clear()


# -- probes in a child process -----------------------------------------------------------------------
def in_probe_child() -> bool:
    return config.in_variant_probe()


def _reason_from(stderr: str, returncode: int) -> str:
    """The line of a child's stderr that says what went wrong (an LLVM error, an exception), with
    how it ended."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    marked = [ln for ln in lines if "LLVM ERROR" in ln or "error" in ln.lower() or "Error" in ln]
    line = (marked or lines or ["(no output)"])[-1]
    if returncode < 0:
        return f"the probe process died of signal {-returncode} ({line})"
    if returncode in (134, 139):
        return f"the probe process aborted with exit {returncode} ({line})"
    return line


def run_probe(
    device: Any, function: str, args: Sequence[Any], timeout: float | None = None
) -> tuple[bool, str]:
    """Run function(device, *args) in a child process; (passed, reason). The child shares the driver's own
    kernel cache (PoCL's), so the program it built and ran is there for this process once it passes (a first
    `netcl train` 12.4-12.9 s against 13.3-14.5 when the child had a cache of its own: the CPU GEMM compiled
    twice): PoCL writes each entry under a temporary name and renames it, so a compiler that crashes leaves
    no entry of its program, and a variant whose results were wrong is never built here. netcl's own disk
    cache stays off in the child."""
    request = {"fingerprint": fingerprint(device), "function": function, "args": list(args)}
    env = {**os.environ, PROBE_ENV: "1", "NETCL_DISK_CACHE": "0"}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "netcl.core.probe", json.dumps(request)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    except OSError as exc:
        return False, f"the probe process could not start: {exc}"
    with _children_lock:
        _children.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout or PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False, f"the probe did not finish within {timeout or PROBE_TIMEOUT_S:.0f} s"
    finally:
        with _children_lock:
            _children.discard(proc)
    if proc.returncode == 0 and stdout.strip().endswith("probe ok"):
        return True, ""
    return False, _reason_from(stderr + stdout, proc.returncode)


# probe processes running now; one that start_probes began may still run when this process exits (a command
# that stopped early): it is ended then, unjudged, instead of computing on as an orphan
_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()


@atexit.register
def _end_children() -> None:
    with _children_lock:
        running = list(_children)
    for proc in running:
        try:
            proc.kill()
        except OSError:
            pass


# probes start_probes began: (verdict file, probe key) -> the Future of run_probe's (passed, reason)
_pending: dict[tuple[str, str], Future] = {}
_pending_lock = threading.Lock()


def start_probes(device: Any, variants: Sequence[Variant]) -> None:
    """Begin, in a background thread, the probe that first_usable(device, variants) would run first (that
    of the first variant not known to fail, when it is a risky one without a verdict), so that its child
    process runs while this process does other work (a command opening its device, loading data and
    building its other kernels); the first_usable that needs the verdict waits for it instead of starting
    its own. The thread keeps the verdict as first_usable does, whether or not anything asks for it."""
    if in_probe_child():
        return
    store = verdicts(device)
    for v in variants:
        verdict = store.get(v.key)
        if verdict is not None and not verdict["ok"]:
            continue
        key = v.probe_key or v.key
        if v.probe is None or store.get(key) is not None:
            return
        with _pending_lock:
            if (str(store.path), key) in _pending:
                return
            future: Future = Future()
            _pending[(str(store.path), key)] = future
        threading.Thread(target=_probe_into, args=(future, device, store, key, v.probe), daemon=True,
                         name="netcl-variant-probe").start()
        return


def _probe_into(future: Future, device: Any, store: Verdicts, key: str, probe: tuple) -> None:
    try:
        ok, reason = run_probe(device, probe[0], probe[1])
        store.put(key, ok, reason)
        future.set_result((ok, reason))
    except BaseException as exc:  # handed to whoever waits for it
        future.set_exception(exc)


def _take_pending(store: Verdicts, key: str) -> Future | None:
    """The probe `key` that start_probes began in this process, if any (taken: it is waited for once)."""
    with _pending_lock:
        return _pending.pop((str(store.path), key), None)


# -- choosing a variant ------------------------------------------------------------------------------
_warned: set[tuple[int, str]] = set()


def _advice(device: Any) -> str:
    if "portable computing language" in device.platform_name.lower():
        return ("This is the OpenCL C compiler of PoCL " + device.capabilities.driver_version + ". Another "
                "driver may build it: Debian's PoCL (`apt-get install pocl-opencl-icd`, PoCL 3.1 with "
                "LLVM 15), a newer `pip install -U pocl-binary-distribution`, or a GPU vendor's driver; "
                "pick it with NETCL_DEVICE (see `netcl devices`).")
    return ("This is the OpenCL C compiler of the driver " + device.capabilities.driver_version + "; "
            "a newer driver may build it, or pick another device with NETCL_DEVICE (see `netcl devices`).")


def first_usable(device: Any, variants: Sequence[Variant]) -> tuple[Variant, Any]:
    """(variant, what its build returned) for the first of `variants` that works on `device`."""
    if not variants:
        raise ValueError("first_usable needs at least one variant")
    store = verdicts(device)
    fresh: list[tuple[Variant, str]] = []  # rejected in this call (warned about below)
    tried: list[tuple[Variant, str]] = []
    last_log = ""
    for v in variants:
        verdict = store.get(v.key)
        if verdict is not None and not verdict["ok"]:
            tried.append((v, verdict.get("reason", "")))
            continue
        if v.probe is not None and not in_probe_child():
            probe_key = v.probe_key or v.key
            pending = _take_pending(store, probe_key)  # begun here: judged in this process, warned here
            probed = store.get(probe_key) if pending is None else None
            ran = probed is None
            if ran:
                if pending is not None:
                    ok, reason = pending.result()  # its thread kept the verdict
                else:
                    ok, reason = run_probe(device, v.probe[0], v.probe[1])
                    store.put(probe_key, ok, reason)
                probed = {"ok": ok, "reason": reason}
            if not probed["ok"]:
                reason = f"probe failed: {probed.get('reason', '')}"
                if ran:
                    fresh.append((v, reason))
                tried.append((v, reason))
                continue
        try:
            built = v.build()
        except KernelBuildError as exc:
            log = exc.log or str(exc)
            last_log = log
            reason = next((ln.strip() for ln in log.splitlines() if "error" in ln.lower()), "") or \
                str(exc).splitlines()[0]
            store.put(v.key, False, f"build failed: {reason}")
            fresh.append((v, f"build failed: {reason}"))
            tried.append((v, f"build failed: {reason}"))
            continue
        for bad, reason in fresh:
            _warn(device, bad, reason, v, store)
        return v, built
    for bad, reason in fresh:
        _warn(device, bad, reason, None, store)
    lines = [f"no variant of {variants[0].family} works on {device.describe()}; tried:"]
    lines += [f"  - {v.label} ({' '.join(v.options)}): {reason}" for v, reason in tried]
    if last_log:
        lines.append("last build log:\n" + "\n".join(last_log.strip().splitlines()[:30]))
    lines.append(_advice(device))
    raise KernelBuildError("\n".join(lines), log=last_log)


def _warn(device: Any, bad: Variant, reason: str, instead: Variant | None, store: Verdicts) -> None:
    token = (id(device), bad.key)
    if token in _warned:
        return
    _warned.add(token)
    then = f"using {instead.label} instead" if instead is not None else "and no other variant works"
    where = f"; remembered in {store.path} (delete it to try again)"
    # warn_explicit at "netcl:0": the message says everything; no source line of netcl's under it
    warnings.warn_explicit(
        f"kernel {bad.family} ({bad.label}; options {' '.join(bad.options)}) does not work on "
        f"{device.describe()}: {reason}; {then}{where}",
        KernelVariantWarning, filename="netcl", lineno=0, module="netcl.core.variants",
    )


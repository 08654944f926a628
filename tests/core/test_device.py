"""Device discovery, NETCL_DEVICE selection, capabilities, and the no-platform message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netcl.core import device as device_mod
from netcl.core.device import DeviceManager, manager
from netcl.errors import DeviceError, NoPlatformError


def test_auto_picks_a_device_with_a_queue(device):
    assert device.queue.device is device
    assert device.device_name
    assert device.capabilities.opencl_version in device.backend
    assert device.capabilities.global_mem >= device.capabilities.max_alloc > 0
    assert device.capabilities.compute_units >= 1
    assert device.capabilities.max_work_group_size >= 1


def test_auto_prefers_gpu_then_accelerator_then_cpu():
    kinds = [h.kind for h in manager.devices() if not h.is_simulator]
    want = next((k for k in ("gpu", "accelerator", "cpu") if k in kinds), kinds[0])
    assert manager.get("auto").kind == want


def test_same_handle_for_same_device(device):
    assert manager.get(device.spec) is device
    assert manager.get(device.kind) is manager.get(device.kind)


@pytest.mark.parametrize(
    "spec_of", [lambda h: h.spec, lambda h: h.kind, lambda h: h.device_name.split()[0].lower()]
)
def test_netcl_device_overrides_default(monkeypatch, device, spec_of):
    monkeypatch.setenv("NETCL_DEVICE", spec_of(device))
    fresh = DeviceManager()
    fresh._handles = manager.devices()
    assert fresh.default("gpu") is device  # the environment wins over the program's choice


def test_unknown_netcl_device_lists_what_exists(monkeypatch, device):
    monkeypatch.setenv("NETCL_DEVICE", "no-such-vendor-xyz")
    fresh = DeviceManager()
    fresh._handles = manager.devices()
    with pytest.raises(DeviceError) as err:
        fresh.default()
    msg = str(err.value)
    assert "no-such-vendor-xyz" in msg and device.device_name in msg and "P:D" in msg


def test_bad_index_and_missing_kind(device):
    with pytest.raises(DeviceError, match="no device at index 97:3"):
        manager.get("97:3")
    present = {h.kind for h in manager.devices() if not h.is_simulator}
    missing = next((k for k in ("gpu", "accelerator", "cpu") if k not in present), None)
    if missing is not None:
        with pytest.raises(DeviceError, match=f"no {missing} device"):
            manager.get(missing)


def test_no_platform_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(device_mod, "_get_platforms", lambda: [])
    with pytest.raises(NoPlatformError) as err:
        DeviceManager().default()
    assert "pocl" in str(err.value) and "driver" in str(err.value)


def test_fp16_flag_needs_extension_and_probe(device):
    if not device.capabilities.fp16_extension:
        assert device.fp16 is False
    else:
        assert device._probe_fp16() == device.fp16


def test_devices_cli_marks_default(device):
    out = subprocess.run(
        [sys.executable, "-m", "netcl.cli", "devices"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "<- default" in ln)
    assert device.device_name in line
    assert "fp64" in out.stdout and "largest allocation" in out.stdout


def test_devices_cli_without_platform(tmp_path):
    # A process whose platform discovery finds nothing prints the install hint, not an OpenCL code.
    code = (
        "import netcl.core.device as d; d._get_platforms = lambda: []; "
        "import sys; from netcl.cli import main; sys.exit(main(['devices']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "pocl" in out.stderr and "PLATFORM_NOT_FOUND" not in out.stderr


class _Handle:
    """A stand-in device for the selection rules: kind, simulator or not, and why its compiler fails."""

    def __init__(self, index, kind, unusable=None, simulator=False):
        self.index, self.kind, self.compiler_unusable, self.is_simulator = index, kind, unusable, simulator
        self.spec = f"{index[0]}:{index[1]}"

    def describe(self):
        return f"[{self.spec}] fake ({self.kind})"


def test_auto_and_kinds_pass_over_a_compiler_that_builds_nothing():
    """A CPU driver whose compiler does not know the CPU (PyPI's PoCL 3.0 on Zen 5: 'unknown target CPU
    generic') is passed over by auto and by kind for another one; where it is the only one, auto takes the
    Oclgrind simulator with a warning saying why and what to install (the kind, or no simulator, is an
    error saying so); named by index it is still given (its builds then say the same)."""
    broken = _Handle((1, 0), "cpu", unusable="[1:0] fake builds no program: unknown target CPU")
    fresh = DeviceManager()
    fresh._handles = [_Handle((0, 0), "gpu", simulator=True), broken, _Handle((2, 0), "cpu")]
    assert fresh.get("auto").index == (2, 0)
    assert fresh.get("cpu").index == (2, 0)
    assert fresh.get("1:0") is broken
    fresh._handles = fresh._handles[:2]   # the simulator and the broken CPU driver: auto takes the simulator
    words = r"no device here compiles .* unknown target CPU.*correct but very slow.*apt-get install pocl-"
    with pytest.warns(RuntimeWarning, match=words):
        assert fresh.get("auto").index == (0, 0)
    with pytest.raises(DeviceError, match=r"no usable cpu device: .* unknown target CPU.*apt-get install"):
        fresh.get("cpu")
    fresh._handles = fresh._handles[1:]   # no simulator either: an error
    with pytest.raises(DeviceError, match=r"no usable OpenCL device: .* unknown target CPU"):
        fresh.get("auto")


def test_compiler_unusable_only_where_pocl_says_generic():
    """Every device here: one that builds is never flagged, and a flagged one is a PoCL naming the CPU
    'generic' whose builds fail (on AMD's Zen 5 with PyPI's PoCL 3.0 next to Debian's, both cases)."""
    import pyopencl as cl

    for h in manager.devices():
        if h.is_simulator:
            continue
        reason = h.compiler_unusable
        try:
            cl.Program(h.context, "__kernel void k(__global int *x) { x[0] = 2; }").build()
            builds = True
        except cl.Error:
            builds = False
        assert (reason is None) == builds, (h.describe(), reason)
        if reason is not None:
            assert h.capabilities.opencl_version.strip().endswith("-generic")
            assert "unknown target CPU" in reason

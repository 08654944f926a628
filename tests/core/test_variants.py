"""Kernel variants a compiler rejects or crashes on: fallback, one warning, the remembered verdict, probes
in a child process (a crash there ends only the child), and the final error's text."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from netcl import kernels
from netcl.cli import main
from netcl.core import capture, variants
from netcl.core.backend import format_options
from netcl.core.tensor import Tensor
from netcl.errors import KernelBuildError, KernelVariantWarning
from netcl.ops.gemm import api
from netcl.ops.gemm import variants as gemm_variants
from netcl.ops.gemm.problem import _prepare

SOURCE = """
#ifndef WIDTH
#define WIDTH 1
#endif
#if WIDTH > 8
#error "WIDTH above 8 does not compile"
#endif
__kernel void fill(__global float *x) { x[get_global_id(0)] = (float)WIDTH; }
"""


@pytest.fixture(autouse=True)
def fresh_verdicts(tmp_path, monkeypatch):
    """Each test judges variants afresh, in its own cache directory."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NETCL_DISK_CACHE", raising=False)
    variants.forget_memory()
    monkeypatch.setattr(variants, "_warned", set())
    yield
    variants.forget_memory()


def fill_variant(device, width: int, builds: list, **kw) -> variants.Variant:
    options = format_options({"WIDTH": width})

    def build():
        builds.append(width)
        return kernels.build(device, SOURCE, "fill.cl", WIDTH=width).kernel("fill")

    return variants.Variant("fill", f"WIDTH={width}", options, variants.source_digest(SOURCE), build,
                            payload=width, **kw)


def run_fill(queue, kernel) -> np.ndarray:
    x = Tensor.zeros(queue, (4,))
    kernel(queue, (4,), (1,), x.buffer)  # no bound check in the kernel: an exact grid
    return x.to_host()


def test_a_variant_that_does_not_build_falls_back_once_warned_and_remembered(device, queue, tmp_path):
    builds: list[int] = []
    chain = [fill_variant(device, 16, builds), fill_variant(device, 4, builds)]
    with pytest.warns(KernelVariantWarning) as caught:
        chosen, kernel = variants.first_usable(device, chain)
    assert chosen.payload == 4 and builds == [16, 4]
    np.testing.assert_array_equal(run_fill(queue, kernel), [4, 4, 4, 4])
    assert len(caught) == 1
    text = str(caught[0].message)
    for words in ("kernel fill (WIDTH=16", "-DWIDTH=16", device.describe(), "WIDTH above 8 does not compile",
                  "using WIDTH=4 instead", str(tmp_path / "cache" / "variants")):
        assert words in text, words
    # the next process (memory forgotten) reads the verdict from disk: no second try, no second warning
    variants.forget_memory()
    builds.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelVariantWarning)
        chosen, _ = variants.first_usable(device, chain)
    assert chosen.payload == 4 and builds == [4]
    rejected = variants.verdicts(device).rejected()
    assert list(rejected) == [chain[0].key] and "WIDTH above 8" in rejected[chain[0].key]


def test_when_nothing_builds_the_error_names_device_log_and_what_to_install(device):
    builds: list[int] = []
    with pytest.warns(KernelVariantWarning), pytest.raises(KernelBuildError) as err:
        variants.first_usable(device, [fill_variant(device, 16, builds), fill_variant(device, 12, builds)])
    text = str(err.value)
    assert f"no variant of fill works on {device.describe()}; tried:" in text
    assert "- WIDTH=16 (" in text and "- WIDTH=12 (" in text
    assert "last build log:" in text and "WIDTH above 8 does not compile" in text
    assert "pick it with NETCL_DEVICE" in text or "pick another device with NETCL_DEVICE" in text
    if "Portable Computing Language" in device.platform_name:
        assert "apt-get install pocl-opencl-icd" in text


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """A module the probe child can import: probes that crash, misbehave or pass (counting their runs)."""
    (tmp_path / "netcl_test_probes.py").write_text(textwrap.dedent(f"""
        import os
        from pathlib import Path
        RUNS = Path({str(tmp_path / "runs")!r})

        def crash(device, *args):
            os.abort()  # what an LLVM fatal error does to the process

        def wrong(device, *args):
            raise AssertionError("gemm gave 3.0 where NumPy gives 2.0")

        def fine(device, width):
            with open(RUNS, "a") as f:
                f.write(f"{{width}}\\n")

        def slow(device, *args):
            Path(str(RUNS) + ".pid").write_text(str(os.getpid()))
            import time
            time.sleep(60)
    """))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    return tmp_path / "runs"


@pytest.mark.parametrize("probe,reason", [
    ("crash", "probe failed: the probe process died of signal 6"),
    ("wrong", "AssertionError: gemm gave 3.0 where NumPy gives 2.0"),
])
def test_a_risky_variant_is_probed_in_a_child_and_never_built_here(
    device, queue, probe_module, probe, reason
):
    builds: list[int] = []
    risky = fill_variant(
        device, 8, builds, probe=(f"netcl_test_probes:{probe}", ()), probe_key="fill | 8 wide"
    )
    with pytest.warns(KernelVariantWarning, match=reason.replace("(", r"\(").replace(")", r"\)")):
        chosen, kernel = variants.first_usable(device, [risky, fill_variant(device, 2, builds)])
    assert chosen.payload == 2 and builds == [2]  # the risky one never reached this process's compiler
    np.testing.assert_array_equal(run_fill(queue, kernel), [2, 2, 2, 2])
    assert variants.verdicts(device).get("fill | 8 wide")["ok"] is False


def test_a_probe_that_passes_runs_once_per_device_and_construct(device, probe_module):
    builds: list[int] = []
    first = fill_variant(device, 8, builds, probe=("netcl_test_probes:fine", (8,)), probe_key="fill | 8 wide")
    chosen, _ = variants.first_usable(device, [first])
    assert chosen.payload == 8 and builds == [8]
    assert probe_module.read_text().split() == ["8"]
    # another variant with the same risky construct, and a later process: the verdict is reused
    variants.forget_memory()
    other = fill_variant(device, 7, builds, probe=("netcl_test_probes:fine", (7,)), probe_key="fill | 8 wide")
    chosen, _ = variants.first_usable(device, [other])
    assert chosen.payload == 7 and probe_module.read_text().split() == ["8"]


def test_a_probe_started_early_runs_once_and_is_waited_for(device, probe_module, monkeypatch):
    """start_probes (a command opening its device) runs the first risky variant's probe in the background;
    first_usable then waits for it instead of probing again; the verdict is kept even when nothing asks."""
    builds: list[int] = []
    calls = []
    real = variants.run_probe
    monkeypatch.setattr(variants, "run_probe", lambda *a, **k: calls.append(a[1:]) or real(*a, **k))
    known_bad = fill_variant(device, 16, builds)
    variants.verdicts(device).put(known_bad.key, False, "build failed")  # skipped, as first_usable skips it
    risky = fill_variant(device, 8, builds, probe=("netcl_test_probes:fine", (8,)), probe_key="fill | 8 wide")
    variants.start_probes(device, [known_bad, risky])
    variants.start_probes(device, [known_bad, risky])  # already running: not a second one
    assert list(variants._pending) == [(str(variants.verdicts(device).path), "fill | 8 wide")]
    chosen, _ = variants.first_usable(device, [known_bad, risky])
    assert chosen.payload == 8 and builds == [8]
    assert calls == [("netcl_test_probes:fine", (8,))] and probe_module.read_text().split() == ["8"]
    assert variants._pending == {}
    # nothing asks: the thread keeps the verdict, the next process skips the probe
    other = fill_variant(device, 6, builds, probe=("netcl_test_probes:fine", (6,)), probe_key="fill | 6 wide")
    variants.start_probes(device, [other])
    future = variants._pending[(str(variants.verdicts(device).path), "fill | 6 wide")]
    assert future.result(timeout=120) == (True, "")
    variants.forget_memory()
    assert variants.verdicts(device).get("fill | 6 wide")["ok"] is True
    variants._pending.clear()
    # a device whose verdict is known, or a chain whose first usable variant is not risky: nothing starts
    variants.start_probes(device, [other])
    variants.start_probes(device, [fill_variant(device, 4, builds), other])
    assert variants._pending == {} and len(calls) == 2


def test_a_failed_probe_started_early_is_warned_once_when_it_is_used(device, queue, probe_module):
    """A background probe that failed, finished before the first GEMM asked: still one warning, in this
    process (the verdict alone would silence it)."""
    builds: list[int] = []
    risky = fill_variant(device, 8, builds, probe=("netcl_test_probes:wrong", ()), probe_key="fill | 8 wide")
    variants.start_probes(device, [risky])
    future = variants._pending[(str(variants.verdicts(device).path), "fill | 8 wide")]
    assert future.result(timeout=120)[0] is False
    assert variants.verdicts(device).get("fill | 8 wide")["ok"] is False  # kept before anything asked
    with pytest.warns(KernelVariantWarning, match="gemm gave 3.0 where NumPy gives 2.0"):
        chosen, _ = variants.first_usable(device, [risky, fill_variant(device, 2, builds)])
    assert chosen.payload == 2 and builds == [2] and variants._pending == {}


def test_a_background_probe_ends_with_its_process(probe_module, tmp_path):
    """A command that stops before its first GEMM (a bad flag after the device opened) leaves no probe child
    computing on: the probe start_probes began is ended at exit, unjudged."""
    pid_file = Path(f"{probe_module}.pid")
    code = textwrap.dedent(f"""
        import os, time
        from netcl.core import variants
        from netcl.core.device import manager
        v = variants.Variant("fill", "WIDTH=8", (), "digest", lambda: None,
                             probe=("netcl_test_probes:slow", ()), probe_key="fill | slow")
        variants.start_probes(manager.default(), [v])
        for _ in range(600):  # until the child runs, then exit
            if os.path.exists({str(pid_file)!r}):
                break
            time.sleep(0.1)
    """)
    env = {**os.environ, "NETCL_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
    pid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the probe child outlived the process that started it")
    verdicts = list((tmp_path / "cache").glob("variants/*.json"))
    assert all("fill | slow" not in f.read_text() for f in verdicts)  # unjudged: the next run probes again


def test_gemm_falls_back_from_a_tile_that_does_not_build(device, queue, monkeypatch):
    """The GEMM chain: a tuned tile this device cannot build (VN=3: the kernel's #error) gives way to the
    next of its chain, with one warning, and the result is still right."""
    real = gemm_variants.tuned_params
    monkeypatch.setattr(gemm_variants, "tuned_params",
                        lambda d, v, dt: {**real(d, v, dt), "VN": 3} if v == "cpu" else real(d, v, dt))
    monkeypatch.setattr(gemm_variants, "_usable", {})
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((70, 33)).astype(np.float32), rng.standard_normal((33, 45)).astype(np.float32)
    with pytest.warns(KernelVariantWarning, match=r"kernel gemm_cpu \(float32 .*VN=3.*VN must be 4, 8 or 16"):
        got = api.gemm(Tensor.from_host(queue, a), Tensor.from_host(queue, b), variant="cpu")
    np.testing.assert_allclose(got.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    # 8 floats
    assert (
        gemm_variants.usable_params(device, "cpu", np.float32)["VN"]
        == gemm_variants.CPU_SAFE_VECTOR_BYTES // 4
    )


def test_gemm_takes_the_direct_kernel_when_no_blocked_variant_builds(device, queue, monkeypatch):
    monkeypatch.setattr(gemm_variants, "variant_chain",
                        lambda variant, dt, requested, device=None: [{**requested, "VN": 3}])
    monkeypatch.setattr(gemm_variants, "tuned_params",
                        lambda d, v, dt: {**gemm_variants.default_params(v, dt), "BM": 24, "TY": 5})
    monkeypatch.setattr(gemm_variants, "_usable", {})
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((130, 70)).astype(np.float32), rng.standard_normal((70, 90)).astype(np.float32)
    with pytest.warns(KernelVariantWarning, match="and no other variant works"):
        got = api.matmul(Tensor.from_host(queue, a), Tensor.from_host(queue, b))
    np.testing.assert_allclose(got.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert api._auto_variant(_prepare(Tensor.from_host(queue, a), Tensor.from_host(queue, b), None, None,
                                      None, 1.0)) == "direct"


def test_explicit_tile_that_does_not_build_is_an_error_naming_it(device, queue):
    x = Tensor.zeros(queue, (40, 40))
    with pytest.warns(KernelVariantWarning), pytest.raises(KernelBuildError) as err:
        api.gemm(x, x, variant="cpu", params={"VN": 3})
    assert "no variant of gemm_cpu works on" in str(err.value) and "VN must be 4, 8 or 16" in str(err.value)


def test_netcl_devices_lists_rejected_variants(device, capsys):
    builds: list[int] = []
    with pytest.warns(KernelVariantWarning):
        variants.first_usable(device, [fill_variant(device, 16, builds), fill_variant(device, 4, builds)])
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "rejected    fill | WIDTH=16: build failed:" in out

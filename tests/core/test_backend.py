"""Program build and caches, build errors, launch legality, thread safety, profiling."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest

from netcl import kernels, profiling
from netcl.core import backend, capture, profile_hooks
from netcl.core.backend import Queue, as_queue
from netcl.core.tensor import Tensor
from netcl.errors import DeviceError, KernelBuildError, KernelLaunchError, OutOfMemoryError
from netcl.graph import Graph
from netcl.profiling import count_launches

SCALE = """
__kernel void scale(__global float *x, const float a, const int n) {
    int i = get_global_id(0);
    if (i < n) x[i] = x[i] * a + OFFSET;
}
"""


def test_defines_specialise_and_memory_cache_hits(device, queue):
    prg = kernels.build(device, SCALE, "scale", OFFSET="1.0f")
    again = kernels.build(device, SCALE, "scale", OFFSET="1.0f")
    other = kernels.build(device, SCALE, "scale", OFFSET="2.0f")
    assert prg is again and prg is not other
    x = Tensor.from_host(queue, np.arange(37, dtype=np.float32))
    other.scale(queue, (37,), None, x.buffer, np.float32(3.0), np.int32(37))
    np.testing.assert_array_equal(x.to_host(), np.arange(37, dtype=np.float32) * 3 + 2)


def test_disk_cache_serves_a_second_process(tmp_path):
    src = SCALE.replace("scale", "scale_" + uuid.uuid4().hex[:8])
    code = f"""
import sys, numpy as np
from netcl.core.device import manager
from netcl import kernels
from netcl.core.backend import build_stats
d = manager.default()
kernels.build(d, {src!r}, OFFSET="0.0f")
print(build_stats.counts["source"], build_stats.counts["disk"])
"""
    # netcl's disk cache on, whatever the driver (the default leaves it off on PoCL)
    env = {"NETCL_CACHE_DIR": str(tmp_path), "NETCL_DISK_CACHE": "1", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    second = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split() == ["1", "0"]
    assert second.stdout.split() == ["0", "1"]
    assert list((tmp_path / "programs").glob("*.bin"))


@pytest.mark.parametrize("platform,setting,pocl_cache,want", [
    ("Portable Computing Language", None, None, False),  # auto: PoCL keeps its own
    ("Portable Computing Language", None, "0", True),  # ... unless its cache is off
    ("Portable Computing Language", "1", None, True),
    ("NVIDIA CUDA", None, None, True),
    ("NVIDIA CUDA", "off", None, False),
    ("Oclgrind", "auto", None, True),
])
def test_the_disk_cache_is_off_where_the_driver_keeps_its_own(monkeypatch, platform, setting, pocl_cache,
                                                              want):
    """NETCL_DISK_CACHE auto (the default): netcl keeps program binaries except on PoCL with its kernel cache
    on, which keeps every program and work-group function itself (asking it for a binary compiles every
    kernel of the program once more); 1 / 0 decide for every driver."""
    from types import SimpleNamespace

    for name, value in (("NETCL_DISK_CACHE", setting), ("POCL_KERNEL_CACHE", pocl_cache)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert backend.disk_cache_enabled(SimpleNamespace(platform_name=platform)) is want


def test_pocl_builds_write_no_binary_by_default(tmp_path, monkeypatch, device):
    """On PoCL the default writes nothing to netcl's cache (and a second build of the source in this process
    finds PoCL's); elsewhere the binary is there."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NETCL_DISK_CACHE", raising=False)
    monkeypatch.delenv("POCL_KERNEL_CACHE", raising=False)
    source = SCALE.replace("scale", "scale_" + uuid.uuid4().hex[:8]).replace("OFFSET", "1.0f")
    backend.build_program(device, source)
    written = list(tmp_path.glob("programs/*.bin"))
    assert bool(written) is (not backend.driver_keeps_programs(device))
    assert backend.driver_keeps_programs(device) is ("Portable" in device.platform_name)


def test_build_error_carries_log_and_offending_line(device):
    bad = "__kernel void broken(__global float *x) {\n    x[0] = 1.0f\n    undefined_fn(x);\n}\n"
    with pytest.raises(KernelBuildError) as err:
        kernels.build(device, bad, "broken.cl")
    e = err.value
    assert e.log and "broken.cl" in str(e)
    # line 2 is an error for every compiler; line 3 is an error for clang, a warning for NVIDIA's
    assert ">>    2 |     x[0] = 1.0f" in str(e) and "3 |     undefined_fn(x);" in str(e)
    assert e.source == bad


def test_a_build_that_raced_the_drivers_cache_is_tried_once_more(device, monkeypatch):
    """PoCL's kernel cache shared by processes building the same program at once can fail a build with no
    diagnostic (pocl/pocl#1480; CI's `netcl run` ranks on a cold cache): such a build is tried again (twice
    at most), a failure with the compiler's errors is not, and a third bare failure is reported."""
    real = backend.cl.Program
    calls = {"build": 0, "fail": 1}

    class Racing:
        def __init__(self, *args):
            self.prg = real(*args)

        def build(self, *args, **kwargs):
            calls["build"] += 1
            if calls["build"] <= calls["fail"]:
                raise backend.cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE")
            return self.prg.build(*args, **kwargs)

        def get_build_info(self, *args):
            return "Device pthread failed to build the program"

        def __getattr__(self, name):
            return getattr(self.prg, name)

    monkeypatch.setattr(backend.cl, "Program", Racing)
    monkeypatch.setattr(backend, "driver_keeps_programs", lambda device: True)
    monkeypatch.setattr(backend, "RACE_RETRY_WAITS", (0.0, 0.0))
    src = SCALE.replace("scale", "scale_" + uuid.uuid4().hex[:8]).replace("OFFSET", "0.5f")
    backend._build_from_source(device, src, (backend.CL_STD,), "racing.cl")
    assert calls["build"] == 2
    calls.update(build=0, fail=2)
    backend._build_from_source(device, src, (backend.CL_STD,), "racing.cl")
    assert calls["build"] == 3
    calls.update(build=0, fail=3)   # failing three times: reported
    with pytest.raises(KernelBuildError, match="racing.cl failed to build"):
        backend._build_from_source(device, src, (backend.CL_STD,), "racing.cl")
    assert calls["build"] == 3
    monkeypatch.setattr(Racing, "get_build_info", lambda self, *a: "<source>:2:5: error: expected ';'")
    calls.update(build=0, fail=1)   # a compile error: not tried again
    with pytest.raises(KernelBuildError, match="expected ';'"):
        backend._build_from_source(device, src, (backend.CL_STD,), "racing.cl")
    assert calls["build"] == 1
    monkeypatch.setattr(backend, "driver_keeps_programs", lambda device: False)
    monkeypatch.setattr(Racing, "get_build_info", lambda self, *a: "Device X failed to build the program")
    calls.update(build=0, fail=1)   # no driver cache to race: not tried again
    with pytest.raises(KernelBuildError):
        backend._build_from_source(device, src, (backend.CL_STD,), "racing.cl")
    assert calls["build"] == 1


def test_missing_kernel_name_and_file(device):
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    with pytest.raises(KernelBuildError, match="no kernel 'nope'"):
        prg.kernel("nope")
    with pytest.raises(KernelBuildError, match="no kernel file"):
        kernels.program(device, "does_not_exist.cl")


def test_illegal_local_size_is_refused(device, queue):
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    x = Tensor.zeros(queue, (8,))
    too_big = device.capabilities.max_work_group_size * 2
    with pytest.raises(KernelLaunchError, match="too large"):
        prg.scale(queue, (too_big,), (too_big,), x.buffer, np.float32(1), np.int32(8))


def test_global_size_rounds_up_to_local(device, queue):
    prg = kernels.build(device, SCALE, OFFSET="1.0f")
    x = Tensor.zeros(queue, (13,))
    prg.scale(queue, (13,), (8,), x.buffer, np.float32(1), np.int32(13))
    np.testing.assert_array_equal(x.to_host(), np.ones(13, np.float32))


def test_a_users_kernel_without_a_local_size_runs_exactly_its_grid(device, queue):
    """kernels.build's programs (Program.exact_grid): no work-item past the global size, as OpenCL's NULL
    local size means. With netcl's work-group and the grid rounded up, a user's kernel without a bound check
    wrote past a 4-element buffer, and PoCL's heap broke (a segfault in the next copy)."""
    prg = kernels.build(device, "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }")
    assert prg.exact_grid
    assert prg.kernel("twice").geometry((13,), None) == ((13,), None)
    assert prg.kernel("twice").geometry((13,), (8,)) == ((16,), (8,))  # a local size given: rounded up to it
    x = Tensor.from_host(queue, np.arange(20, dtype=np.float32))
    prg.twice(queue, (13,), None, x[:13].buffer)  # the view starts at offset 0: the first 13 elements
    np.testing.assert_array_equal(x.to_host(), np.r_[2 * np.arange(13), np.arange(13, 20)].astype(np.float32))


def test_a_users_zero_grid_runs_nothing(device, queue):
    """A grid with a zero size is a loop of no iterations (OpenCL 2.1's rule). Rounded up to one work-item, a
    user's kernel without a bound check wrote the element an empty view starts at (x[5:5] doubled x[5])."""
    prg = kernels.build(device, "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }")
    x = Tensor.from_host(queue, np.arange(10, dtype=np.float32))
    empty = x[5:5]
    for local in (None, (4,)):
        prg.twice(queue, (0,), local, empty.buffer)
        prg.twice(queue, (0, 3), None if local is None else (1, 1), empty.buffer)
    np.testing.assert_array_equal(x.to_host(), np.arange(10, dtype=np.float32))


def test_launch_geometry_and_arguments_are_checked_before_the_driver(device, queue):
    """Sizes the driver would turn into a raw error, a ZeroDivisionError or (negative ones, rounded up to 1) a
    launch of one work-item; and a positional launch with arguments missing, which ran with the previous
    launch's values for them."""
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    x = Tensor.ones(queue, (8,))
    args = (x.buffer, np.float32(2), np.int32(8))
    for global_size, local_size in [((-5,), None), (8, None), ((8, 1, 1, 1), None), ((8.0,), None),
                                    ((8,), (0,)), ((8,), 4)]:
        with pytest.raises(KernelLaunchError, match=r"is a tuple of 1 to 3 integers >= [01].*\(n,\) for n"):
            prg.scale(queue, global_size, local_size, *args)
    with pytest.raises(KernelLaunchError, match=r"global size \(8,\) and local size \(4, 1\) differ"):
        prg.scale(queue, (8,), (4, 1), *args)
    prg.scale(queue, (8,), None, *args)
    with pytest.raises(KernelLaunchError, match=r"scale\(x, a, n\) takes 3 arguments, got 1"):
        prg.scale(queue, (8,), None, x.buffer)
    prg.scale(device, (np.int64(8),), None, *args)  # a device means its queue, as as_queue reads it
    for not_a_queue in (None, queue.cl):
        with pytest.raises(DeviceError, match="expected a netcl Queue"):
            prg.scale(not_a_queue, (8,), None, *args)
    np.testing.assert_array_equal(x.to_host(), np.full(8, 4, np.float32))
    with pytest.raises(TypeError, match=r"first argument is the device.*got Queue \(a queue: its \.device\)"):
        kernels.build(queue, SCALE)
    with pytest.raises(TypeError, match="OpenCL C source text"):
        kernels.build(device, None)


def test_a_refused_argument_is_named_with_what_the_kernel_wants(device, queue):
    """pyopencl's INVALID_VALUE / INVALID_ARG_SIZE named neither the argument nor the type it needs."""
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    x = Tensor.zeros(queue, (8,))
    cases = [({"n": 8}, r"argument 2 \(n\) = int 8, which the kernel declares int, was refused"),
             ({"n": np.int64(8)}, r"argument 2 \(n\) = int64 .*declares int"),
             ({"a": 2.0}, r"argument 1 \(a\) = float 2\.0, which the kernel declares float"),
             ({"x": x}, r"argument 0 \(x\) = Tensor, which the kernel declares float\*")]
    for bad, words in cases:
        args = {"x": x.buffer, "a": np.float32(2), "n": np.int32(8), **bad}
        with pytest.raises(KernelLaunchError, match=words + r".*a Tensor's \.buffer.*np\.int32 for int"):
            prg.scale(queue, (8,), None, **args)
    prg.scale(queue, (8,), None, x=x.buffer, a=np.float32(2), n=np.int32(8))  # right after, it launches
    np.testing.assert_array_equal(x.to_host(), np.zeros(8, np.float32))
    typed = kernels.build(device, "__kernel void fill(__global T *x) { x[get_global_id(0)] = (T)3; }",
                          dtype=np.float32)  # program()'s dtype= (it was a build option 'numpy.float32')
    y = Tensor.zeros(queue, (4,))
    typed.fill(queue, (4,), None, y.buffer)
    np.testing.assert_array_equal(y.to_host(), np.full(4, 3.0, np.float32))


LOCAL_SIZES = """
__kernel void local_sizes(__global int *out, const int w, const int h) {
    const int x = get_global_id(0), y = get_global_id(1);
    if (x >= w || y >= h) return;
    out[y * w + x] = (int)(get_local_size(0) * 1000 + get_local_size(1));
}
"""


@pytest.mark.parametrize("shape", [(17, 9), (13, 5), (1, 300), (1024, 128)])
def test_small_2d_grids_get_netcls_work_group_and_large_cpu_ones_the_drivers(device, queue, shape):
    """PoCL compiles a work-group function for each local size it meets, and its own pick divides every odd
    grid, so netcl chooses the work-group of a small 2-D grid on a CPU as on a GPU (powers of two, up to 64
    along the first axis, 256 in all; the grid rounded up, the kernel bound-checks) and leaves a CPU's large
    grid (more than backend.CPU_PICKED_GRID work-items: its shape recurs step after step) to the driver."""
    prg = kernels.build(device, LOCAL_SIZES)
    prg.exact_grid = False  # netcl's own pick, as its ops' kernels get it (a user's program runs its grid)
    k = prg.kernel("local_sizes")
    w, h = shape
    netcls = (min(64, 1 << (w - 1).bit_length()),)
    netcls += (min(256 // netcls[0], 1 << (h - 1).bit_length()),)
    grid, local = k.geometry(shape, None)
    if device.capabilities.kind == "cpu" and w * h > backend.CPU_PICKED_GRID:
        assert (grid, local) == (shape, None)
    else:
        assert local == netcls and grid == tuple(-(-n // m) * m for n, m in zip(shape, netcls))
    out = Tensor.full(queue, (h, w), -1, dtype=np.int32)
    k(queue, shape, None, out.buffer, np.int32(w), np.int32(h))
    got = out.to_host()
    assert (got > 0).all()  # every work-item of the shape ran, none past it wrote
    if local is not None:
        assert (got == local[0] * 1000 + local[1]).all()


def test_launch_on_other_device_queue_is_refused(device):
    class Fake:
        pass

    other_device = Fake()
    other_device.describe = lambda: "[9:9] elsewhere"
    fake_queue = Fake()
    fake_queue.device = other_device
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    with pytest.raises(DeviceError, match="was built for"):
        prg.scale(fake_queue, (1,), None)


def test_raw_pyopencl_queue_is_refused(queue):
    with pytest.raises(DeviceError, match="netcl Queue"):
        as_queue(queue.cl)
    assert as_queue(queue.device) is queue


def test_threads_launch_on_one_device(device, queue):
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    n, threads, rounds = 1000, 4, 25
    tensors = [Tensor.ones(queue, (n,)) for _ in range(threads)]
    errors = []

    def work(t):
        try:
            for _ in range(rounds):
                prg.scale(queue, (n,), None, t.buffer, np.float32(1.5), np.int32(n))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in tensors]
    with count_launches() as c:
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    assert not errors
    assert c.count == threads * rounds
    for t in tensors:
        np.testing.assert_allclose(t.to_host(), np.full(n, 1.5**rounds, np.float32), rtol=1e-5)


def test_launch_count_is_exact_with_plans_replays_and_readers_in_threads(device, queue):
    # launches tick a lock-free counter; graph replays add theirs in one call; readers take a tick each
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    n, threads, rounds = 64, 3, 40
    t = Tensor.ones(queue, (n,))
    plan = prg.scale.plan((n,), None, (None, np.float32(1.0), np.int32(n)), (0,))
    reads: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def launch():
        try:
            for _ in range(rounds):
                plan(queue, t.buffer)
                profile_hooks.count_launch(2)  # as a graph replay of two launches counts them
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read():
        while not stop.is_set():
            reads.append(profiling.launch_count())

    reader = threading.Thread(target=read)
    pool = [threading.Thread(target=launch) for _ in range(threads)]
    with count_launches() as c:
        reader.start()
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        stop.set()
        reader.join()
    queue.finish()
    assert not errors
    assert c.count == threads * rounds * 3
    assert reads == sorted(reads) and len(reads) > 0


def test_profiling_table_counts_launches(device):
    q = Queue(device, profiling=True)
    prg = kernels.build(device, SCALE, OFFSET="0.0f")
    x = Tensor.ones(q, (64,))
    profiling.reset()
    for _ in range(3):
        prg.scale(q, (64,), None, x.buffer, np.float32(2), np.int32(64))
    rows = {name: (calls, total) for name, calls, total, _ in profiling.table()}
    assert rows["scale"][0] == 3 and rows["scale"][1] > 0
    assert "scale" in profiling.report(file=open("/dev/null", "w"))


def test_offending_lines_extraction():
    src = "a\nb\nc\nd\n"
    shown = backend._offending_lines("<source>:3:1: error: bad", src)
    assert ">>    3 | c" in shown and "2 | b" in shown
    pocl_style = backend._offending_lines("error: /tmp/x.cl:1:2: bad", src)
    assert ">>    1 | a" in pocl_style


def test_argument_reuse_keeps_the_sign_of_zero(device, queue):
    prg = kernels.build(device, SCALE, OFFSET="-0.0f")  # x + -0 keeps x's sign
    x = Tensor.ones(queue, (4,))
    prg.scale(queue, (4,), None, x.buffer, np.float32(0.0), np.int32(4))  # +0
    prg.scale(queue, (4,), None, x.buffer, np.float32(-0.0), np.int32(4))  # +0 * -0 = -0
    assert np.all(np.signbit(x.to_host()))
    y = Tensor.ones(queue, (4,))
    prg.scale(queue, (4,), None, y.buffer, np.float32(3.0), np.int32(4))
    prg.scale(queue, (4,), None, y.buffer, np.float32(3.0), np.int32(2))  # only the first two again
    np.testing.assert_array_equal(y.to_host(), np.array([9, 9, 3, 3], np.float32))


def test_plans_keep_their_own_static_arguments(device, queue, rng):
    """A Plan sets its static arguments once, on a kernel object of its own: two plans of one kernel with
    different static values, and direct launches of that kernel in between, each compute with their own
    values; a launch sets only the dynamic arguments (here the buffer), given in order."""
    prg = kernels.build(device, SCALE, "scale_plan", OFFSET="0.5f")
    times3 = prg.scale.plan((37,), None, (None, np.float32(3.0), np.int32(37)), (0,))
    times5 = prg.scale.plan((37,), None, (None, np.float32(5.0), np.int32(20)), (0,))
    want = rng.standard_normal(37).astype(np.float32)
    xs = [Tensor.from_host(queue, want) for _ in range(3)]
    with count_launches() as c:
        for _ in range(2):  # interleaved: the plans' arguments outlive a direct launch with others
            times3(queue, xs[0].buffer)
            prg.scale(queue, (37,), None, xs[1].buffer, np.float32(-2.0), np.int32(37))
            times5(queue, xs[2].buffer)
    assert c.count == 6
    w64 = want.astype(np.float64)
    np.testing.assert_allclose(xs[0].to_host(), (w64 * 3 + 0.5) * 3 + 0.5, rtol=1e-6)
    np.testing.assert_allclose(xs[1].to_host(), (w64 * -2 + 0.5) * -2 + 0.5, rtol=1e-6)
    part = (w64[:20] * 5 + 0.5) * 5 + 0.5
    np.testing.assert_allclose(xs[2].to_host(), np.concatenate([part, want[20:]]), rtol=1e-6)


def test_a_plan_with_a_dynamic_scalar_and_a_graph(device, queue, rng):
    """Dynamic by-value arguments take each launch's value (an equal one is not set again); a plan launched
    inside a graph capture is recorded with its whole argument list, and the replay is bit-equal."""
    prg = kernels.build(device, SCALE, "scale_plan", OFFSET="0.0f")
    plan = prg.scale.plan((37,), None, (None, None, np.int32(37)), (0, 1))
    a = rng.standard_normal(37).astype(np.float32)
    x = Tensor.from_host(queue, a)
    for factor in (2.0, 2.0, -3.0):
        plan(queue, x.buffer, np.float32(factor))
    np.testing.assert_array_equal(x.to_host(), a * np.float32(2.0) * np.float32(2.0) * np.float32(-3.0))
    y = Tensor.from_host(queue, a)
    graph = Graph()
    with graph.capture(queue):
        plan(queue, y.buffer, np.float32(1.5))
    assert graph.launches == 1
    graph.replay()
    np.testing.assert_array_equal(y.to_host(), a * np.float32(1.5) * np.float32(1.5))


def test_a_plan_takes_python_floats_at_a_numpy_scalar_position(device, queue, rng):
    """A Python float at a by-value position built with a NumPy scalar is set as that type, only when it
    changed; 0.0 and -0.0 compare equal but each is set with its own sign; NumPy scalars and Python floats
    mix; a graph records the launch with the NumPy scalar."""
    prg = kernels.build(device, SCALE, "scale_plan_float", OFFSET="(-0.0f)")  # -0.0 keeps a zero's sign
    plan = prg.scale.plan((37,), None, (None, np.float32(1.0), np.int32(37)), (0, 1))
    a = rng.standard_normal(37).astype(np.float32)
    for factor in (2.0, 2.0, 1e-3, np.float32(0.5), 0.5, 0.0, -0.0, -0.0, 0.0, float("nan"), 3, -0.0, 0,
                   -0.0):
        x = Tensor.from_host(queue, a)
        plan(queue, x.buffer, factor)
        got, want = x.to_host(), a * np.float32(factor) + np.float32(-0.0)
        np.testing.assert_array_equal(got, want)
        assert np.signbit(got).tolist() == np.signbit(want).tolist()
    y = Tensor.from_host(queue, a)
    graph = Graph()
    with graph.capture(queue):
        plan(queue, y.buffer, 1.5)
    graph.replay()
    np.testing.assert_array_equal(y.to_host(), a * np.float32(1.5) * np.float32(1.5))


def test_a_plan_launch_out_of_memory_is_retried_once_and_other_errors_are_launch_errors(device, queue, rng,
                                                                                           monkeypatch):
    """A plan's launch refused for memory empties the pool's cache and is tried once more, with every dynamic
    argument set again (the one that changed before the failure too); a second refusal is OutOfMemoryError,
    any other error the kernel's launch error."""
    import pyopencl as cl

    prg = kernels.build(device, SCALE, "scale_plan_retry", OFFSET="0.0f")
    plan = prg.scale.plan((37,), None, (None, np.float32(1.0), np.int32(37)), (0, 1))
    a = rng.standard_normal(37).astype(np.float32)
    real, calls, emptied = backend._enqueue_kernel, [], []
    refusals = [0]

    def enqueue(*args, **kwargs):
        calls.append(1)
        if refusals[0]:
            refusals[0] -= 1
            raise cl.MemoryError("clEnqueueNDRangeKernel failed: MEM_OBJECT_ALLOCATION_FAILURE")
        return real(*args, **kwargs)

    monkeypatch.setattr(backend, "_enqueue_kernel", enqueue)
    monkeypatch.setattr(device.pool, "empty_cache", lambda: emptied.append(1))
    x = Tensor.from_host(queue, a)
    plan(queue, x.buffer, 2.0)
    refusals[0] = 1
    y = Tensor.from_host(queue, a)
    plan(queue, y.buffer, 3.0)  # refused once, then launched
    assert len(calls) == 3 and len(emptied) == 1
    np.testing.assert_array_equal(x.to_host(), a * np.float32(2.0))
    np.testing.assert_array_equal(y.to_host(), a * np.float32(3.0))
    refusals[0] = 2
    with pytest.raises(OutOfMemoryError, match="launching scale"):
        plan(queue, y.buffer, 5.0)
    assert len(emptied) == 2
    z = Tensor.from_host(queue, a)
    plan(queue, z.buffer, 5.0)  # the failed launch left nothing half-remembered: 5.0 is set again
    np.testing.assert_array_equal(z.to_host(), a * np.float32(5.0))

    def refuse(*args, **kwargs):
        raise cl.LogicError("clEnqueueNDRangeKernel failed: INVALID_WORK_GROUP_SIZE")

    monkeypatch.setattr(backend, "_enqueue_kernel", refuse)
    with pytest.raises(KernelLaunchError, match="INVALID_WORK_GROUP_SIZE"):
        plan(queue, z.buffer, 7.0)
    assert len(emptied) == 2  # not a memory error: the cache is left alone


def test_planned_launches_share_one_plan_per_static_signature(device, queue, rng, monkeypatch):
    """Kernel.planned keeps one Plan per (kernel, geometry, static values) in capture.plans: a repeat with
    new buffers reuses it, another static value (-0.0 is not 0.0) gets its own, and each computes with its
    own values."""
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    prg = kernels.build(device, SCALE, "scale_planned", OFFSET="(-0.0f)")  # adding -0.0 keeps a zero's sign
    a = rng.standard_normal(37).astype(np.float32)
    for factor in (2.0, 2.0, 0.0, -0.0, 2.0):
        x = Tensor.from_host(queue, a)
        prg.scale.planned(queue, (37,), None, {"a": np.float32(factor), "n": np.int32(37)}, x=x.buffer)
        got, want = x.to_host(), a * np.float32(factor) + np.float32(-0.0)
        np.testing.assert_array_equal(got, want)
        assert np.signbit(got).tolist() == np.signbit(want).tolist()
    assert len(capture.plans) == 3  # 2.0, 0.0 and -0.0
    with pytest.raises(KernelLaunchError, match="dynamic arguments"):
        prg.scale.planned(queue, (37,), None, {"a": np.float32(2.0), "n": np.int32(37)}, x=x.buffer,
                          extra=x.buffer)

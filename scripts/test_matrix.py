#!/usr/bin/env python
"""Run the test suite once per OpenCL CPU driver of this machine, side by side, and print the matrix.

    .venv/bin/python scripts/test_matrix.py [pytest args ...]      (what `make test` runs)

A kernel that one compiler builds can abort another (PyPI's PoCL 3.0 with LLVM 14 and Debian's PoCL 3.1
with LLVM 15 differ, and each compiles for the CPU it finds), so every driver builds and runs every kernel
a CPU user can get. Three kinds of test are run by one driver only, to keep a cold run (every program built
from source, twice) short:

- tests marked `gpu_shaped`: the GPUs' kernels (tiled GEMM, matrix-unit GEMM emulated, work-group
  norms and reductions, the GPU flash attention) run on the CPU to check their index arithmetic, which
  does not depend on the compiler; a CPU device never chooses them. The system PoCL runs them, those of
  the run-once paths too (ONCE_GPU_SHAPED), built unoptimized (tests/conftest.py: PoCL builds them ~5x
  faster; the optimizer's work on kernels no CPU user gets tests nothing a user meets).
- ONCE: end-to-end and driver-independent tests (the docs' pages, the CLI's training runs, launches of
  several processes, Hugging Face files, autocast and the loss scaler): the kernels they build are built
  and checked by the unit tests on every driver (half ops and the scaler's: tests/amp/test_half_ops.py,
  tests/oclgrind/test_amp_oclgrind.py). PyPI's PoCL runs them.
- LAYERS: the layers above the kernels (autograd's attention and elementwise rules, tests/nn, tests/data,
  graphs, profiling, the k-means estimators against scikit-learn): the kernels they launch are netcl.ops'
  and the JIT's, which tests/ops (k-means': tests/ops/test_kmeans.py), tests/jit, tests/optim, tests/core,
  tests/amp/test_half_*.py and the autograd tests that build define sets of their own (losses, fused
  gradients) build and check on every driver. The system PoCL runs them (the k-means estimators since the
  twelfth session, to even the two configurations' time: PyPI's is the longer), and with them, for the
  same reason, run-once tests that build few kernels of their own (the public API's fuzz, the tokenizer,
  files, tuning records, bench/gemv.py's sweep, whose GEMV knob sets, int8 and SwiGLU
  tests/ops/test_gemm_gemv.py checks on every driver).

The GPU-shaped cases of tests/oclgrind (the GEMM kernels' GPU variants) run under Oclgrind only: the
Oclgrind configuration runs every one of them with the same value checks, plus bounds and races.

  pocl-pypi          PyPI's PoCL (the `pocl` extra) alone, less the gpu_shaped tests and LAYERS: the ICD
                     loader is pointed at an empty vendors folder, so no system driver is seen
  pocl-system        each system PoCL (an /etc/OpenCL/vendors/*.icd naming libpocl) alone, less ONCE
                     (the first runs LAYERS and the gpu_shaped tests; another skips them too)
  pocl-system@TARGET the kernel-heavy tests, less gpu_shaped, on that PoCL forced to another CPU target it
                     ships (POCL_KERNELLIB_NAME; PoCL 3.1+), for each of AVX-512 and AVX2 that this CPU
                     can run but PoCL would not pick itself: AVX2 code generation on an AVX-512 machine,
                     say. (PyPI's PoCL 3.0 cannot be forced: it always compiles for the CPU it finds.)

  oclgrind           scripts/oclgrind_check.py: tests/oclgrind under the Oclgrind simulator (out-of-bounds
                     accesses, data races, API misuse); --no-oclgrind leaves it out. The pytest arguments
                     given to this script are not passed to it.

With one PoCL only, it runs the whole suite; with none (a machine with a vendor driver only), the suite
runs once in the environment as is. PyPI's PoCL counts as none where its compiler builds no program (its
LLVM 14 does not know the CPU, as AMD's Zen 5): the matrix says so and leaves it out.

Configurations run two at a time (one per core on CI's machines; PoCL compiles on one thread), the
longest first, each writing its own log under $TMPDIR; every 30 s the script prints how far each running
one is (tests done / total, programs built), then each one's result with its wall and CPU seconds and, for
a failure, the end of its log. Exit status 1 if any configuration failed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDORS = Path("/etc/OpenCL/vendors")
# the tests that build and run every kernel family on small shapes (the forced-target runs)
KERNEL_TESTS = ["tests/oclgrind", "tests/ops/test_matmul.py", "tests/jit", "tests/optim"]
# driver-independent tests, run by one driver (see above)
ONCE = ["tests/docs", "tests/train", "tests/distributed", "tests/models", "tests/amp/test_amp.py",
        "tests/amp/test_train_amp.py", "tests/test_cli_errors.py", "tests/test_readme.py"]
# the run-once paths that hold gpu_shaped tests: the system PoCL that runs the gpu_shaped tests collects these
# and runs only those of them (matrix_progress's --gpu-shaped-only); tests/test_matrix_lists.py keeps it whole
ONCE_GPU_SHAPED = ["tests/models"]
# the layers above the kernels (autograd's rules, modules, the data pipeline, graphs, profiling, k-means): the
# kernels they launch are netcl.ops' and the JIT's, which the unit tests build and check on every driver. Not
# here: tests/autograd/test_{loss,grads,fused_grads,engine}.py and tests/test_pytorch_patterns.py, the only
# tests that build most of loss.cl's define sets, the GEMMs' ROWSUM_A and BIAS_ROWS epilogues,
# float64 direct convolution, 8-byte copies of one and two dimensions and clip_grad_norm_'s sums
# (scripts/build_report.py --only-in, on the two configurations' profiles)
LAYERS = ["tests/autograd/test_attention.py", "tests/autograd/test_elementwise.py", "tests/nn", "tests/data",
          "tests/test_graph.py", "tests/test_profiling.py",
          "tests/test_profiling_labels.py", "tests/test_seed_example.py",
          "tests/test_no_leak.py", "tests/test_config.py", "tests/test_gpu_target.py",
          "tests/test_bench_decode.py", "tests/cluster",
          # and run-once tests of few kernels of their own, here to even the two configurations' time (PyPI's
          # is the longer): the fuzz, the tokenizer, files, tuning records, bench/gemv.py's sweep
          "tests/fuzz", "tests/text", "tests/io", "tests/tune", "tests/test_bench_gemv.py"]
NOT_GPU_SHAPED = ["-m", "not gpu_shaped"]
# the GPU-shaped cases of tests/oclgrind run under Oclgrind (every one, its values checked as on PoCL, and
# its accesses and races too): on PoCL they would repeat it
NOT_OCLGRIND_GPU_SHAPED = ["-m", "not (gpu_shaped and oclgrind_case)"]
# seconds between two progress lines while configurations run
NOTE_EVERY = 30
# CPU seconds of each configuration from empty caches on CI's machine (the longest start first, so that the
# two at a time end close together); "@" stands for any forced target. Measured by `.ci/run` from empty caches
# on the 2-core AMD EPYC machine, twentieth session (505, 428, 104 and 72 CPU s before the fuzz, tokenizer,
# io, tune and gemv-sweep tests, ~25 s, moved from PyPI's configuration to the system PoCL's)
COLD_CPU_SECONDS = {"pocl-pypi": 480, "pocl-system": 455, "oclgrind": 105, "pocl-system@": 75}
# PoCL's x86-64 kernel-library variants and the CPU flags each needs, widest first
TARGETS = {"avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"), "avx2": ("avx2", "fma", "f16c")}


@dataclass
class Config:
    name: str
    what: str
    env: dict[str, str]
    tests: list[str] = field(default_factory=list)  # pytest arguments: paths, -m, --ignore
    script: str | None = None  # run this script of scripts/ (it passes what it does not know to pytest)
    log: Path | None = None
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # user + system of pytest and the processes it waited for
    returncode: int | None = None

    @property
    def stem(self) -> Path:
        assert self.log is not None
        return self.log.with_suffix("")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return set(m.group(1).split()) if m else set()


def system_pocls() -> list[Path]:
    if not VENDORS.is_dir():
        return []
    return sorted(p for p in VENDORS.glob("*.icd") if "pocl" in p.read_text(errors="replace").lower())


def pypi_pocl() -> bool:
    return importlib.util.find_spec("pocl_binary_distribution") is not None


def pypi_pocl_unusable(empty_vendors: Path) -> str | None:
    """Why PyPI's PoCL builds no program on this machine (its LLVM 14 does not know the CPU: AMD's Zen 5
    is 'unknown target CPU generic' to it; netcl.core.device's compiler_unusable), else None. Checked in a
    child process that sees that driver alone."""
    code = ("from netcl.core.device import manager\n"
            "print('\\n'.join(r for h in manager.devices()\n"
            "                 if (r := h.kind == 'cpu' and h.compiler_unusable)))")
    env = {**os.environ, "OCL_ICD_VENDORS": str(empty_vendors)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return out.stdout.strip() or None


def pocl_targets(icd: Path) -> list[str]:
    """Kernel-library targets the PoCL of `icd` ships and this CPU runs, except the widest (its own pick)."""
    flags = cpu_flags()
    runnable = [t for t, need in TARGETS.items() if all(f in flags for f in need)]
    lib_dirs = [Path("/usr/share/pocl"), Path("/usr/local/share/pocl")]
    shipped = [t for t in runnable if any(d.glob(f"kernel-*-{t}.bc") for d in lib_dirs if d.is_dir())]
    return shipped[1:] if shipped and shipped[0] == runnable[0] else []


def configurations(empty_vendors: Path, oclgrind: bool = True) -> list[Config]:
    base = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES")}
    # (NETCL_DISK_CACHE as the user has it: its default, auto, keeps no copy of PoCL's programs, which PoCL
    # caches itself; netcl.core.backend.disk_cache_enabled. The tests of netcl's disk cache turn it on.)
    configs = []
    systems = system_pocls()
    # PyPI's PoCL where its compiler builds anything here (on a CPU its LLVM 14 does not know, every build
    # fails: the system PoCL then runs its share too, and the matrix says why)
    pypi = pypi_pocl()
    if pypi and (unusable := pypi_pocl_unusable(empty_vendors)):
        print(f"PyPI's PoCL left out: {unusable}", flush=True)
        pypi = False
    split = pypi and bool(systems)  # two drivers: each runs its share of the run-once tests
    # the configuration that runs the gpu_shaped tests leaves the Oclgrind cases' to the Oclgrind one
    gpu_shaped = NOT_OCLGRIND_GPU_SHAPED if oclgrind else []
    if pypi:
        what = "PyPI's PoCL alone" + (", less gpu_shaped and LAYERS" if split else "")
        configs.append(Config("pocl-pypi", what, {**base, "OCL_ICD_VENDORS": str(empty_vendors)},
                              [*NOT_GPU_SHAPED, *(f"--ignore={p}" for p in LAYERS)] if split else gpu_shaped))
    for i, icd in enumerate(systems):
        suffix = "" if len(systems) == 1 else f"-{icd.stem}"
        once = ONCE + (LAYERS if i > 0 else [])  # another system PoCL runs neither LAYERS nor gpu_shaped
        shaped_once = ONCE_GPU_SHAPED if i == 0 and split else []
        tests = [f"--ignore={p}" for p in once if p not in shaped_once] if split else []
        tests += [f"--gpu-shaped-only={p}" for p in shaped_once]
        tests += NOT_GPU_SHAPED if i > 0 else gpu_shaped
        what = f"the system PoCL of {icd} alone" + (
            ", less ONCE but its gpu_shaped tests" if shaped_once else ", less ONCE" if split else "")
        what += (", less gpu_shaped" + (" and LAYERS" if split else "") if i > 0
                 else ", less the Oclgrind configuration's gpu_shaped cases" if oclgrind else "")
        configs.append(Config(f"pocl-system{suffix}", what, {**base, "OCL_ICD_VENDORS": str(icd)}, tests))
    for icd in systems:
        suffix = "" if len(systems) == 1 else f"-{icd.stem}"
        for target in pocl_targets(icd):
            configs.append(
                Config(
                    f"pocl-system{suffix}@{target}",
                    f"the kernel tests less gpu_shaped, system PoCL forced to {target}",
                    {**base, "OCL_ICD_VENDORS": str(icd), "POCL_KERNELLIB_NAME": target},
                    list(KERNEL_TESTS) + NOT_GPU_SHAPED,
                )
            )
    if not configs:
        configs.append(Config("default", "the OpenCL drivers as installed", dict(os.environ)))
    if oclgrind:
        configs.append(Config("oclgrind", "tests/oclgrind under the Oclgrind simulator: bounds, races, API",
                              dict(os.environ), script="oclgrind_check.py"))
    return sorted(configs, key=lambda c: -COLD_CPU_SECONDS.get(re.sub(r"@.*", "@", c.name), 0))


def progress(c: Config) -> str:
    """"412/1391 tests, 2 failed, 230 programs built (301 s)": what the matrix_progress plugin wrote last."""
    try:
        done, total, failed, builds, build_seconds = c.stem.with_suffix(".progress").read_text().split()
    except (OSError, ValueError):
        return f"{c.name} collecting"
    fails = f", {failed} failed" if failed != "0" else ""
    return f"{c.name} {done}/{total} tests{fails}, {builds} programs built ({float(build_seconds):.0f} s)"


def summary(c: Config) -> str:
    """pytest's closing line (or, where its verbosity drops it, the plugin's count), and the Oclgrind
    check's verdict where the log has one."""
    assert c.log is not None
    text = c.log.read_text(errors="replace") if c.log.exists() else ""
    closing = re.compile(r"\b\d+ (passed|failed|skipped|errors?)\b.* in [\d.]+s|no tests ran")
    lines = [ln.strip("= ") for ln in text.splitlines() if closing.search(ln)]
    if not lines:
        try:
            done, total, failed, *_ = c.stem.with_suffix(".progress").read_text().split()
            lines = [f"{done} of {total} tests run, {failed} failed"]
        except (OSError, ValueError):
            pass
    verdict = [ln.strip() for ln in text.splitlines() if ln.startswith("Oclgrind reported")]
    return "; ".join(lines[-1:] + verdict[-1:]) or "(no pytest summary: see the log)"


def main(argv: list[str]) -> int:
    oclgrind = "--no-oclgrind" not in argv
    argv = [a for a in argv if a != "--no-oclgrind"]
    logs = Path(tempfile.mkdtemp(prefix="netcl-test-matrix-"))
    empty = logs / "no-vendors"
    empty.mkdir()
    configs = configurations(empty, oclgrind)
    jobs = max(1, min(2, os.cpu_count() or 1))
    print(f"test matrix ({jobs} at a time, logs in {logs}):")
    for c in configs:
        print(f"  {c.name:<22} {c.what}")
    sys.stdout.flush()
    pending, running, done = list(configs), [], []
    t0 = last_note = time.time()
    while pending or running:
        while pending and len(running) < jobs:
            c = pending.pop(0)
            c.log = logs / f"{c.name.replace('@', '-at-')}.log"
            plugin = ["-p", "matrix_progress", f"--progress-file={c.stem.with_suffix('.progress')}",
                      f"--build-profile={c.stem.with_suffix('.jsonl')}"]
            if c.script is not None:  # the Oclgrind check: its own selection, not the user's pytest arguments
                cmd = [sys.executable, str(ROOT / "scripts" / c.script), "-q", *plugin]
            else:  # -q from pyproject
                cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *c.tests, *argv]
            c.started = time.time()
            env = {**c.env, "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT / "scripts"), c.env.get("PYTHONPATH", "")) if p)}
            with open(c.log, "w") as f:
                c.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
            running.append(c)
        time.sleep(1.0)
        for c in list(running):
            assert c.proc is not None
            pid, status, usage = os.wait4(c.proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            c.returncode = os.waitstatus_to_exitcode(status)
            c.proc.returncode = c.returncode
            c.seconds = time.time() - c.started
            c.cpu_seconds = usage.ru_utime + usage.ru_stime
            running.remove(c)
            done.append(c)
            state = "ok  " if c.returncode == 0 else "FAIL"
            print(f"{state} {c.name:<22} {summary(c)}  [{c.seconds:.0f} s, {c.cpu_seconds:.0f} s CPU]",
                  flush=True)
        if running and time.time() - last_note > NOTE_EVERY:
            last_note = time.time()
            print(f"  [{time.time() - t0:4.0f} s] " + "; ".join(progress(c) for c in running), flush=True)
    failed = [c for c in done if c.returncode != 0]
    for c in failed:
        tail = c.log.read_text(errors="replace").splitlines()[-80:]
        print(f"\n==== {c.name} ({c.what}) failed; the end of {c.log}:\n" + "\n".join(tail))
    print(f"\n{len(done) - len(failed)} of {len(done)} configurations passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""bench/launch_cost.py at a CPU smoke test's size: the per-call rows, one eager step's host figures with its
Python alone, the process's reference loop before and after, written to JSON; bad flags refused."""

from __future__ import annotations

import json

from tests.bench_script import run_bench


def _run(*args: str):
    return run_bench("launch_cost.py", *args)


def test_launch_cost_smoke(tmp_path):
    out = tmp_path / "launch_cost.json"
    proc = _run("--steps", "mlp", "--n", "5", "--repeat", "2", "--python-only", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "netcl Plan (5 buffers set, 20 fixed)" in result["per_call_us"]
    assert all(t > 0 for t in result["per_call_us"].values())
    mlp = result["eager_steps"]["mlp"]
    assert mlp["launches"] > 0 and mlp["host_us_per_launch"] > 0 and mlp["python_only_us_per_launch"] > 0
    assert len(result["python_reference_us"]) == 2 and all(t > 0 for t in result["python_reference_us"])
    assert "reference loop" in proc.stdout


def test_launch_cost_bad_flags():
    for args, message in ((("--steps", "none"), "unknown step 'none'"), (("--n", "0"), "at least 1"),
                          (("--repeat", "-1"), "at least 1")):
        proc = _run(*args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr[-2000:])

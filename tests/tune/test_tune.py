"""The tuning database, the generic tuner, `netcl tune`, and that tuned GEMM configs keep results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from netcl.cli import main as netcl_main
from netcl.core.tensor import Tensor
from netcl.errors import KernelBuildError
from netcl.ops.gemm import choose_variant, default_params, gemm, tuned_params
from netcl.tune import database_for, lookup, tune_family


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NETCL_TUNING", raising=False)
    return tmp_path


def test_database_round_trip_is_atomic(device, cache_dir):
    db = database_for(device)
    assert db.get("fam", "k") is None
    db.put("fam", "k", {"A": 1, "B": 2}, seconds=0.5)
    assert db.get("fam", "k") == {"A": 1, "B": 2}
    files = sorted(p.name for p in (cache_dir / "tuning").iterdir())
    assert files == [db.path.name]  # no temporary file left behind
    stored = json.loads(db.path.read_text())
    assert stored["entries"]["fam/k"]["measured"]["seconds"] == 0.5
    assert device.device_name in stored["device"]
    db.remove("fam")
    assert db.get("fam", "k") is None


def test_corrupt_database_reads_as_empty(device, cache_dir):
    db = database_for(device)
    db.path.parent.mkdir(parents=True, exist_ok=True)
    db.path.write_text("{ not json")
    assert lookup(device, "gemm_cpu", "float32") is None
    db.put("fam", "k", {"A": 3})  # and it can be overwritten
    assert lookup(device, "fam", "k") == {"A": 3}


def test_tune_family_keeps_fastest_and_skips_failures(device, cache_dir):
    cost = {1: 3.0, 2: 1.0, 3: 2.0}

    def bench(c):
        if c["X"] == 4:
            raise KernelBuildError("does not build")
        return cost[c["X"]]

    result = tune_family(device, "toy", "k", [{"X": 1}, {"X": 2}, {"X": 3}, {"X": 4}], bench)
    assert result.best == {"X": 2} and result.best_seconds == 1.0
    assert len(result.errors) == 1 and result.timings[-1][1] == float("inf")
    assert lookup(device, "toy", "k") == {"X": 2}


def test_tuned_gemm_config_is_used_and_changes_no_result(device, queue, cache_dir, monkeypatch):
    variant = choose_variant(device, 200, 200, 200)
    other = (
        {"MB": 30, "NB": 32, "KC": 48, "RM": 3, "VN": 8}
        if variant == "cpu"
        else {"BM": 64, "BN": 32, "BK": 8, "TX": 8, "TY": 8, "VW": 2, "PADA": 2, "PADB": 2}
    )
    assert other != default_params(variant, np.float32)
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((131, 77)).astype(np.float32), rng.standard_normal((77, 95)).astype(np.float32)
    A, B = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    before = gemm(A, B, variant=variant).to_host()
    database_for(device).put(f"gemm_{variant}", "float32", other)
    assert tuned_params(device, variant, np.float32) == {**default_params(variant, np.float32), **other}
    after = gemm(A, B, variant=variant).to_host()
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
    monkeypatch.setenv("NETCL_TUNING", "0")
    assert tuned_params(device, variant, np.float32) == default_params(variant, np.float32)


def test_netcl_tune_command(device, cache_dir, capsys):
    assert netcl_main(["tune", "--quick", "--size", "40", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "best" in out and "GFLOP/s" in out
    variant = "cpu" if device.capabilities.kind == "cpu" else "tiled"
    assert lookup(device, f"gemm_{variant}", "float32") is not None
    assert netcl_main(["tune", "--show"]) == 0
    assert f"gemm_{variant}/float32" in capsys.readouterr().out

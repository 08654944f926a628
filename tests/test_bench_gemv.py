"""bench/gemv.py --sweep at a CPU smoke test's size: every TinyLlama shape under each knob set, both weight
dtypes and row counts, checked against NumPy inside the script, timed, and written to JSON."""

from __future__ import annotations

import json

from tests.bench_script import run_bench


def test_gemv_sweep_smoke(tmp_path):
    out = tmp_path / "sweep.json"
    knobs = [{}, {"GEMV_WG": 8, "GEMV_ROWS": 4, "GEMV_COLS": 2, "GEMV_UNROLL": 3, "GEMV_STAGE": 1}]
    proc = run_bench("gemv.py", "--sweep", json.dumps(knobs), "--small", "--calls", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["copy_bandwidth"] > 0 and result["small"]
    rows = result["rows"]
    assert len(rows) == len(knobs) * 2 * 2 * 5
    assert {(r["weights"], r["m"]) for r in rows} == {(w, m) for w in ("bfloat16", "int8") for m in (1, 8)}
    assert {r["shape"] for r in rows} == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert all(r["seconds"] > 0 and r["gb_s"] > 0 for r in rows)
    glu = next(r for r in rows if r["shape"] == "gate_up" and r["weights"] == "bfloat16")
    assert glu["weight_bytes"] == 2 * glu["n"] * glu["k"] * 2  # gate and up rows, 2 bytes each
    assert rows[-1]["params"]["GEMV_COLS"] == 2
    assert "WG ROWS COLS UNROLL STAGE" in proc.stdout

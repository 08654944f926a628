"""bench/sampling.py at a CPU smoke test's size: each mode timed on both kinds of rows and its greedy tokens
checked against NumPy inside the script, the greedy sweep over every (GREEDY_WG, GREEDY_UNROLL), written to
JSON; bad flags refused."""

from __future__ import annotations

import json

from tests.bench_script import run_bench


def _run(*args: str):
    return run_bench("sampling.py", *args)


def test_sampling_bench_smoke(tmp_path):
    out = tmp_path / "sampling.json"
    proc = _run("--vocab", "300", "--rows", "1,3", "--dtypes", "float32", "--calls", "2", "--sweep",
                "--no-torch", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["vocab"] == 300 and result["floor_us"] > 0
    assert [(r["logits"], r["rows"], r["mode"]) for r in result["rows"]] == [
        (shape, rows, mode) for shape in ("normal", "zipf") for rows in (1, 3)
        for mode in ("greedy", "random T=0.8", "top-k 50, top-p 0.9")]
    assert all(r["us"] > 0 and r["torch_us"] is None for r in result["rows"])
    assert [r["checked"] for r in result["rows"] if r["mode"] == "greedy"] == [True] * 4
    sweep = result["sweep"]["float32"]
    assert [(r["wg"], r["unroll"]) for r in sweep] == [
        (wg, unroll) for wg in (128, 256, 512, 1024) for unroll in (1, 2, 4, 8, 16)]
    assert all(r["us"] > 0 for r in sweep)
    spread = result["sweep_split"]["float32"]
    assert [r["split_tokens"] for r in spread] == [0, 512, 1024, 2048, 4096]
    assert all(r["groups"] >= 1 and r["greedy"] > 0 and r["random T=0.8"] > 0 for r in spread)
    assert "greedy, float32, 1 row(s)" in proc.stdout


def test_sampling_bench_refuses_bad_flags():
    for args, words in ((("--rows", "a"), "comma-separated integers"), (("--dtypes", "int8"), "choose from"),
                        (("--vocab", "0"), ">= 1"), (("--logits", "flat"), "normal, zipf")):
        proc = _run(*args)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr[-500:])

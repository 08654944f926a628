"""bench/attention.py --switches at a CPU smoke test's size: a row per (case, switch set) beside the
default's, each with its error against the default's results (--mma-tiles as MMA_TILES's switch sets); a
switch that netcl.ops.attention does not have, or an object's switch given a number, refused before anything
runs."""

from __future__ import annotations

import json

from tests.bench_script import run_bench


def bench(*args: str):
    return run_bench("attention.py", "--b", "1", "--h", "2", "--s", "40", "--d", "32", "--dtype", "bfloat16",
                     "--no-decode", "--causal-only", "--repeat", "1", "--skip", "torch", *args)


def test_switch_rows(tmp_path):
    out = tmp_path / "attention.json"
    switches = [{"TILES_128": {"dkdv": 16}}, {"GPU_NATIVE_EXP": False, "WGMMA_128": []}]
    proc = bench("--switches", json.dumps(switches), "--mma-tiles", json.dumps([{"forward": {"BN": 32}}]),
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in json.loads(out.read_text())["rows"] if "switches" in r]
    assert [(r["case"], r["switches"]) for r in rows] == [
        (case, s) for case in ("forward causal", "fwd+bwd causal")
        for s in switches + [{"MMA_TILES": {"forward": {"BN": 32}}}]]
    assert all(r["seconds"] > 0 and r["rel_err_to_default"] < 1e-2 for r in rows)
    assert proc.stdout.count('switches {"TILES_128": {"dkdv": 16}}') == 2


def test_bad_switches_are_refused():
    for bad, says in (('[{"NO_SUCH": 1}]', "has no switch 'NO_SUCH'"),
                      ('[{"TILES_128": 3}]', "TILES_128: an object"),
                      ('{"TILES_128": {}}', "not a list of objects"), ("[{", "--switches / --mma-tiles")):
        proc = bench("--switches", bad)
        assert proc.returncode == 2 and says in proc.stderr, (bad, proc.stderr[-500:])

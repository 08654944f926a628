"""bench/decode.py and bench/random_llama.py at a CPU smoke test's size: the random directory loads into
transformers and netcl alike, and the benchmark's rows, memory and greedy agreement come out right."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.bench_script import ROOT, run_bench

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_random_llama_loads_into_transformers_and_netcl(queue, tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from random_llama import write_random_llama
    finally:
        sys.path.pop(0)
    from netcl.models import GPT

    cfg = write_random_llama(tmp_path, "tiny", "float32", seed=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    model = GPT.from_pretrained(tmp_path, queue)
    assert model.num_parameters() == sum(p.numel() for p in hf.parameters())
    assert model.config.n_kv_heads == cfg["num_key_value_heads"] == 1
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], (1, 9))
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    got = model(ids).value.to_host()
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_decode_bench_smoke(tmp_path):
    out = tmp_path / "decode.json"
    run = run_bench("decode.py", "--shape", "tiny", "--dtype", "float32", "--batches", "1,3", "--gen-tokens",
                    "6", "--prompt-tokens", "5", "--prefill-tokens", "24", "--repeats", "1", "--cache-dir",
                    str(tmp_path), "--out", str(out), "--trace")
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    names = [(r["name"].split(",")[0].split(" ")[0], r["batch"]) for r in result["rows"]]
    assert names == [("netcl", 1), ("PyTorch", 1), ("netcl", 3), ("PyTorch", 3)]
    assert all(r["tokens_per_s"] > 0 for r in result["rows"])
    # float32 on both sides: every greedy token the same, every row of the batch
    assert result["greedy_agreement"] == {"1": 6, "3": 6}
    mem = result["memory"]
    assert mem["weights"] + mem["kv_cache"] <= mem["pool_peak"] <= 2 * (mem["weights"] + mem["kv_cache"])
    assert result["prefill"]["tokens"] == 24
    # --trace: the whole-layer decode launch's phases where it ran (GPUs), else a line saying it did not
    trace = result["trace"]
    if trace is None:
        assert "no whole-layer decode launch ran" in run.stdout
    else:
        assert [p["phase"] for p in trace["phases"]] == ["q/k/v", "attention", "o", "gate/up", "down"]

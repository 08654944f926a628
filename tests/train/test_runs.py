"""train/runs.py: a Run keeps the checkpoint of its best evaluation beside the last one, stops after
--patience evaluations without improvement, and says both; the trainers' new flags refuse bad values in
one line."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from netcl.cli import main
from netcl.core.files import atomic_write
from netcl.errors import NetclError
from netcl.train import runs
from netcl.train.runs import BEST_FILE, CHECKPOINT_FILE, Metric, Run


def _run(tmp_path, metric, patience=None, **given):
    args = argparse.Namespace(resume=None, out=str(tmp_path / "run"), overwrite=given.get("overwrite", False),
                              no_progress=True, tensorboard=None, patience=patience)
    return Run(args, "lm", tmp_path / "runs" / "lm", metric)


def _evaluate(run, evaluations, where, value):
    """What a trainer does at an evaluation: the last checkpoint (here: bytes naming it), then evaluated()."""
    atomic_write(run.out / CHECKPOINT_FILE, f"state at {where}".encode())
    evaluations.append((where, value))
    return run.evaluated(evaluations)


@pytest.mark.parametrize("metric,values,best_after_each", [
    (Metric("validation loss", False), [3.0, 2.5, 2.7, 2.5, 2.4, 2.6], [0, 1, 1, 1, 4, 4]),
    (Metric("test accuracy", True), [0.5, 0.4, 0.7, 0.7, 0.9], [0, 0, 2, 2, 4]),
])
def test_the_best_checkpoint_is_the_last_one_of_the_best_evaluation(
    tmp_path, metric, values, best_after_each
):
    run = _run(tmp_path, metric)
    run.start()
    evaluations: list = []
    for i, (value, best) in enumerate(zip(values, best_after_each)):
        assert _evaluate(run, evaluations, f"step {i + 1}", value) is False  # no --patience: never stops
        # a tie is no improvement: the first of equal values stays the best
        assert (run.out / BEST_FILE).read_bytes() == f"state at step {best + 1}".encode()
        assert run.best == (f"step {best + 1}", values[best])
    assert run.written == [run.out / BEST_FILE]  # the trainer claims its last checkpoint itself
    # the best file is its own file: replacing the last checkpoint leaves it as it was
    atomic_write(run.out / CHECKPOINT_FILE, b"later")
    assert (run.out / BEST_FILE).read_bytes() == f"state at step {best_after_each[-1] + 1}".encode()


def test_patience_stops_after_n_evaluations_without_improvement(tmp_path, capsys):
    run = _run(tmp_path, Metric("validation loss", False), patience=2)
    run.start()
    evaluations: list = []
    stops = [_evaluate(run, evaluations, f"step {10 * (i + 1)}", v) for i, v in enumerate([1.0, 0.8, 0.9])]
    assert stops == [False, False, False]  # one evaluation without improvement: patience 2 goes on
    assert _evaluate(run, evaluations, "step 40", 0.8) is True  # an equal value is no improvement
    assert run.stopped_early == "step 40"
    out = capsys.readouterr().out
    assert (f"stopping early at step 40: the validation loss has not improved for 2 evaluations (--patience "
            f"2); the best, 0.8000 at step 20, is in {run.out / BEST_FILE}") in out
    metrics: dict = {"final": 0.8}
    run.finish(metrics)
    saved = json.loads((run.out / "metrics.json").read_text())
    assert saved == {"final": 0.8, "best": {"at": "step 20", "validation_loss": 0.8, "checkpoint": BEST_FILE},
                     "stopped_early_at": "step 40"}
    lines = capsys.readouterr().out.splitlines()
    assert f"{BEST_FILE}: the checkpoint of the best validation loss, 0.8000 at step 20" in lines
    assert [ln for ln in lines if ln.startswith("wrote ")] == [f"wrote {run.out / BEST_FILE}",
                                                             f"wrote {run.out / 'metrics.json'}"]


def test_patience_one_stops_at_the_first_evaluation_that_does_not_improve(tmp_path):
    run = _run(tmp_path, Metric("test accuracy", True), patience=1)
    run.start()
    evaluations: list = []
    assert [_evaluate(run, evaluations, f"epoch {i}", v) for i, v in enumerate([0.2, 0.3, 0.25], 1)] == \
        [False, False, True]
    assert run.best == ("epoch 2", 0.3) and run.stopped_early == "epoch 3"


def test_a_new_run_does_not_keep_an_earlier_runs_best_checkpoint(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / BEST_FILE).write_bytes(b"an earlier run's")
    (tmp_path / "run" / "metrics.json").write_text("{}")
    run = _run(tmp_path, Metric("validation loss", False), overwrite=True)
    run.start()
    assert not (run.out / BEST_FILE).exists()


def test_the_best_checkpoint_is_copied_where_hard_links_fail(tmp_path, monkeypatch):
    def no_links(*_):
        raise OSError("hard links not supported (injected)")

    monkeypatch.setattr(os, "link", no_links)
    run = _run(tmp_path, Metric("validation loss", False))
    run.start()
    evaluations: list = []
    _evaluate(run, evaluations, "step 1", 2.0)
    assert (run.out / BEST_FILE).read_bytes() == b"state at step 1"
    assert sorted(p.name for p in run.out.iterdir()) == [BEST_FILE, CHECKPOINT_FILE]  # no temporary left


def test_settings_of_a_resumed_run_are_kept():
    saved = {"lr": 0.1, "seed": 3}
    assert runs.merge_settings({"lr": ("--lr", None), "seed": ("--seed", 3), "dim": ("--dim", 8)}, saved) == \
        {"lr": 0.1, "seed": 3, "dim": 8}
    with pytest.raises(NetclError, match=r"--lr 0.2 differs from the resumed run's 0.1; a resumed run keeps"):
        runs.merge_settings({"lr": ("--lr", 0.2)}, saved)


@pytest.mark.parametrize("argv,words", [
    (["train", "--patience", "0"], "argument --patience: must be an integer >= 1, got 0"),
    (["train", "--patience", "two"], "argument --patience: expected an integer >= 1, got 'two'"),
    (["lm-train", "--patience", "-1"], "argument --patience: must be an integer >= 1, got -1"),
    (["lm-train", "--dropout", "1"], "argument --dropout: must be a finite number in [0, 1), got 1"),
    (["lm-train", "--dropout", "-0.1"], "argument --dropout: must be a finite number in [0, 1), got -0.1"),
    (["lm-train", "--dropout", "nan"], "argument --dropout: must be a finite number in [0, 1), got nan"),
    (["lm-train", "--dropout", "half"], "argument --dropout: expected a number, got 'half'"),
])
def test_bad_values_of_the_new_flags_are_one_line_errors(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_continue_schedule_stretches_and_says_so_once():
    """A resumed run asking for another length: the schedule's total changes and is refreshed, with one line
    saying which way; the same length changes nothing and says nothing."""
    class Schedule:
        def __init__(self):
            self.T_max, self.refreshed = 100, 0

        def refresh(self):
            self.refreshed += 1

    sched, lines = Schedule(), []
    runs.continue_schedule(sched, "T_max", 100, "2 epochs (100 steps)", lines.append)
    assert (sched.T_max, sched.refreshed, lines) == (100, 0, [])
    runs.continue_schedule(sched, "T_max", 60, "1 epoch (60 steps)", lines.append)
    assert (sched.T_max, sched.refreshed) == (60, 1)
    assert lines == ["the cosine schedule now spans 1 epoch (60 steps) (it spanned 100 steps): the learning "
                     "rate continues along the shorter schedule"]

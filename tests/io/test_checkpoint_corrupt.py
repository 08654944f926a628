"""Checkpoints whose metadata or tensors are not what save_checkpoint wrote, and truncated files:
each raises CheckpointError naming the file and the field, and leaves every object given to
load_checkpoint (model, optimizer, scheduler, loader, RNG) exactly as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from netcl import nn, optim
from netcl.data import DataLoader
from netcl.io import CheckpointError, atomic_write, load_checkpoint, read_checkpoint, save_checkpoint
from netcl.ops import random


def _model(queue):
    return nn.Sequential(nn.Linear(queue, 4, 5), nn.ReLU(), nn.Linear(queue, 5, 3))


def _objects(queue, seed, lr):
    """A model, a stepped Adam, a StepLR and a loader: what a training run checkpoints."""
    random.manual_seed(seed)
    model = _model(queue)
    opt = optim.Adam(model.parameters(), lr=lr)
    for p in model.parameters():
        p.grad = p.value.clone()
    opt.step()
    sched = optim.StepLR(opt, 2)
    sched.step()
    data = (np.zeros((8, 4), np.float32), np.zeros(8, np.int32))
    loader = DataLoader(data, 2, queue, shuffle=True, seed=seed)
    loader.set_epoch(seed)
    return model, opt, sched, loader


@pytest.fixture
def saved(queue, tmp_path):
    path = tmp_path / "c.safetensors"
    model, opt, sched, loader = _objects(queue, 1, 0.01)
    save_checkpoint(path, model, opt, sched, step=7, epoch=2, loader=loader, extra={"note": "x"})
    return path


def _contents(path):
    with safe_open(path, "np") as f:
        meta = json.loads(f.metadata()["netcl"])
    return meta, load_file(path)


def _snapshot(model, opt, sched, loader):
    return repr(
        (
            {k: v.to_host().tolist() for k, v in model.state_dict().items()},
            opt.state_dict(),
            sched.state_dict(),
            loader.state_dict(),
            random.default_generator.state_dict(),
        )
    )


def _set(path, value):
    """A mutation that sets the field at `path` ('optimizer.param_groups.0.lr') of the metadata."""

    def mutate(meta, tensors):
        *head, last = path.split(".")
        node = meta
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _drop(path):
    def mutate(meta, tensors):
        *head, last = path.split(".")
        node = meta
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]

    return mutate


def _tensor(name, value=None):
    """A mutation of the tensors: drop `name` (value None) or set it."""

    def mutate(meta, tensors):
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value

    return mutate


# (name, mutation of (meta, tensors), words the CheckpointError holds)
CORRUPT = [
    (
        "format-missing",
        _drop("format"),
        r"has format None \(field 'format'\), this netcl reads 'netcl-checkpoint-1'",
    ),
    (
        "format-other",
        _set("format", "netcl-checkpoint-0"),
        "has format 'netcl-checkpoint-0' \\(field 'format'\\)",
    ),
    (
        "unknown-field",
        _set("weights", [1]),
        "field 'weights' of the checkpoint metadata is not one netcl writes",
    ),
    ("step-missing", _drop("step"), "field 'step' of the checkpoint metadata is missing"),
    ("step-str", _set("step", "7"), "field 'step' .* must be int, got str"),
    ("step-float", _set("step", 7.5), "field 'step' .* must be int, got float"),
    ("step-bool", _set("step", True), "field 'step' .* must be int, got bool"),
    ("step-negative", _set("step", -1), "field 'step' .* must be >= 0, got -1"),
    ("epoch-missing", _drop("epoch"), "field 'epoch' .* is missing"),
    ("epoch-list", _set("epoch", [2]), "field 'epoch' .* must be int, got list"),
    ("extra-missing", _drop("extra"), "field 'extra' .* is missing"),
    ("extra-list", _set("extra", [1]), "field 'extra' .* must be dict, got list"),
    ("rng-missing", _drop("rng"), "field 'rng' .* is missing"),
    ("rng-str", _set("rng", "x"), "field 'rng' .* must be dict, got str"),
    ("rng-netcl-str", _set("rng.netcl", "x"), "field 'rng.netcl' .* must be dict, got str"),
    ("rng-seed-missing", _drop("rng.netcl.seed"), "field 'rng.netcl.seed' .* is missing"),
    ("rng-seed-str", _set("rng.netcl.seed", "1"), "field 'rng.netcl.seed' .* must be int, got str"),
    (
        "rng-counter-huge",
        _set("rng.netcl.counter", 2**64),
        r"field 'rng.netcl.counter' .* must be in \[0, 2\*\*64\)",
    ),
    ("rng-seed-negative", _set("rng.netcl.seed", -1), "field 'rng.netcl.seed' .* got -1"),
    ("model-keys-int", _set("model_keys", 5), "field 'model_keys' .* must be list, got int"),
    (
        "model-keys-ghost",
        _set("model_keys", ["0.weight", "0.bias", "2.weight", "2.bias", "ghost"]),
        "field 'model_keys' .* lists 'ghost', but the file has no tensor 'model/ghost'",
    ),
    (
        "model-keys-short",
        _set("model_keys", ["0.weight", "0.bias", "2.weight"]),
        "field 'model_keys' .* does not list the tensor 'model/2.bias'",
    ),
    (
        "model-keys-duplicate",
        _set("model_keys", ["0.weight", "0.weight", "0.bias", "2.weight", "2.bias"]),
        "field 'model_keys' .* must be a list of distinct names",
    ),
    (
        "model-keys-numbers",
        _set("model_keys", [0, 1]),
        "field 'model_keys' .* must be a list of distinct names",
    ),
    (
        "model-keys-missing",
        _drop("model_keys"),
        "field 'model_keys' .* is missing, but the file holds model tensors",
    ),
    (
        "model-tensor-missing",
        _tensor("model/0.weight"),
        "lists '0.weight', but the file has no tensor 'model/0.weight'",
    ),
    (
        "model-tensor-shape",
        _tensor("model/0.weight", np.zeros((6, 4), np.float32)),
        r"0.weight: shape \(6, 4\) in the checkpoint, \(5, 4\) in the model",
    ),
    (
        "model-tensor-dtype",
        _tensor("model/2.bias", np.zeros(3, np.float64)),
        "2.bias: dtype float64 in the checkpoint, float32 in the model",
    ),
    ("stray-tensor", _tensor("weights", np.zeros(2, np.float32)), "holds tensor 'weights', which is neither"),
    ("optimizer-int", _set("optimizer", 3), "field 'optimizer' .* must be dict, got int"),
    (
        "optimizer-missing",
        _drop("optimizer"),
        "field 'optimizer' .* is missing, but the file holds optimizer tensors",
    ),
    ("optimizer-type-missing", _drop("optimizer.type"), "field 'optimizer.type' .* is missing"),
    ("optimizer-type-int", _set("optimizer.type", 5), "field 'optimizer.type' .* must be str, got int"),
    ("optimizer-type-other", _set("optimizer.type", "SGD"), "holds SGD state, not Adam"),
    ("groups-missing", _drop("optimizer.param_groups"), "field 'optimizer.param_groups' .* is missing"),
    (
        "groups-dict",
        _set("optimizer.param_groups", {"lr": 1}),
        "field 'optimizer.param_groups' .* must be list",
    ),
    (
        "group-list",
        _set("optimizer.param_groups.0", [1]),
        r"field 'optimizer.param_groups\[0\]' .* must be an object",
    ),
    (
        "group-params-missing",
        _drop("optimizer.param_groups.0.params"),
        r"field 'optimizer.param_groups\[0\].params' .* is missing",
    ),
    (
        "group-params-str",
        _set("optimizer.param_groups.0.params", ["0"]),
        r"field 'optimizer.param_groups\[0\].params' .* must be a list of parameter indices",
    ),
    (
        "group-params-short",
        _set("optimizer.param_groups.0.params", [0, 1, 2]),
        "field 'optimizer.state.3' .* is not the index of a parameter the groups list",
    ),
    (
        "group-params-long",
        _set("optimizer.param_groups.0.params", [0, 1, 2, 3, 4]),
        r"optimizer.*param_groups\[0\] has 5 parameters, this optimizer's group has 4",
    ),
    (
        "groups-two",
        _set("optimizer.param_groups", [{"params": []}, {"params": [0, 1, 2, 3]}]),
        "optimizer.*state_dict has 2 parameter groups, this optimizer has 1",
    ),
    (
        "group-lr-nan",
        _set("optimizer.param_groups.0.lr", float("nan")),
        r"field 'optimizer'.*param_groups\[0\]: lr must be a finite number >= 0, got nan",
    ),
    (
        "group-lr-str",
        _set("optimizer.param_groups.0.lr", "0.1"),
        r"field 'optimizer'.*lr must be .* got str '0.1'",
    ),
    (
        "group-betas-short",
        _set("optimizer.param_groups.0.betas", [0.9]),
        r"field 'optimizer'.*betas must be a pair",
    ),
    (
        "group-betas-one",
        _set("optimizer.param_groups.0.betas", [1.0, 0.999]),
        r"betas\[0\] must be .* got 1.0",
    ),
    ("group-eps-missing", _drop("optimizer.param_groups.0.eps"), r"field 'optimizer'.*has no 'eps'"),
    (
        "group-sgd-keys",
        _set("optimizer.param_groups.0.momentum", 0.9),
        "field 'optimizer'.*holds momentum: hyperparameters of .*SGD.*, not of Adam",
    ),
    ("state-list", _set("optimizer.state", [1]), "field 'optimizer.state' .* must be dict, got list"),
    (
        "state-key",
        _set("optimizer.state.x", {}),
        "field 'optimizer.state.x' .* is not the index of a parameter",
    ),
    (
        "state-key-range",
        _set("optimizer.state.9", {}),
        "field 'optimizer.state.9' .* is not the index of a parameter",
    ),
    (
        "state-entry-int",
        _set("optimizer.state.0", 5),
        "field 'optimizer.state.0' .* must be an object, got int",
    ),
    (
        "state-step-str",
        _set("optimizer.state.0.step", "1"),
        r"field 'optimizer'.*state\[0\]\['step'\] must be an integer",
    ),
    (
        "state-step-negative",
        _set("optimizer.state.0.step", -3),
        r"state\[0\]\['step'\] must be an integer >= 0, got -3",
    ),
    (
        "optim-tensor-shape",
        _tensor("optim/0/exp_avg", np.zeros((4, 5), np.float32)),
        r"field 'optimizer'.*'exp_avg' of parameter 0 has shape \(4, 5\), the parameter has shape \(5, 4\)",
    ),
    (
        "optim-tensor-dtype",
        _tensor("optim/1/exp_avg_sq", np.zeros(5, np.int32)),
        r"field 'optimizer'.*\['exp_avg_sq'\] has dtype int32; optimizer state is floating point",
    ),
    (
        "optim-tensor-missing",
        _tensor("optim/1/exp_avg_sq"),
        r"state\[1\] has taken 1 steps but holds no 'exp_avg_sq'",
    ),
    (
        "optim-tensor-foreign",
        _tensor("optim/1/momentum_buffer", np.zeros(5, np.float32)),
        r"state\[1\] holds momentum_buffer: state of .*SGD.*, not of Adam",
    ),
    (
        "optim-tensor-name",
        _tensor("optim/x/exp_avg", np.zeros(5, np.float32)),
        "holds tensor 'optim/x/exp_avg'; optimizer tensors are 'optim/<index>/<name>'",
    ),
    (
        "optim-tensor-index",
        _tensor("optim/12/exp_avg", np.zeros(5, np.float32)),
        "holds tensor 'optim/12/exp_avg' for parameter 12, which field 'optimizer.param_groups'",
    ),
    ("scheduler-int", _set("scheduler", 5), "field 'scheduler' .* must be dict, got int"),
    ("scheduler-type-missing", _drop("scheduler.type"), "field 'scheduler.type' .* is missing"),
    ("scheduler-state-missing", _drop("scheduler.state"), "field 'scheduler.state' .* is missing"),
    (
        "scheduler-type-other",
        _set("scheduler.type", "CosineAnnealing"),
        "holds scheduler CosineAnnealing, not StepLR",
    ),
    ("scheduler-missing", _drop("scheduler"), "holds scheduler none, not StepLR"),
    (
        "scheduler-step-size",
        _set("scheduler.state.step_size", 2.5),
        "field 'scheduler'.*step_size must be an integer >= 1, got float 2.5",
    ),
    ("scheduler-gamma-missing", _drop("scheduler.state.gamma"), "field 'scheduler'.*state has no 'gamma'"),
    ("scheduler-foreign", _set("scheduler.state.T_max", 10), "field 'scheduler'.*unknown entries 'T_max'"),
    (
        "scheduler-lrs",
        _set("scheduler.state._last_lr", [0.1, 0.1]),
        "field 'scheduler'.*_last_lr must be a list of 1",
    ),
    ("loader-list", _set("loader", [1]), "field 'loader' .* must be dict, got list"),
    ("loader-missing", _drop("loader"), "holds no loader state"),
    ("loader-epoch", _set("loader.epoch", -1), "field 'loader'.*epoch must be an integer >= 0, got -1"),
    ("loader-seed-missing", _drop("loader.seed"), "field 'loader'.*a DataLoader's holds 'epoch' and 'seed'"),
]


@pytest.mark.parametrize("name,mutate,words", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_checkpoint_is_refused_and_nothing_changes(queue, saved, name, mutate, words):
    meta, tensors = _contents(saved)
    mutate(meta, tensors)
    save_file(tensors, saved, metadata={"netcl": json.dumps(meta)})
    objects = _objects(queue, 5, 0.5)
    before = _snapshot(*objects)
    with pytest.raises(CheckpointError, match=rf"(?s){saved.name}.*{words}"):
        model, opt, sched, loader = objects
        load_checkpoint(saved, model, opt, sched, loader)
    assert _snapshot(*objects) == before


@pytest.mark.parametrize(
    "netcl,words",
    [
        ("not json", "the 'netcl' metadata is not JSON"),
        ("[1, 2]", "the 'netcl' metadata is a JSON list, not an object"),
        ('"text"', "the 'netcl' metadata is a JSON str, not an object"),
        ("", "the 'netcl' metadata is not JSON"),
        (None, "is a safetensors file but not a netcl checkpoint \\(no 'netcl' metadata\\)"),
    ],
)
def test_metadata_that_is_not_netcls(queue, saved, netcl, words):
    _, tensors = _contents(saved)
    save_file(tensors, saved, metadata=None if netcl is None else {"netcl": netcl})
    objects = _objects(queue, 5, 0.5)
    before = _snapshot(*objects)
    with pytest.raises(CheckpointError, match=rf"{saved.name}.*{words}|{words}.*"):
        load_checkpoint(saved, *objects)
    assert _snapshot(*objects) == before


def test_truncated_files(queue, saved):
    data = saved.read_bytes()
    header = int.from_bytes(data[:8], "little")
    cuts = {
        0: "not a readable safetensors file: 0 bytes",
        5: "not a readable safetensors file: 5 bytes",
        8: "truncated\\?\\): its header is",
        100: "truncated\\?\\): its header is",
        8 + header: "not a readable safetensors file",
        8 + header + 10: "not a readable safetensors file",
        len(data) // 2 + header // 2: "not a readable safetensors file",
        len(data) - 1: "not a readable safetensors file",
    }
    objects = _objects(queue, 5, 0.5)
    before = _snapshot(*objects)
    for cut, words in cuts.items():
        saved.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=rf"{saved.name}.*{words}"):
            load_checkpoint(saved, *objects)
        with pytest.raises(CheckpointError, match=words):
            read_checkpoint(saved)
        assert _snapshot(*objects) == before
    saved.write_bytes(data)
    load_checkpoint(saved, *objects)  # the whole file still loads
    assert _snapshot(*objects) != before


def test_paths_that_are_not_files(queue, tmp_path):
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        load_checkpoint(tmp_path, _model(queue))
    with pytest.raises(TypeError, match="path must be a str or a path, got int"):
        read_checkpoint(3)


def test_atomic_write_arguments(tmp_path):
    with pytest.raises(TypeError, match="data must be bytes, got str"):
        atomic_write(tmp_path / "f", "text")
    with pytest.raises(TypeError, match="path must be a str or a path, got NoneType"):
        atomic_write(None, b"x")
    assert list(tmp_path.iterdir()) == []


def test_valid_checkpoint_restores_everything(queue, saved):
    """The reference for the table above: the same file, uncorrupted, loads into the same objects."""
    want = _snapshot(*_objects(queue, 1, 0.01))
    objects = _objects(queue, 5, 0.5)
    random.manual_seed(1)
    _objects(queue, 1, 0.01)  # the RNG state the saved run had when it saved
    rng = random.default_generator.state_dict()
    random.manual_seed(77)
    meta = load_checkpoint(saved, *objects)
    assert meta["step"] == 7 and meta["extra"] == {"note": "x"}
    assert random.default_generator.state_dict() == rng
    assert _snapshot(*objects) == want


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        (dict(step=2.5), TypeError, "save_checkpoint: step must be an integer >= 0, got float 2.5"),
        (dict(step=-1), ValueError, "step must be an integer >= 0, got -1"),
        (dict(epoch="3"), TypeError, "epoch must be an integer >= 0, got str '3'"),
        (dict(epoch=True), TypeError, "epoch .* got bool"),
        (dict(extra=[1]), TypeError, "extra must be a dict \\(or None\\), got list"),
        (
            dict(extra={"f": object()}),
            TypeError,
            "the metadata .* is not JSON: object is not JSON serialisable",
        ),
        (dict(model=3), TypeError, "model has no state_dict\\(\\) \\(int\\)"),
    ],
)
def test_save_checkpoint_arguments(tmp_path, kwargs, error, words):
    path = tmp_path / "c.safetensors"
    with pytest.raises(error, match=words):
        save_checkpoint(path, **kwargs)
    assert not path.exists() and list(tmp_path.iterdir()) == []

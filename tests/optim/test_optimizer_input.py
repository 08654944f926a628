"""Bad input to optimizers and clip_grad_norm_: the error type, the words that help, and nothing changed."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import optim
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, GraphCaptureError, NetclError, ShapeError
from netcl.graph import Graph

NAN, INF = float("nan"), float("inf")

# (class, hyperparameter, bad value, error, words the message holds)
BAD_HYPER = [
    (optim.SGD, "lr", NAN, ValueError, ">= 0, got nan"),
    (optim.SGD, "lr", -0.1, ValueError, ">= 0, got -0.1"),
    (optim.SGD, "lr", INF, ValueError, "finite"),
    (optim.SGD, "lr", "0.1", TypeError, "str '0.1'"),
    (optim.SGD, "lr", None, TypeError, "NoneType None"),
    (optim.SGD, "lr", True, TypeError, "bool True"),
    (optim.SGD, "lr", np.array([0.1]), TypeError, "ndarray"),
    (optim.SGD, "momentum", -0.5, ValueError, ">= 0, got -0.5"),
    (optim.SGD, "momentum", NAN, ValueError, "got nan"),
    (optim.SGD, "dampening", 1.5, ValueError, r"in \[0, 1\], got 1.5"),
    (optim.SGD, "dampening", NAN, ValueError, "got nan"),
    (optim.SGD, "weight_decay", -1e-4, ValueError, ">= 0, got -0.0001"),
    (optim.SGD, "weight_decay", "0", TypeError, "str"),
    (optim.SGD, "nesterov", "yes", TypeError, "True or False, got str 'yes'"),
    (optim.SGD, "nesterov", 1, TypeError, "True or False, got int 1"),
    (optim.Momentum, "momentum", INF, ValueError, "finite"),
    (optim.Adam, "lr", NAN, ValueError, "got nan"),
    (optim.Adam, "eps", -1e-8, ValueError, ">= 0, got -1e-08"),
    (optim.Adam, "eps", False, TypeError, "bool False"),
    (optim.Adam, "betas", (0.9,), ValueError, "pair.*got 1 values"),
    (optim.Adam, "betas", (0.9, 0.99, 0.999), ValueError, "got 3 values"),
    (optim.Adam, "betas", "ab", TypeError, "pair.*str 'ab'"),
    (optim.Adam, "betas", 0.9, TypeError, "pair.*float 0.9"),
    (optim.Adam, "betas", (1.0, 0.999), ValueError, r"\[0\] must be a finite number in \[0, 1\), got 1.0"),
    (optim.Adam, "betas", (0.9, NAN), ValueError, r"\[1\] must be.*got nan"),
    (optim.Adam, "betas", (0.9, "x"), TypeError, r"\[1\] must be.*str 'x'"),
    (optim.AdamW, "weight_decay", NAN, ValueError, "got nan"),
    (optim.AdamW, "weight_decay", -0.01, ValueError, "got -0.01"),
    (optim.RMSProp, "alpha", 1.5, ValueError, r"in \[0, 1\], got 1.5"),
    (optim.RMSProp, "alpha", NAN, ValueError, "got nan"),
    (optim.RMSProp, "momentum", -0.9, ValueError, "got -0.9"),
    (optim.RMSProp, "eps", "1e-8", TypeError, "str '1e-8'"),
    (optim.RMSprop, "centered", None, TypeError, "True or False, got NoneType"),
]


def _ids(case):
    cls, key, value, *_ = case
    return f"{cls.__name__}-{key}-{value!r}"


def _param(queue, value=1.0, shape=(3,)):
    return ag.Parameter(Tensor.full(queue, shape, value))


def _snapshot(opt):
    """Hyperparameters and state of an optimizer, as plain values (arrays as lists)."""
    sd = opt.state_dict()
    state = {
        i: {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in st.items()}
        for i, st in sd["state"].items()
    }
    return sd["param_groups"], state


@pytest.mark.parametrize("case", BAD_HYPER, ids=_ids)
def test_constructor_rejects_bad_hyperparameters(queue, case):
    cls, key, value, error, words = case
    with pytest.raises(error, match=rf"{cls.__name__}: {key}.*{words}"):
        cls([_param(queue)], **{key: value})


@pytest.mark.parametrize("case", BAD_HYPER, ids=_ids)
def test_param_group_rejects_bad_hyperparameters(queue, case):
    cls, key, value, error, words = case
    groups = [{"params": [_param(queue)]}, {"params": [_param(queue)], key: value}]
    with pytest.raises(error, match=rf"{cls.__name__}: param_groups\[1\]: {key}.*{words}"):
        cls(groups)


@pytest.mark.parametrize("case", BAD_HYPER, ids=_ids)
def test_load_state_dict_rejects_bad_hyperparameters_and_changes_nothing(queue, case):
    cls, key, value, error, words = case
    p = _param(queue)
    opt = cls([p])
    p.grad = Tensor.full(queue, (3,), 0.5)
    opt.step()
    sd = opt.state_dict()
    sd["param_groups"][0][key] = value
    before = _snapshot(opt)
    with pytest.raises(error, match=rf"load_state_dict: param_groups\[0\]: {key}.*{words}"):
        opt.load_state_dict(sd)
    after = _snapshot(opt)
    assert repr(after) == repr(before)


@pytest.mark.parametrize("case", BAD_HYPER, ids=_ids)
def test_step_rejects_a_bad_hyperparameter_written_into_param_groups(queue, case):
    cls, key, value, error, words = case
    p = _param(queue)
    opt = cls([p])
    p.grad = Tensor.full(queue, (3,), 0.5)
    opt.param_groups[0][key] = value
    with pytest.raises(error, match=rf"step: param_groups\[0\]: {key}.*{words}"):
        opt.step()
    np.testing.assert_array_equal(p.value.to_host(), [1.0, 1.0, 1.0])
    assert opt.state == {}


@pytest.mark.parametrize("case", BAD_HYPER, ids=_ids)
def test_step_rejects_a_bad_hyperparameter_written_after_a_good_step(queue, case):
    # step() skips the checks of a group whose values are the very (immutable) objects that passed: a value
    # written after that is checked all the same
    cls, key, value, error, words = case
    p = _param(queue)
    opt = cls([p])
    p.grad = Tensor.full(queue, (3,), 0.5)
    opt.step()
    opt.step()
    before = p.value.to_host()
    opt.param_groups[0][key] = value
    with pytest.raises(error, match=rf"step: param_groups\[0\]: {key}.*{words}"):
        opt.step()
    np.testing.assert_array_equal(p.value.to_host(), before)


def test_step_checks_again_a_list_changed_in_place(queue):
    p = _param(queue)
    opt = optim.Adam([p])
    opt.param_groups[0]["betas"] = [0.9, 0.999]  # a list: may change in place, so never taken as checked
    p.grad = Tensor.full(queue, (3,), 0.5)
    opt.step()
    opt.param_groups[0]["betas"][1] = 1.5
    with pytest.raises(ValueError, match=r"step: param_groups\[0\]: betas\[1\].*got 1.5"):
        opt.step()


def test_sgd_with_nan_lr_never_steps(queue):
    p = _param(queue)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got nan"):
        optim.SGD([p], lr=NAN)
    opt = optim.SGD([p], lr=0.1)
    opt.param_groups[0]["lr"] = NAN
    p.grad = Tensor.ones(queue, (3,))
    with pytest.raises(ValueError, match="got nan"):
        opt.step()
    assert np.all(np.isfinite(p.value.to_host()))


def test_nesterov_rules_apply_to_groups_and_loaded_state(queue):
    with pytest.raises(
        ValueError,
        match=r"Nesterov momentum needs momentum > 0 and dampening 0 \(got momentum=0.9, dampening=0.1\)",
    ):
        optim.SGD([_param(queue)], momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"param_groups\[0\]: Nesterov"):
        optim.SGD([{"params": [_param(queue)], "nesterov": True}], momentum=0.0)
    opt = optim.SGD([_param(queue)], momentum=0.9, nesterov=True)
    sd = opt.state_dict()
    sd["param_groups"][0]["momentum"] = 0.0
    with pytest.raises(ValueError, match="Nesterov"):
        opt.load_state_dict(sd)
    assert opt.param_groups[0]["momentum"] == 0.9


def test_step_and_zero_grad_check_what_they_find(queue):
    p = _param(queue)
    p.grad = Tensor.ones(queue, (3,))
    opt = optim.SGD([p], lr=0.1)
    opt.param_groups[0]["params"].append("w")
    with pytest.raises(
        TypeError, match=r"step: param_groups\[0\]\['params'\]\[1\] is a str, not a Parameter"
    ):
        opt.step()
    np.testing.assert_array_equal(p.value.to_host(), [1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match="zero_grad: set_to_none must be True or False, got str 'no'"):
        opt.zero_grad(set_to_none="no")
    assert p.grad is not None


def test_valid_numbers_of_every_kind_are_kept(queue):
    opt = optim.Adam([_param(queue)], lr=np.float32(0.5), betas=[0, np.float64(0.5)], eps=0, weight_decay=2)
    g = opt.param_groups[0]
    assert g["lr"] == np.float32(0.5) and g["betas"] == (0, 0.5) and g["eps"] == 0 and g["weight_decay"] == 2
    sgd = optim.SGD([_param(queue)], lr=1, momentum=np.int64(1), dampening=1.0, nesterov=np.bool_(False))
    assert sgd.param_groups[0]["nesterov"] is False


# -- constructors given malformed params ------------------------------------------------------------


def test_constructor_rejects_malformed_params(queue):
    p, q = _param(queue), _param(queue)
    cases = [
        (p, TypeError, "got a single Parameter; pass a list"),
        (p.value, TypeError, "got a single Tensor"),
        ({"params": [p]}, TypeError, "got a single dict; pass a list of groups"),
        ({p, q}, TypeError, "not a set"),
        ("abc", TypeError, "got str"),
        (3, TypeError, "got int"),
        ([], ValueError, "empty parameter list"),
        (iter([]), ValueError, "empty parameter list"),
        ([p, "w"], TypeError, r"params\[1\] is a str; optimizers take Parameters"),
        ([p, p.value], TypeError, r"params\[1\] is a Tensor.*wrap a Tensor as netcl.autograd.Parameter"),
        ([p, None], TypeError, r"params\[1\] is a NoneType"),
        ([p, {"params": [q]}], TypeError, r"params\[1\] is a dict but params\[0\] is a Parameter"),
        ([{"params": [p]}, q], TypeError, r"params\[1\] is a Parameter but params\[0\] is a dict"),
        ([{"lr": 0.1}], ValueError, r"param_groups\[0\] has no 'params' entry"),
        (
            [{"params": [p], "learning_rate": 0.1}],
            ValueError,
            r"unknown key\(s\) 'learning_rate'; SGD takes lr, momentum",
        ),
        ([{"params": {p}}], TypeError, r"param_groups\[0\]: 'params' must be in a fixed order"),
        ([{"params": "p"}], TypeError, r"'params' must be a list of Parameters, got str"),
        ([{"params": 5}], TypeError, r"'params' must be a list of Parameters, got int"),
        (
            [{"params": [p]}, {"params": [q, p]}],
            ValueError,
            r"param_groups\[1\]: params\[1\] is also in param_groups\[0\]: a parameter cannot be",
        ),
        ([p, q, p], ValueError, r"params\[2\] appears twice in this parameter group"),
    ]
    for params, error, words in cases:
        with pytest.raises(error, match=words):
            optim.SGD(params, lr=0.1)


def test_single_parameter_in_a_group_and_generators_are_accepted(queue):
    p, q = _param(queue), _param(queue)
    opt = optim.SGD([{"params": p}, {"params": (x for x in [q]), "lr": 0.5}], lr=0.1)
    assert opt.param_groups[0]["params"] == [p] and opt.param_groups[1]["params"] == [q]
    assert optim.Adam(x for x in [p]).param_groups[0]["params"] == [p]


def test_non_leaf_nodes_are_refused(queue):
    x = ag.Parameter(Tensor.ones(queue, (3,)))
    with ag.Tape():
        y = x * 2.0
    assert not y.is_leaf
    with pytest.raises(ValueError, match=r"params\[0\] is not a leaf"):
        optim.Adam([y])


# -- load_state_dict given malformed or foreign state -------------------------------------------


def _stepped(queue, cls, **hyper):
    ps = [_param(queue, 1.0, (3,)), _param(queue, 2.0, (2, 2))]
    opt = cls(ps, **hyper)
    for p in ps:
        p.grad = Tensor.full(queue, p.shape, 0.25)
    opt.step()
    return ps, opt


@pytest.mark.parametrize(
    "src,dst,words",
    [
        (
            lambda: dict(cls=optim.Adam),
            lambda: dict(cls=optim.SGD, lr=0.1),
            "betas, eps: hyperparameters of Adam/AdamW, not of SGD",
        ),
        (
            lambda: dict(cls=optim.SGD, lr=0.1, momentum=0.9),
            lambda: dict(cls=optim.Adam),
            "dampening, momentum, nesterov: hyperparameters of SGD/Momentum, not of Adam",
        ),
        (
            lambda: dict(cls=optim.RMSProp),
            lambda: dict(cls=optim.AdamW),
            "alpha, centered, momentum: hyperparameters of RMSProp, not of AdamW",
        ),
        (
            lambda: dict(cls=optim.Adam),
            lambda: dict(cls=optim.RMSProp),
            "betas: hyperparameters of Adam/AdamW, not of RMSProp",
        ),
    ],
)
def test_state_dict_of_another_optimizer_type_is_refused(queue, src, dst, words):
    _, a = _stepped(queue, **src())
    _, b = _stepped(queue, **dst())
    before = _snapshot(b)
    with pytest.raises(ValueError, match=re.escape(words)):
        b.load_state_dict(a.state_dict())
    assert repr(_snapshot(b)) == repr(before)


def test_state_tensors_of_another_type_are_named(queue):
    _, adam = _stepped(queue, optim.Adam)
    _, sgd = _stepped(queue, optim.SGD, lr=0.1, momentum=0.9)
    sd = sgd.state_dict()
    sd["state"][0]["exp_avg"] = adam.state_dict()["state"][0]["exp_avg"]
    with pytest.raises(
        ValueError,
        match=r"state\[0\] holds exp_avg: state of Adam/AdamW, not of SGD \(is this the state_dict",
    ):
        sgd.load_state_dict(sd)


def _malformed(sd):
    """(mutation of a valid Adam state_dict, error, words)."""
    yield lambda d: d.pop("state"), ValueError, "state_dict has no 'state' entry"
    yield lambda d: d.pop("param_groups"), ValueError, "state_dict has no 'param_groups' entry"
    yield lambda d: d.update(extra=1), ValueError, "unknown key\\(s\\) 'extra'"
    yield (
        lambda d: d.update(param_groups=d["param_groups"] * 2),
        ValueError,
        "has 2 parameter groups, this optimizer has 1",
    )
    yield (
        lambda d: d.update(param_groups={"lr": 1}),
        TypeError,
        "'param_groups' must be a list of dicts, got dict",
    )
    yield (
        lambda d: d["param_groups"].__setitem__(0, [1]),
        TypeError,
        r"param_groups\[0\] must be a dict, got list",
    )
    yield lambda d: d["param_groups"][0].pop("params"), ValueError, r"param_groups\[0\] has no 'params' entry"
    yield lambda d: d["param_groups"][0].pop("lr"), ValueError, r"param_groups\[0\] has no 'lr'"
    yield (
        lambda d: d["param_groups"][0].update(params=[0]),
        ValueError,
        r"param_groups\[0\] has 1 parameters, this optimizer's group has 2",
    )
    yield (
        lambda d: d["param_groups"][0].update(params=[0, "1"]),
        TypeError,
        r"'params' must be a list of parameter indices",
    )
    yield (
        lambda d: d["param_groups"][0].update(params=[0, 0]),
        ValueError,
        "parameter index 0 is listed more than once",
    )
    yield (
        lambda d: d["param_groups"][0].update(momentum=0.9),
        ValueError,
        "holds momentum: hyperparameters of RMSProp/SGD/Momentum, not of Adam",
    )
    yield (
        lambda d: d["param_groups"][0].update(initial_lr=-1.0),
        ValueError,
        r"initial_lr must be a finite number >= 0, got -1.0",
    )
    yield lambda d: d.update(state=[1, 2]), TypeError, "'state' must be a dict of parameter index"
    yield lambda d: d["state"].update({"x": {}}), TypeError, "state key 'x' is not a parameter index"
    yield lambda d: d["state"].update({-1: {}}), TypeError, "state key -1 is not a parameter index"
    yield (
        lambda d: d["state"].update({5: {}}),
        ValueError,
        r"state\[5\]: optimizer state names parameter 5, but no parameter group lists it",
    )
    yield lambda d: d["state"].update({0: 3}), TypeError, r"state\[0\] must be a dict"
    yield (
        lambda d: d["state"][0].update(step=1.5),
        TypeError,
        r"state\[0\]\['step'\] must be an integer >= 0, got float 1.5",
    )
    yield (
        lambda d: d["state"][0].update(step=-2),
        ValueError,
        r"state\[0\]\['step'\] must be an integer >= 0, got -2",
    )
    yield lambda d: d["state"][0].update(step=True), TypeError, r"\['step'\].*bool"
    yield lambda d: d["state"][0].update(velocity=np.zeros(3)), ValueError, r"unknown entries 'velocity'"
    yield (
        lambda d: d["state"][0].update(exp_avg=np.zeros(4)),
        ShapeError,
        r"'exp_avg' of parameter 0 has shape \(4,\), the parameter has shape \(3,\)",
    )
    yield (
        lambda d: d["state"][1].update(exp_avg_sq=np.zeros(4)),
        ShapeError,
        r"'exp_avg_sq' of parameter 1 has shape \(4,\).*\(2, 2\)",
    )
    yield (
        lambda d: d["state"][0].update(exp_avg=np.zeros(3, np.int64)),
        DTypeError,
        r"\['exp_avg'\] has dtype int64; optimizer state is floating point",
    )
    yield lambda d: d["state"][0].update(exp_avg=np.array(["a", "b", "c"])), DTypeError, "has dtype <U1"
    yield (
        lambda d: d["state"][0].update(exp_avg=[[1.0], [1.0, 2.0]]),
        TypeError,
        r"\['exp_avg'\] is not an array",
    )
    yield (
        lambda d: d["state"][0].pop("exp_avg_sq"),
        ValueError,
        r"state\[0\] has taken 1 steps but holds no 'exp_avg_sq'",
    )


@pytest.mark.parametrize("index", range(len(list(_malformed(None)))))
def test_malformed_state_dict_is_refused_and_changes_nothing(queue, index):
    mutate, error, words = list(_malformed(None))[index]
    ps, opt = _stepped(queue, optim.Adam, lr=0.01)
    sd = opt.state_dict()
    mutate(sd)
    before = _snapshot(opt)
    tensors = [st["exp_avg"] for st in opt.state.values()]
    with pytest.raises(error, match=words):
        opt.load_state_dict(sd)
    assert repr(_snapshot(opt)) == repr(before)
    assert [st["exp_avg"] for st in opt.state.values()] == tensors  # the same Tensor objects


def test_load_state_dict_is_not_a_dict(queue):
    _, opt = _stepped(queue, optim.SGD, lr=0.1)
    with pytest.raises(
        TypeError, match="state_dict must be a dict with 'state' and 'param_groups'.*got list"
    ):
        opt.load_state_dict([])


def test_string_state_keys_and_list_betas_load(queue):
    """What a JSON round trip makes of a state_dict (str keys, lists) still loads."""
    ps, a = _stepped(queue, optim.Adam, lr=0.01)
    sd = a.state_dict()
    sd = {
        "state": {
            str(k): {n: (v.tolist() if isinstance(v, np.ndarray) else v) for n, v in st.items()}
            for k, st in sd["state"].items()
        },
        "param_groups": [{**g, "betas": list(g["betas"])} for g in sd["param_groups"]],
    }
    _, b = _stepped(queue, optim.Adam, lr=0.5)
    b.load_state_dict(sd)
    assert b.param_groups[0]["betas"] == (0.9, 0.999) and b.param_groups[0]["lr"] == 0.01
    np.testing.assert_array_equal(
        b.state_dict()["state"][1]["exp_avg"], a.state_dict()["state"][1]["exp_avg"]
    )


# -- momentum switched on after the first step -----------------------------------------------------


def _sgd_reference(p, grads, momenta, lr=0.1, dampening=0.0):
    buf = None
    out = []
    for g, mu in zip(grads, momenta):
        if mu:
            buf = g.copy() if buf is None else mu * buf + (1 - dampening) * g
            g = buf
        p = p - lr * g
        out.append(p)
    return out


def test_momentum_switched_on_later_gets_its_own_buffer(queue, rng):
    """SGD made with momentum 0 keeps no buffer; when momentum is switched on later (by hand, by
    OneCycle, by load_state_dict) the buffer starts from the gradient, as in PyTorch, and the
    parameter is never used as a buffer."""
    host = rng.standard_normal(5)
    grads = [rng.standard_normal(5) for _ in range(4)]
    momenta = [0.0, 0.0, 0.9, 0.8]
    p = ag.Parameter(Tensor.from_host(queue, host))
    opt = optim.SGD([p], lr=0.1, dampening=0.25)
    for g, mu in zip(grads, momenta):
        opt.param_groups[0]["momentum"] = mu
        p.grad = Tensor.from_host(queue, g)
        opt.step()
    want = _sgd_reference(host, grads, momenta, dampening=0.25)[-1]
    np.testing.assert_allclose(p.value.to_host(), want, rtol=1e-12)


def test_rmsprop_centered_switched_on_by_load_state_dict(queue, rng):
    host = rng.standard_normal(4)
    p = ag.Parameter(Tensor.from_host(queue, host))
    opt = optim.RMSProp([p], lr=0.01)
    p.grad = Tensor.from_host(queue, rng.standard_normal(4))
    opt.step()
    sd = opt.state_dict()
    sd["param_groups"][0]["centered"] = True
    sd["state"][0]["grad_avg"] = np.zeros(4)
    opt.load_state_dict(sd)
    p.grad = Tensor.ones(queue, (4,), np.float64)
    before = p.value.to_host()
    opt.step()
    sq = opt.state_dict()["state"][0]["square_avg"]
    ga = opt.state_dict()["state"][0]["grad_avg"]
    np.testing.assert_allclose(ga, np.full(4, 0.01), rtol=1e-12)
    np.testing.assert_allclose(p.value.to_host(), before - 0.01 / (np.sqrt(sq - ga**2) + 1e-8), rtol=1e-12)


def test_graph_replay_refuses_momentum_switched_on_after_capture(queue):
    p = ag.Parameter(Tensor.ones(queue, (3,)))
    p.grad = Tensor.ones(queue, (3,))
    opt = optim.SGD([p], lr=0.1)
    graph = Graph()
    with graph.capture(queue):
        opt.step()
    graph.replay()
    np.testing.assert_allclose(p.value.to_host(), [0.8] * 3, rtol=1e-6)
    opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(GraphCaptureError, match="momentum_buffer.*capture the step again"):
        graph.replay()
    opt.param_groups[0]["momentum"] = 0.0
    opt.param_groups[0]["lr"] = NAN
    with pytest.raises(ValueError, match=r"graph replay\): param_groups\[0\]: lr.*got nan"):
        graph.replay()
    np.testing.assert_allclose(p.value.to_host(), [0.8] * 3, rtol=1e-6)


# -- clip_grad_norm_ -------------------------------------------------------------------------------


def _with_grads(queue, grads):
    params = [ag.Parameter(Tensor.zeros(queue, g.shape, np.float64)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = Tensor.from_host(queue, g)
    return params


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        (dict(max_norm=-1.0), ValueError, "max_norm must be a number \\(not NaN\\) >= 0, got -1.0"),
        (dict(max_norm=NAN), ValueError, "max_norm.*got nan"),
        (dict(max_norm="1"), TypeError, "max_norm.*str '1'"),
        (dict(max_norm=None), TypeError, "max_norm.*NoneType"),
        (dict(max_norm=True), TypeError, "max_norm.*bool"),
        (dict(max_norm=1.0, norm_type="abc"), TypeError, "norm_type.*str 'abc'"),
        (dict(max_norm=1.0, norm_type=NAN), ValueError, "norm_type.*got nan"),
        (dict(max_norm=1.0, norm_type=0), ValueError, "norm_type must be a number \\(not NaN\\) > 0, got 0"),
        (dict(max_norm=1.0, norm_type=-INF), ValueError, "norm_type.*> 0, got -inf"),
        (dict(max_norm=1.0, error_if_nonfinite="yes"), TypeError, "error_if_nonfinite must be True or False"),
    ],
)
def test_clip_grad_norm_rejects_bad_arguments(queue, rng, kwargs, error, words):
    grads = [rng.standard_normal((3, 2)), rng.standard_normal(4)]
    params = _with_grads(queue, grads)
    with pytest.raises(error, match=words):
        optim.clip_grad_norm_(params, **kwargs)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.to_host(), g)


def test_clip_grad_norm_rejects_what_is_not_a_parameter(queue, rng):
    params = _with_grads(queue, [rng.standard_normal(3)])
    with pytest.raises(TypeError, match=r"parameters\[1\] is a Tensor, not a Parameter"):
        optim.clip_grad_norm_([params[0], params[0].grad], 1.0)
    with pytest.raises(TypeError, match="parameters must be an iterable of Parameters, got float"):
        optim.clip_grad_norm_(1.5, 1.0)
    with pytest.raises(NetclError, match="no parameter has a gradient"):
        optim.clip_grad_norm_([ag.Parameter(Tensor.ones(queue, (2,)))], 1.0)


def test_clip_grad_norm_single_parameter_and_infinite_max_norm(queue, rng):
    g = rng.standard_normal(7)
    (p,) = _with_grads(queue, [g])
    norm = optim.clip_grad_norm_(p, max_norm=INF)
    np.testing.assert_allclose(norm.to_host(), [np.linalg.norm(g)], rtol=1e-12)
    np.testing.assert_array_equal(p.grad.to_host(), g)
    optim.clip_grad_norm_(p, max_norm=0)
    np.testing.assert_array_equal(p.grad.to_host(), np.zeros(7))


@pytest.mark.parametrize("bad", [NAN, INF])
def test_clip_grad_norm_non_finite_norm(queue, rng, bad):
    grads = [rng.standard_normal(3), rng.standard_normal(4)]
    grads[1][2] = bad
    params = _with_grads(queue, grads)
    with pytest.raises(
        NetclError, match=f"total norm of order 2.0 of the gradients is {bad}.*left as they are"
    ):
        optim.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.to_host(), g)
    norm = optim.clip_grad_norm_(params, 1.0)  # the default scales anyway, as PyTorch's does
    assert not math.isfinite(float(norm.to_host()[0]))


def test_clip_grad_norm_error_if_nonfinite_passes_finite_norms(queue, rng):
    grads = [rng.standard_normal(5) * 10]
    params = _with_grads(queue, grads)
    norm = optim.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    total = np.linalg.norm(grads[0])
    np.testing.assert_allclose(norm.to_host(), [total], rtol=1e-12)
    np.testing.assert_allclose(params[0].grad.to_host(), grads[0] / (total + 1e-6), rtol=1e-12)

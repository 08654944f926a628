"""Optimizer base: parameter groups, per-parameter state, fused update launches, state_dict.

Each step launches kernels/optim.cl's `optimizer_step` once per chunk of up to 8 parameters that
share a queue, a dtype and a step count (so usually once or twice per step for a whole model).
Hyperparameters are checked where they enter (constructor, parameter groups, load_state_dict) and
again at each step, since param_groups is a plain dict users and schedulers write to.

float16 and bfloat16 parameters (mixed precision) keep float32 master weights (state "master", made from
the parameter at its first step) and float32 state; the same one launch reads the half gradient, updates
the master and the state, and writes the parameter rounded from the master. Change such a parameter's
value after its first step only through load_state_dict of both the model and the optimizer: the master
is what the next step starts from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import capture, dtypes
from netcl.core.access import before_access
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, GraphCaptureError, NetclError, ShapeError
from netcl.ops import elementwise, update
from netcl.ops.update import MAX_TENSORS_PER_LAUNCH, state_dtype
from netcl.optim.arguments import Count, Flag, Real, is_count

# Keys schedulers keep in a parameter group beside the optimizer's own hyperparameters.
SCHEDULE_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "initial_lr": Real(0),
    "max_lr": Real(0),
    "min_lr": Real(0),
}


# step() replays the last step's launches while nothing they were made for changed (_memo_step); False: every
# step takes the full path (benchmarks compare the two: --no-step-memo)
STEP_MEMO = True
_MISSING = object()
_IMMUTABLE = (float, int, bool, str, type(None), np.generic)


def _immutable(value: Any) -> bool:
    """A value that cannot change in place: a number, string, None, or a tuple of them."""
    if isinstance(value, _IMMUTABLE):
        return True
    return type(value) is tuple and all(isinstance(v, _IMMUTABLE) for v in value)


class ParamState(dict):
    """An optimizer's state: id(parameter) -> {'step': int, name: Tensor}, as netcl keys it; PyTorch's
    `opt.state[p]`, `p in opt.state` and `opt.state.get(p)` (the parameter itself) find the same entry."""

    def __missing__(self, key: Any) -> dict[str, Any]:
        if isinstance(key, Node) and dict.__contains__(self, id(key)):
            return dict.__getitem__(self, id(key))
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, id(key) if isinstance(key, Node) else key)

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.get(self, id(key) if isinstance(key, Node) else key, default)


@dataclass
class _Loaded:
    """A state_dict that passed every check, ready to be put in place."""

    groups: list[dict[str, Any]]  # hyperparameters per group (without 'params')
    state: dict[int, dict[str, Any]]  # id(param) -> {'step': int, name: host array cast to its dtype}


class Optimizer:
    """Base class: subclasses set `rule` (the update rule of netcl.ops.update), `hyper` (each
    hyperparameter's check), `slot_names` (the rule's state tensors) and `_hyper(group, step, items)`."""

    rule = ""
    hyper: dict[str, Callable[[Any, str], Any]] = {}
    slot_names: tuple[str, ...] = ()
    # hyperparameters added after state dicts were saved without them, and the value that reproduces what
    # those groups did (load_state_dict gives it to a saved group that lacks the key)
    added_hyper: dict[str, Any] = {}
    # state a saved entry may lack: it is made afresh at the next step (SGD's momentum buffer, as in
    # PyTorch); any other missing state of a parameter that has taken steps is a malformed state_dict
    lazy_state: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        name = type(self).__name__
        self.defaults = self._check_group(dict(defaults), name)
        groups = _group_dicts(params, name)
        self.param_groups: list[dict[str, Any]] = []
        seen: dict[int, int] = {}  # id(param) -> index of its group
        for i, g in enumerate(groups):
            self.param_groups.append(self._make_group(g, i, seen))
        # per parameter: {"step": int, name: Tensor}
        self.state: dict[int, dict[str, Any]] = ParamState()
        self._fresh: set[int] = set()  # parameters whose state tensors were just made (zeros)
        # id(group) -> (group, its hyperparameters as last checked by step()): see _check_group_for_step
        self._checked: dict[int, tuple[dict[str, Any], tuple]] = {}
        # the last step's launches and what they were made for (_make_memo, _memo_step), or None
        self._memo: list[tuple] | None = None

    def _make_group(self, g: Mapping[str, Any], i: int, seen: dict[int, int]) -> dict[str, Any]:
        """Parameter group `i` from the dict `g`: its hyperparameters checked (the defaults fill the rest),
        its params distinct leaves in no other group (`seen`: id(param) -> group index, updated)."""
        name = type(self).__name__
        where = f"{name}: param_groups[{i}]"
        if "params" not in g:
            raise ValueError(
                f"{where} has no 'params' entry; a parameter group is a dict like "
                "{'params': [p1, p2], 'lr': 0.1}"
            )
        unknown = [k for k in g if k != "params" and k not in self.defaults and k not in SCHEDULE_KEYS]
        if unknown:
            raise ValueError(
                f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"{name} takes {', '.join(self.defaults)}"
            )
        group = self._check_group({**self.defaults, **{k: v for k, v in g.items() if k != "params"}}, where)
        group["params"] = _group_params(g["params"], where, seen, i)
        return group

    def add_param_group(self, param_group: Mapping[str, Any]) -> None:
        """Add a parameter group (PyTorch's add_param_group, e.g. for layers unfrozen during fine-tuning):
        a dict with 'params' and any of this optimizer's hyperparameters, the constructor's defaults for the
        rest. Its parameters must be in no other group. A scheduler made before it does not schedule it,
        and a Graph captured before it does not update it (capture again)."""
        if not isinstance(param_group, Mapping):
            raise TypeError(f"{type(self).__name__}.add_param_group takes a dict like {{'params': [p1, p2], "
                            f"'lr': 0.1}}, got {type(param_group).__name__}")
        seen = {id(p): gi for gi, g in enumerate(self.param_groups) for p in g["params"]}
        self.param_groups.append(self._make_group(param_group, len(self.param_groups), seen))
        self._memo = None

    # -- checks -----------------------------------------------------------------------------------
    def _check_group(self, values: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The group's hyperparameters checked (betas as a tuple), or TypeError/ValueError naming one."""
        out = dict(values)
        for key, check in self.hyper.items():
            if key not in values:
                raise ValueError(
                    f"{where} has no {key!r}; {type(self).__name__} needs {', '.join(self.hyper)}"
                )
            out[key] = check(values[key], f"{where}: {key}")
        for key, check in SCHEDULE_KEYS.items():
            if key in values:
                out[key] = check(values[key], f"{where}: {key}")
        self._check_combination(out, where)
        return out

    def _check_combination(self, group: dict[str, Any], where: str) -> None:
        """Rules between hyperparameters of one group (subclasses)."""

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        """State tensors a parameter of this group needs for its next step."""
        return self.slot_names

    # -- user API -------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the accumulated gradients (set_to_none=False fills them with zeros instead)."""
        if type(set_to_none) is not bool:  # a bool is its own check's answer (no message built per step)
            set_to_none = Flag()(set_to_none, f"{type(self).__name__}.zero_grad: set_to_none")
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.fill_(0)

    def step(self, closure: Callable[[], Any] | None = None, *, found_inf: Tensor | None = None) -> Any:
        """Update every parameter that has a gradient (one fused launch per chunk of parameters).

        closure (PyTorch's): a function that computes the loss and its gradients (its own Tape and
        backward), called first; step returns what it returned (None without one).

        found_inf (an int32 Tensor of shape (1,) on the device, as netcl.amp.GradScaler keeps): every launch
        reads it and changes nothing when it is nonzero, so a step whose gradients overflowed is skipped
        without a host sync. The host's step count still advances (Adam's bias corrections then run one
        step ahead of PyTorch's after each skipped step; GradScaler(sync=True) skips on the host instead)."""
        loss = None
        if closure is not None:
            if not callable(closure):
                raise TypeError(f"{type(self).__name__}.step: closure must be a function that computes the "
                                f"loss and its gradients, got {type(closure).__name__}")
            loss = closure()
        memo = self._memo
        if memo is not None and found_inf is None and STEP_MEMO and not capture.open_recordings \
                and self._memo_step(memo):
            return loss
        self._memo = None
        name = type(self).__name__
        for i, group in enumerate(self.param_groups):
            self._check_group_for_step(group, i)
            for j, p in enumerate(group["params"]):
                if not isinstance(p, Node):
                    raise TypeError(
                        f"{name}.step: param_groups[{i}]['params'][{j}] is a {type(p).__name__}, not a "
                        "Parameter (was the list changed after the optimizer was made?)"
                    )
                if p.grad is not None:
                    self._check_grad(p)
        fresh = self._fresh
        launched: list[tuple[dict[str, Any], tuple[str, ...], list]] = []
        for group in self.param_groups:
            chunks: dict[tuple, list[tuple[Node, dict[str, Any]]]] = {}
            names = self._state_names(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self._state_for(p, group, names)
                v = p.value
                # chunks share a queue, a dtype and a step count, and were all just made or all not
                key = (id(v.queue), v.dtype, st["step"], id(p) in fresh)
                chunks.setdefault(key, []).append((p, st))
            launches = []
            for (_, _, step, *_), items in chunks.items():
                for start in range(0, len(items), MAX_TENSORS_PER_LAUNCH):
                    part = items[start : start + MAX_TENSORS_PER_LAUNCH]
                    launches.append((part, self._launch(group, part, step + 1, found_inf)))
                for p, st in items:
                    st["step"] = step + 1
                    self._fresh.discard(id(p))
            launched.append((group, names, launches))
        if found_inf is None and not capture.open_recordings:
            self._memo = self._make_memo(launched)
        return loss

    # -- the step memo: a step like the last one, without its per-parameter Python ----------------------
    def _make_memo(self, launched: list[tuple[dict[str, Any], tuple[str, ...], list]]) -> list[tuple] | None:
        """What the next step() may replay (`_memo_step`): per group, the group, its state names, its
        parameters with their values (and the values' storages), their state dicts and the state tensors in
        them, their gradients' layouts (None: no gradient), and its launches (the items and
        optimizer_step's StepLaunch). None where a launch cannot be kept (a graph capture, found_inf, a
        gradient laid out unlike its parameter)."""
        memo = []
        for group, names, launches in launched:
            if any(launch is None for _, launch in launches):
                return None
            params = tuple(group["params"])
            rows = []
            for p in params:
                g = p.grad
                if g is None:
                    rows.append((p, p.value, p.value._storage, None, None, None))
                    continue
                if g.strides != p.value.strides:   # (_launch gave the launch a contiguous copy)
                    return None
                st = self.state[id(p)]
                slots = tuple((n, st.get(n)) for n in (*names, "master") if st.get(n) is not None)
                layout = (g.shape, g.strides, g.dtype, g.queue, g.offset)
                rows.append((p, p.value, p.value._storage, layout, st, slots))
            memo.append((group, names, tuple(rows), launches))
        return memo

    def _memo_step(self, memo: list[tuple]) -> bool:
        """One step through the last step's launches, when everything they were made for is as it was: the
        same groups and parameters, each parameter's value, state dict and state tensors the same objects,
        its gradient (or none) laid out as then, and the group's hyperparameters checked as step() checks
        them; False (nothing done) otherwise. The scalars of the step (its count, the current lr) are given
        to each launch as step() gives them."""
        groups = self.param_groups
        if len(groups) != len(memo):
            return False
        state_of = dict.get  # (the state is keyed by id(p): the plain dict's lookup, once per parameter)
        state = self.state
        for i, (group, (group0, names, rows, _)) in enumerate(zip(groups, memo)):
            params = group["params"]
            if group is not group0 or len(params) != len(rows):
                return False
            self._check_group_for_step(group, i)
            if self._state_names(group) != names:
                return False
            for p, (p0, v0, s0, layout, st0, slots) in zip(params, rows):
                if p is not p0 or p.value is not v0 or v0._storage is not s0:
                    return False
                g = p.grad
                if layout is None:
                    if g is not None:
                        return False
                    continue
                if type(g) is not Tensor or g.queue is not layout[3] or g.shape != layout[0] \
                        or g.strides != layout[1] or g.dtype != layout[2] or g.offset != layout[4] \
                        or state_of(state, id(p)) is not st0:
                    return False
                for n, t in slots:
                    if st0.get(n) is not t:
                        return False
                # a pending result that reads what the step writes in place is computed before the write
                # (the slow path's Tensor.buffer reads do that): such a step takes the slow path
                if before_access and (id(s0) in before_access
                                      or any(id(t._storage) in before_access for _, t in slots)):
                    return False
        for group, (_, _, _, launches) in zip(groups, memo):
            for items, launch in launches:
                step = items[0][1]["step"] + 1
                launch([p.grad for p, _ in items], self._hyper(group, step, items))
                for _, st in items:
                    st["step"] = step
        return True

    # -- machinery --------------------------------------------------------------------------------
    def _check_group_for_step(self, group: dict[str, Any], index: int) -> None:
        """step()'s check of a parameter group's hyperparameters, skipped when every value is the very object
        that passed the last check of this group: each such value is immutable (numbers, strings, None, tuples
        of them), so it would pass again; a new or rewritten value (a scheduler's lr) is checked."""
        seen = self._checked.get(id(group))
        if seen is not None and seen[0] is group and len(seen[1]) + 1 == len(group):
            get = group.get
            for key, value in seen[1]:
                if get(key, _MISSING) is not value:
                    break
            else:
                return
        self._check_group(group, f"{type(self).__name__}.step: param_groups[{index}]")
        values = tuple((k, v) for k, v in group.items() if k != "params")
        if len(values) + 1 == len(group) and all(_immutable(v) for _, v in values):
            self._checked[id(group)] = (group, values)
        else:
            self._checked.pop(id(group), None)

    def _check_grad(self, p: Node) -> None:
        """A parameter and its gradient fit an update (checked before any state is made)."""
        v, g = p.value, p.grad
        if not v.is_contiguous():
            raise NetclError(f"{type(self).__name__}: parameter of shape {v.shape} is not contiguous")
        if not isinstance(g, Tensor):
            raise TypeError(
                f"{type(self).__name__}: the gradient of a parameter of shape {v.shape} is a "
                f"{type(g).__name__}, not a Tensor"
            )
        if g.shape != v.shape:
            raise ShapeError(
                f"{type(self).__name__}: gradient of shape {g.shape} for a parameter of shape {v.shape}"
            )
        if g.dtype != v.dtype or g.queue is not v.queue:
            raise NetclError(
                f"{type(self).__name__}: gradient ({g.dtype}, {g.queue!r}) does not match "
                f"its parameter ({v.dtype}, {v.queue!r})"
            )

    def _state_for(self, p: Node, group: dict[str, Any],
                   names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The parameter's state, with every tensor its group needs now (made as zeros when missing:
        at the first step, or when a hyperparameter such as momentum was switched on later); `names`: the
        group's _state_names when the caller has them."""
        st = dict.get(self.state, id(p))
        if st is None:
            st = {"step": 0}
            self.state[id(p)] = st
        missing = []  # (a loop, not a comprehension: one call less per parameter and step)
        for name in self._state_names(group) if names is None else names:
            if st.get(name) is None:
                missing.append(name)
        half = p.value.dtype in dtypes.HALF  # a Tensor's dtype is a np.dtype
        if missing or (half and st.get("master") is None):
            with capture.capture_paused():  # made once: a graph replay must not zero it again
                for name in missing:
                    st[name] = Tensor.zeros(p.value.queue, p.value.shape, state_dtype(p.value.dtype))
                if half and st.get("master") is None:
                    st["master"] = elementwise.cast(p.value, dtypes.float32).realize()
            self._fresh.add(id(p))
        return st

    def _hyper(self, group: dict[str, Any], step: int, items: list) -> dict[str, Any]:
        """The update's scalars for `step`, by the kernel's parameter names (netcl.ops.update)."""
        raise NotImplementedError

    def _launch(self, group: dict[str, Any], items: list[tuple[Node, dict[str, Any]]], step: int,
                found_inf: Tensor | None = None) -> update.StepLaunch | None:
        # _check_grad saw each parameter contiguous and its gradient of its shape: one of its strides is too
        grads = []
        for p, _ in items:
            g = p.grad
            grads.append(g if g.strides == p.value.strides or g.is_contiguous() else g.contiguous())
        # a slot this group does not use stays None (_state_for made every slot its settings use)
        states = [[*map(st.get, self.slot_names)] for _, st in items]
        refresh = None
        if capture.capturing() is not None:  # each replay is the next step: new step count, current lr
            kept = set.intersection(
                *({n for n in self.slot_names if st.get(n) is not None} for _, st in items)
            )
            refresh = lambda: self._replay_step(group, items, kept)  # noqa: E731
        masters = [st["master"] for _, st in items] if dtypes.is_half(items[0][0].value.dtype) else None
        return update.optimizer_step(self.rule, [p.value for p, _ in items], grads, states,
                                     self._hyper(group, step, items), refresh, masters, found_inf)

    def _replay_step(self, group: dict[str, Any], items: list, kept: set[str]) -> dict[str, Any]:
        """Before a graph replays this launch: check the group's hyperparameters as step() does,
        advance the step count of its parameters and give the hyperparameters of that step (the
        group's current lr, bias corrections)."""
        name = type(self).__name__
        index = next((i for i, g in enumerate(self.param_groups) if g is group), "?")
        self._check_group(group, f"{name} (graph replay): param_groups[{index}]")
        missing = [n for n in self._state_names(group) if n not in kept]
        if missing:
            raise GraphCaptureError(
                f"{name}: param_groups[{index}] now needs {', '.join(missing)}, which the captured step "
                "keeps no buffer for (a hyperparameter such as momentum was switched on after the "
                "capture); capture the step again"
            )
        step = items[0][1]["step"] + 1
        for _, st in items:
            st["step"] = step
        return self._hyper(group, step, items)

    # -- state -------------------------------------------------------------------------------------
    def _index(self) -> list[Node]:
        return [p for g in self.param_groups for p in g["params"]]

    def __deepcopy__(self, memo: dict) -> Optimizer:
        raise TypeError(
            f"copy.deepcopy of a {type(self).__name__}: an optimizer updates the parameters it was given, so "
            "a copy is a new one over the copied model's parameters: opt2 = type(opt)(model2.parameters(), "
            "...); opt2.load_state_dict(opt.state_dict()) carries the step counts and moments over")

    def state_dict(self) -> dict[str, Any]:
        """{'state': {index: {'step': int, name: ndarray}}, 'param_groups': [hyperparameters + indices]}.

        Tensors are copied to the host (NumPy), so the dict is a snapshot."""
        params = self._index()
        position = {id(p): i for i, p in enumerate(params)}
        state = {}
        for pid, st in self.state.items():
            if pid not in position:
                continue
            state[position[pid]] = {
                k: (v.to_host() if isinstance(v, Tensor) else v) for k, v in st.items() if v is not None
            }
        groups = []
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = [position[id(p)] for p in g["params"]]
            groups.append(entry)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyperparameters and state saved by state_dict().

        Everything is checked first (structure, hyperparameters, which optimizer saved it, state
        names, shapes, dtypes); on any error the optimizer is left exactly as it was."""
        loaded = self._check_state_dict(state_dict)
        new_state: dict[int, dict[str, Any]] = {}
        params = {id(p): p for p in self._index()}
        for pid, st in loaded.state.items():
            p = params[pid]
            new_state[pid] = {
                k: (Tensor.from_host(p.value.queue, v) if isinstance(v, np.ndarray) else v)
                for k, v in st.items()
            }
        for values, group in zip(loaded.groups, self.param_groups):
            group.update(values)
        self.state = ParamState(new_state)
        self._memo = None   # (it holds the old state's tensors)
        self._fresh.clear()

    def _check_state_dict(self, state_dict: Any) -> _Loaded:
        """Check a state_dict against this optimizer without changing anything (load_state_dict and
        load_checkpoint call it before they touch anything)."""
        name = type(self).__name__
        where = f"{name}.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"{where}: state_dict must be a dict with 'state' and 'param_groups' (what state_dict() "
                f"returns), got {type(state_dict).__name__}"
            )
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(
                    f"{where}: state_dict has no {key!r} entry (it needs 'state' and 'param_groups')"
                )
        extra = [k for k in state_dict if k not in ("state", "param_groups")]
        if extra:
            raise ValueError(
                f"{where}: state_dict has unknown key(s) {', '.join(map(repr, extra))}; "
                "it holds 'state' and 'param_groups'"
            )
        groups = state_dict["param_groups"]
        if not isinstance(groups, (list, tuple)):
            raise TypeError(f"{where}: 'param_groups' must be a list of dicts, got {type(groups).__name__}")
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"{where}: state_dict has {len(groups)} parameter groups, this optimizer has "
                f"{len(self.param_groups)}"
            )
        new_groups = []
        param_of: dict[int, Node] = {}  # saved index -> this optimizer's parameter
        group_of: dict[int, dict[str, Any]] = {}  # saved index -> hyperparameters it will step with
        for i, (saved, group) in enumerate(zip(groups, self.param_groups)):
            at = f"{where}: param_groups[{i}]"
            if not isinstance(saved, Mapping):
                raise TypeError(f"{at} must be a dict, got {type(saved).__name__}")
            if "params" not in saved:
                raise ValueError(f"{at} has no 'params' entry (the indices of its parameters)")
            indices = saved["params"]
            if not isinstance(indices, (list, tuple)) or not all(is_count(j) for j in indices):
                raise TypeError(f"{at}: 'params' must be a list of parameter indices (ints), got {indices!r}")
            if len(indices) != len(group["params"]):
                raise ValueError(
                    f"{at} has {len(indices)} parameters, this optimizer's group has {len(group['params'])}"
                )
            keys = {k for k in saved if k != "params"}
            unknown = sorted(keys - set(self.defaults) - set(SCHEDULE_KEYS))
            if unknown:
                owner = _owners_of(set(unknown), "hyper")
                if owner:
                    raise ValueError(
                        f"{at} holds {', '.join(unknown)}: hyperparameters of {owner}, not of {name} "
                        "(is this the state_dict of another optimizer?)"
                    )
                raise ValueError(
                    f"{at} has unknown key(s) {', '.join(map(repr, unknown))}; {name} keeps "
                    f"{', '.join(self.defaults)}"
                )
            values = self._check_group({**self.added_hyper, **{k: saved[k] for k in keys}}, at)
            new_groups.append(values)
            merged = {**group, **values}
            for j, p in zip(indices, group["params"]):
                j = int(j)
                if j in param_of:
                    raise ValueError(f"{at}: parameter index {j} is listed more than once")
                param_of[j] = p
                group_of[j] = merged
        state = state_dict["state"]
        if not isinstance(state, Mapping):
            raise TypeError(
                f"{where}: 'state' must be a dict of parameter index -> dict, got {type(state).__name__}"
            )
        new_state: dict[int, dict[str, Any]] = {}
        for key, st in state.items():
            idx = _state_index(key)
            if idx is None:
                raise TypeError(f"{where}: state key {key!r} is not a parameter index (an int)")
            at = f"{where}: state[{idx}]"
            if idx not in param_of:
                raise ValueError(
                    f"{at}: optimizer state names parameter {idx}, but no parameter group lists it "
                    f"(they list {len(param_of)} parameters)"
                )
            if not isinstance(st, Mapping):
                raise TypeError(f"{at} must be a dict of 'step' and state tensors, got {type(st).__name__}")
            unknown = sorted(k for k in st if k not in ("step", "master") and k not in self.slot_names)
            if unknown:
                owner = _owners_of(set(unknown), "slots")
                if owner:
                    raise ValueError(
                        f"{at} holds {', '.join(unknown)}: state of {owner}, not of {name} "
                        "(is this the state_dict of another optimizer?)"
                    )
                raise ValueError(
                    f"{at} has unknown entries {', '.join(map(repr, unknown))}; {name} keeps 'step' and "
                    f"{', '.join(self.slot_names) or 'no tensors'}"
                )
            step = Count(0)(st.get("step", 0), f"{at}['step']")
            p = param_of[idx]
            entry: dict[str, Any] = {"step": step}
            half = dtypes.is_half(p.value.dtype)
            if "master" in st and not half:
                raise ValueError(f"{at} holds 'master' weights, kept only for float16/bfloat16 parameters; "
                                 f"this parameter is {p.value.dtype}")
            for slot in self.slot_names + (("master",) if half else ()):
                if st.get(slot) is None:
                    continue
                arr = st[slot]
                try:
                    arr = arr.to_host() if isinstance(arr, Tensor) else np.asarray(arr)
                except (TypeError, ValueError):
                    raise TypeError(f"{at}[{slot!r}] is not an array: {type(arr).__name__}") from None
                if not dtypes.is_floating(arr.dtype):
                    raise DTypeError(
                        f"{at}[{slot!r}] has dtype {arr.dtype}; optimizer state is floating point "
                        f"(the parameter is {p.value.dtype})"
                    )
                if arr.shape != p.value.shape:
                    raise ShapeError(
                        f"{at}: optimizer state {slot!r} of parameter {idx} has shape {arr.shape}, "
                        f"the parameter has shape {p.value.shape}"
                    )
                entry[slot] = arr.astype(state_dtype(p.value.dtype), copy=False)
            if step > 0:
                missing = [
                    n for n in self._state_names(group_of[idx]) if n not in entry and n not in self.lazy_state
                ]
                if missing:
                    raise ValueError(
                        f"{at} has taken {step} steps but holds no {', '.join(map(repr, missing))}, which "
                        f"{name} needs with these hyperparameters"
                    )
            new_state[id(p)] = entry
        return _Loaded(new_groups, new_state)

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({hyper})"


def _group_dicts(params: Any, name: str) -> list[Mapping[str, Any]]:
    """The parameter groups given to a constructor: a list of Parameters is one group."""
    what = f"{name}: params must be an iterable of Parameters or of parameter-group dicts"
    if isinstance(params, (Node, Tensor)):
        raise TypeError(f"{what}, got a single {type(params).__name__}; pass a list: [param]")
    if isinstance(params, Mapping):
        raise TypeError(f"{what}, got a single dict; pass a list of groups: [{{'params': [...], ...}}]")
    if isinstance(params, (set, frozenset)):
        raise TypeError(f"{what} in a fixed order (a list), not a set: a set's order changes between runs")
    if isinstance(params, (str, bytes, np.ndarray)):
        raise TypeError(f"{what}, got {type(params).__name__}")
    try:
        items = list(params)
    except TypeError:
        raise TypeError(f"{what}, got {type(params).__name__}") from None
    if not items:
        raise ValueError(f"{name}: optimizer got an empty parameter list")
    dicts = [isinstance(g, Mapping) for g in items]
    if any(dicts) and not all(dicts):
        i = dicts.index(not dicts[0])
        raise TypeError(
            f"{name}: params[{i}] is a {type(items[i]).__name__} but params[0] is a "
            f"{type(items[0]).__name__}; give a list of Parameters or a list of parameter-group dicts"
        )
    return items if dicts[0] else [{"params": items}]


def _group_params(value: Any, where: str, seen: dict[int, int], index: int) -> list[Node]:
    """A group's 'params' as a list of distinct leaf Nodes (a single Parameter is a list of one)."""
    if isinstance(value, Node):
        value = [value]
    elif isinstance(value, (set, frozenset)):
        raise TypeError(f"{where}: 'params' must be in a fixed order (a list), not a set")
    elif isinstance(value, (str, bytes, Mapping, Tensor, np.ndarray)):
        raise TypeError(f"{where}: 'params' must be a list of Parameters, got {type(value).__name__}")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(
            f"{where}: 'params' must be a list of Parameters, got {type(value).__name__}"
        ) from None
    for j, p in enumerate(items):
        if not isinstance(p, Node):
            hint = "; wrap a Tensor as netcl.autograd.Parameter(t)" if isinstance(p, Tensor) else ""
            raise TypeError(
                f"{where}: params[{j}] is a {type(p).__name__}; optimizers take Parameters "
                f"(netcl.autograd.Parameter){hint}"
            )
        if not p.is_leaf:
            raise ValueError(
                f"{where}: params[{j}] is not a leaf of the graph (it was computed by {p._op!r}); "
                "optimizers update leaves such as Parameters"
            )
        if id(p) in seen:
            if seen[id(p)] == index:
                raise ValueError(f"{where}: params[{j}] appears twice in this parameter group")
            raise ValueError(
                f"{where}: params[{j}] is also in param_groups[{seen[id(p)]}]: a parameter cannot be in "
                "more than one parameter group"
            )
        seen[id(p)] = index
    return items


def _state_index(key: Any) -> int | None:
    """A state key as a parameter index: an int, or its decimal string (a state_dict that went
    through JSON)."""
    if is_count(key) and key >= 0:
        return int(key)
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return None


def _owners_of(names: set[str], what: str) -> str:
    """'Adam/AdamW': the optimizer classes whose hyperparameters (or state tensors) include `names`."""
    found: list[str] = []
    todo = list(Optimizer.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        have = set(cls.hyper) if what == "hyper" else set(cls.slot_names)
        if names <= have and cls.__name__ not in found:
            found.append(cls.__name__)
    return "/".join(found)


def _bias_corrections(beta1: float, beta2: float, step: int) -> tuple[float, float]:
    return 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)

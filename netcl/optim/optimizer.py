"""Optimizer base: parameter groups, per-parameter state, fused update launches, state_dict.

Each step launches kernels/optim.cl's `optimizer_step` once per chunk of up to 8 parameters that
share a queue, a dtype and a step count (so usually once or twice per step for a whole model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from netcl.autograd import kernels
from netcl.autograd.engine import Node
from netcl.core import backend
from netcl.core.tensor import Tensor
from netcl.errors import NetclError, ShapeError

MAX_TENSORS_PER_LAUNCH = 8


class Optimizer:
    """Base class: subclasses set `kind` (kernel OPT code), `state_names` and `_hyper(group, step)`."""

    kind = 0
    state_names: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups: list[dict[str, Any]] = []
        seen: set[int] = set()
        for g in groups:
            group = dict(self.defaults)
            group.update(g)
            group["params"] = list(g["params"])
            for p in group["params"]:
                if not isinstance(p, Node):
                    raise TypeError(f"optimizers take Parameters (Nodes), got {type(p).__name__}")
                if id(p) in seen:
                    raise ValueError("a parameter appears in more than one parameter group")
                seen.add(id(p))
            self.param_groups.append(group)
        # per parameter: {"step": int, name: Tensor | None}
        self.state: dict[int, dict[str, Any]] = {}

    # -- user API -------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the accumulated gradients (set_to_none=False fills them with zeros instead)."""
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.fill_(0)

    def step(self) -> None:
        """Update every parameter that has a gradient (one fused launch per chunk of parameters)."""
        for group in self.param_groups:
            chunks: dict[tuple, list[tuple[Node, dict[str, Any]]]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self._state_for(p)
                key = self._chunk_key(p, st)
                chunks.setdefault(key, []).append((p, st))
            for (queue_id, dtype, step, *_), items in chunks.items():
                for start in range(0, len(items), MAX_TENSORS_PER_LAUNCH):
                    self._launch(group, items[start : start + MAX_TENSORS_PER_LAUNCH], step + 1)
                for _, st in items:
                    st["step"] = step + 1

    # -- machinery --------------------------------------------------------------------------------
    def _chunk_key(self, p: Node, st: dict[str, Any]) -> tuple:
        return (id(p.value.queue), str(p.value.dtype), st["step"])

    def _state_for(self, p: Node) -> dict[str, Any]:
        st = self.state.get(id(p))
        if st is None:
            st = {"step": 0}
            with backend.capture_paused():  # made once: a graph replay must not zero it again
                for name in self.state_names:
                    st[name] = Tensor.zeros(p.value.queue, p.value.shape, p.value.dtype)
            self.state[id(p)] = st
        return st

    def _slots(self, st: dict[str, Any]) -> list[Any]:
        """State tensors in the kernel's slot order (sa, sb, sc)."""
        return [st.get(name) for name in self.state_names]

    def _hyper(self, group: dict[str, Any], step: int, scalar: type, items: list) -> tuple:
        raise NotImplementedError

    def _launch(self, group: dict[str, Any], items: list[tuple[Node, dict[str, Any]]], step: int) -> None:
        p0 = items[0][0].value
        queue = p0.queue
        defines = kernels.float_defines(p0.dtype, type(self).__name__)
        items_per = 1 if queue.device.capabilities.kind == "gpu" else 64
        defines.update(N_TENSORS=len(items), OPT=self.kind, ITEMS=items_per)
        prg = kernels.program(queue.device, "optim.cl", defines)
        args: list[Any] = []
        total = 0
        keep = []
        for p, st in items:
            v = p.value
            if not v.is_contiguous():
                raise NetclError(f"{type(self).__name__}: parameter of shape {v.shape} is not contiguous")
            g = p.grad
            if g.shape != v.shape:
                raise ShapeError(
                    f"{type(self).__name__}: gradient of shape {g.shape} for a parameter of shape {v.shape}"
                )
            if g.dtype != v.dtype or g.queue is not queue:
                raise NetclError(
                    f"{type(self).__name__}: gradient ({g.dtype}, {g.queue!r}) does not match "
                    f"its parameter ({v.dtype}, {queue!r})"
                )
            g = g if g.is_contiguous() else g.contiguous()
            keep.append(g)
            states = self._slots(st)
            bufs = [s.buffer if s is not None else v.buffer for s in states]
            bufs += [v.buffer] * (3 - len(bufs))
            args += [v.buffer, np.int64(v.offset), g.buffer, np.int64(g.offset), *bufs, np.int64(v.size)]
            total += -(-v.size // items_per)
        scalar = kernels.scalar_type(p0.dtype)
        fixed = len(args)
        args += self._hyper(group, step, scalar, items)
        if total:
            prg.optimizer_step(queue, (total,), None, *args)
            graph = backend.capturing()
            if graph is not None:  # each replay is the next step: new step count, current lr
                graph.on_replay(lambda a: self._replay_step(a, fixed, group, scalar, items))

    def _replay_step(self, args: list, fixed: int, group: dict[str, Any], scalar: type, items: list) -> None:
        """Before a graph replays this launch: advance the step count of its parameters and put the
        hyperparameters of that step (the group's current lr, bias corrections) into its arguments."""
        step = items[0][1]["step"] + 1
        args[fixed:] = self._hyper(group, step, scalar, items)
        for _, st in items:
            st["step"] = step

    # -- state -------------------------------------------------------------------------------------
    def _index(self) -> list[Node]:
        return [p for g in self.param_groups for p in g["params"]]

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
        """Restore hyperparameters and state saved by state_dict() (shapes are checked)."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"state_dict has {len(groups)} parameter groups, this optimizer has {len(self.param_groups)}"
            )
        for saved, group in zip(groups, self.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"a saved parameter group has {len(saved['params'])} parameters, "
                    f"this one has {len(group['params'])}"
                )
        params = self._index()
        new_state: dict[int, dict[str, Any]] = {}
        for idx, st in state_dict["state"].items():
            idx = int(idx)
            if not 0 <= idx < len(params):
                raise ValueError(f"optimizer state names parameter {idx}, but there are {len(params)}")
            p = params[idx]
            entry: dict[str, Any] = {"step": int(st.get("step", 0))}
            for name in self.state_names:
                arr = st.get(name)
                if arr is None:
                    entry[name] = (
                        None
                        if name == "momentum_buffer"
                        else Tensor.zeros(p.value.queue, p.value.shape, p.value.dtype)
                    )
                    continue
                arr = arr.to_host() if isinstance(arr, Tensor) else np.asarray(arr)
                if arr.shape != p.value.shape:
                    raise ShapeError(
                        f"optimizer state {name!r} of parameter {idx} has shape {arr.shape}, "
                        f"the parameter has shape {p.value.shape}"
                    )
                entry[name] = Tensor.from_host(p.value.queue, arr.astype(p.value.dtype, copy=False))
            new_state[id(p)] = entry
        for saved, group in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = v
        self.state = new_state

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({hyper})"


def _bias_corrections(beta1: float, beta2: float, step: int) -> tuple[float, float]:
    return 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)

"""GradScaler: dynamic loss scaling with torch.amp.GradScaler's semantics, kept on the device.

The scale, the growth tracker and each optimizer's found-inf flag are device tensors. `unscale_` is one
launch per chunk of 8 gradients (kernels/optim.cl unscale_grads: multiply by 1/scale and flag any
inf/NaN), `step` hands the flag to the optimizer's own update kernel, which does nothing when it is set,
and `update` is one launch (update_scale). Nothing is read back, so a scaled step can be recorded in a
netcl.graph.Graph and replayed (sync=True reads the flag instead and skips on the host, as PyTorch does).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import ops
from netcl.autograd.engine import Node, Tape
from netcl.core import capture, dtypes
from netcl.core.tensor import Tensor
from netcl.errors import NetclError
from netcl.ops import update


def _number(value: Any, what: str, low: float, high: float | None = None, *, low_open: bool = True,
            high_open: bool = True) -> float:
    """A finite real number in (low, high) (closed ends when asked), or TypeError/ValueError naming `what`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    v = float(value)
    bad = not math.isfinite(v) or (v <= low if low_open else v < low)
    if high is not None:
        bad = bad or (v >= high if high_open else v > high)
    if bad:
        right = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
        span = f"{'(' if low_open else '['}{low:g}, {right}"
        raise ValueError(f"{what} must be a finite number in {span}, got {value!r}")
    return v


def _count(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value}")
    return int(value)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True or False, got {type(value).__name__}")
    return bool(value)


class GradScaler:
    """Multiply the loss by `scale` before backward so float16 gradients do not underflow; unscale them
    before the optimizer steps; skip steps whose gradients hold inf/NaN and back the scale off, grow it
    after `growth_interval` clean steps.

        scaler = GradScaler()
        with amp.autocast("float16"), ag.Tape() as tape:
            loss = ag.cross_entropy(model(x), y)
        tape.backward(scaler.scale(loss))
        scaler.step(opt)           # unscales (unless unscale_ ran), then steps unless found_inf
        scaler.update()

    Differences from PyTorch, by design: a skipped step is skipped inside the update kernel, so the
    optimizer's host step count still advances (Adam's bias corrections then run one step ahead after a
    skip); sync=True reads the flag and skips on the host instead (not inside a recorded graph).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, sync: bool = False):
        if isinstance(init_scale, str):
            raise TypeError(f"GradScaler: init_scale must be a number, got str {init_scale!r} (PyTorch's "
                            "GradScaler takes a device type first; netcl's scale lives on the loss's own "
                            "device: GradScaler() or GradScaler(init_scale=...))")
        self._init_scale = _number(init_scale, "GradScaler: init_scale", 0)
        self._growth_factor = _number(growth_factor, "GradScaler: growth_factor", 1)
        self._backoff_factor = _number(backoff_factor, "GradScaler: backoff_factor", 0, 1)
        self._growth_interval = _count(growth_interval, "GradScaler: growth_interval", 1)
        self._enabled = _flag(enabled, "GradScaler: enabled")
        self._sync = _flag(sync, "GradScaler: sync")
        self._scale: Tensor | None = None
        self._growth_tracker: Tensor | None = None
        self._init_tracker = 0
        self._found_inf: dict[int, Tensor] = {}  # id(optimizer) -> its flag (int32, shape (1,))
        self._stage: dict[int, str] = {}  # id(optimizer) -> "unscaled" | "stepped" in the current step

    # -- the step -------------------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def _lazy_init(self, queue: Any) -> None:
        if self._scale is None:
            with capture.capture_paused():  # made once: a replay must not reset the scale
                self._scale = Tensor.full(queue, (1,), self._init_scale, dtypes.float32)
                self._growth_tracker = Tensor.full(queue, (1,), self._init_tracker, dtypes.int32)

    def scale(self, outputs: Any) -> Any:
        """outputs * scale (a Node, a Tensor, or a list/tuple of them); the identity when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        value = outputs.value if isinstance(outputs, Node) else outputs
        if not isinstance(value, Tensor) or not dtypes.is_floating(value.dtype):
            raise TypeError("GradScaler.scale: outputs must be floating Nodes or Tensors, got "
                            f"{type(outputs).__name__}")
        self._lazy_init(value.queue)
        if isinstance(outputs, Node) and outputs.requires_grad:
            with (
                Tape()
            ):  # recorded even after the forward's tape closed (`tape.backward(scaler.scale(loss))`)
                return outputs * self._scale
        return outputs * self._scale

    def _grads(self, optimizer: Any) -> list[Tensor]:
        return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale in place and flag inf/NaN among them on the device
        (at most once per optimizer between update() calls, as PyTorch)."""
        if not self._enabled:
            return
        stage = self._stage.get(id(optimizer))
        if stage == "unscaled":
            raise NetclError(
                "GradScaler.unscale_() has already been called on this optimizer since the last update()"
            )
        if stage == "stepped":
            raise NetclError("GradScaler.unscale_() is being called after step(); call update() first")
        grads = self._grads(optimizer)
        if self._scale is None:
            raise NetclError(
                "GradScaler.unscale_: scale() was never called, so there is no scaled loss to undo"
            )
        flag = self._found_inf.get(id(optimizer))
        if flag is None:
            with capture.capture_paused():
                flag = self._found_inf[id(optimizer)] = Tensor.zeros(self._scale.queue, (1,), dtypes.int32)
        flag.fill_(0)
        update.unscale_grads([g if g.is_contiguous() else g.contiguous() for g in grads], self._scale, flag)
        self._stage[id(optimizer)] = "unscaled"

    def step(self, optimizer: Any) -> None:
        """unscale_ (unless done), then optimizer.step(found_inf=flag): a step whose gradients hold inf/NaN
        changes nothing. With sync=True the flag is read and optimizer.step() is skipped on the host."""
        if not self._enabled:
            optimizer.step()
            return
        if self._stage.get(id(optimizer)) == "stepped":
            raise NetclError(
                "GradScaler.step() has already been called on this optimizer since the last update()"
            )
        if self._stage.get(id(optimizer)) != "unscaled":
            self.unscale_(optimizer)
        flag = self._found_inf[id(optimizer)]
        if self._sync:
            if not int(flag.to_host()[0]):
                optimizer.step()
        else:
            optimizer.step(found_inf=flag)
        self._stage[id(optimizer)] = "stepped"

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Back the scale off by backoff_factor if any optimizer's gradients overflowed this step, else count
        a clean step and grow it by growth_factor every growth_interval of them (one launch); or set it to
        `new_scale`."""
        if not self._enabled or self._scale is None:
            return
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                self._scale.copy_(new_scale.astype(dtypes.float32).reshape(1))
            else:
                self._scale.fill_(_number(new_scale, "GradScaler.update: new_scale", 0))
        elif self._found_inf:
            flags = [self._found_inf[k] for k in self._stage if k in self._found_inf]
            if flags:
                found = flags[0]
                for other in flags[1:]:  # several optimizers: any overflow backs the scale off
                    found = ops.maximum(found, other).realize()
                update.update_scale(self._scale, self._growth_tracker, found, self._growth_factor,
                                    self._backoff_factor, self._growth_interval)
        self._stage.clear()

    # -- inspection and resume -----------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (reads the device: one host sync); init_scale before the first scale()."""
        if not self._enabled:
            return 1.0
        return float(self._scale.to_host()[0]) if self._scale is not None else float(self._init_scale)

    def found_inf(self, optimizer: Any) -> Tensor | None:
        """The optimizer's found-inf flag of this step (int32 Tensor of shape (1,)), None before unscale_."""
        return self._found_inf.get(id(optimizer))

    def get_growth_factor(self) -> float:
        return float(self._growth_factor)

    def get_backoff_factor(self) -> float:
        return float(self._backoff_factor)

    def get_growth_interval(self) -> int:
        return int(self._growth_interval)

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker ({} when
        disabled)."""
        if not self._enabled:
            return {}
        tracker = (
            int(self._growth_tracker.to_host()[0]) if self._growth_tracker is not None else self._init_tracker
        )
        return {"scale": self.get_scale(), "growth_factor": float(self._growth_factor),
                "backoff_factor": float(self._backoff_factor), "growth_interval": int(self._growth_interval),
                "_growth_tracker": tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what state_dict() saved (every field checked before anything changes)."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict) or not state_dict:
            raise ValueError(
                "GradScaler.load_state_dict: expected the non-empty dict GradScaler.state_dict() returns"
            )
        need = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
        missing = [k for k in need if k not in state_dict]
        if missing:
            raise ValueError(f"GradScaler.load_state_dict: the state_dict has no {', '.join(missing)}")
        where = "GradScaler.load_state_dict"
        scale = _number(state_dict["scale"], f"{where}: scale", 0)
        growth = _number(state_dict["growth_factor"], f"{where}: growth_factor", 1)
        backoff = _number(state_dict["backoff_factor"], f"{where}: backoff_factor", 0, 1)
        interval = _count(state_dict["growth_interval"], f"{where}: growth_interval", 1)
        tracker = _count(state_dict["_growth_tracker"], f"{where}: _growth_tracker", 0)
        self._init_scale, self._growth_factor, self._backoff_factor = scale, growth, backoff
        self._growth_interval, self._init_tracker = interval, tracker
        if self._scale is not None:
            self._scale.fill_(scale)
            self._growth_tracker.fill_(tracker)

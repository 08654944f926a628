"""Learning-rate schedulers: StepLR, CosineAnnealing, WarmupCosine, OneCycle, ReduceLROnPlateau, and
PyTorch's MultiStepLR, ExponentialLR, LinearLR, ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts,
LambdaLR, SequentialLR.

Each sets `group['lr']` of its optimizer; call `step()` once per epoch (or per batch for the
per-step schedules). Every scheduler has state_dict()/load_state_dict() of plain numbers.
Settings are checked in the constructor and again in load_state_dict (sizes are integers, never
truncated: TypeError for 2.5 or '10'; ValueError for values out of range), before anything changes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from netcl.core import capture
from netcl.optim.arguments import Choice, Count, Flag, Real, Reals
from netcl.optim.optimizer import Optimizer

Check = Callable[[Any, str], Any]


def _check_optimizer(name: str, optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{name}: optimizer must be a netcl Optimizer, got {type(optimizer).__name__}")


class _StateChecks:
    """state_dict()/load_state_dict() for schedulers whose state is their attributes; load_state_dict
    checks every entry with the rule of its attribute (`_rules()`) and the rules between them
    (`_check_combination`) before it changes anything."""

    optimizer: Optimizer

    def _rules(self) -> dict[str, Check]:
        raise NotImplementedError

    def _check_combination(self, values: dict[str, Any], where: str) -> None:
        """Rules between settings (subclasses)."""

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def _check_state_dict(self, state: Any) -> dict[str, Any]:
        """The checked state (lists copied), or TypeError/ValueError naming the entry; changes nothing."""
        name = type(self).__name__
        where = f"{name}.load_state_dict"
        if not isinstance(state, Mapping):
            raise TypeError(
                f"{where}: state must be a dict (what state_dict() returns), got {type(state).__name__}"
            )
        rules = self._rules()
        unknown = sorted(k for k in state if k not in rules and k != "optimizer")
        if unknown:
            raise ValueError(
                f"{where}: unknown entries {', '.join(map(repr, unknown))} (is this the state of another "
                f"scheduler?); {name} keeps {', '.join(rules)}"
            )
        missing = [k for k in rules if k not in state]
        if missing:
            raise ValueError(f"{where}: state has no {', '.join(map(repr, missing))}")
        values = {k: rule(state[k], f"{where}: {k}") for k, rule in rules.items()}
        self._check_combination(values, where)
        return values

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned (checked first: on error nothing changes)."""
        values = self._check_state_dict(state)
        self.__dict__.update(values)
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


class LRScheduler(_StateChecks):
    """Closed-form schedule: lr_i = f(base_lr_i, step). `last_epoch` counts step() calls."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        name = type(self).__name__
        _check_optimizer(name, optimizer)
        last_epoch = Count(-1)(last_epoch, f"{name}: last_epoch")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def step(self) -> None:
        capture.host_step(f"{type(self).__name__}.step()")  # (a recorded step would run it only once)
        self.last_epoch += 1
        self.refresh()

    def refresh(self) -> None:
        """Set each group's lr for the current step (again, after a change to the schedule itself: a
        longer T_max when a resumed run trains further)."""
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(base, self.last_epoch, group)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _rules(self) -> dict[str, Check]:
        n = len(self.optimizer.param_groups)
        return {
            "base_lrs": Reals(Real(0), n),
            "last_epoch": Count(-1),
            "_last_lr": Reals(Real(0), n),
        }


class StepLR(LRScheduler):
    """lr = base * gamma ** (epoch // step_size); step_size an integer >= 1, gamma a number >= 0."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        _check_optimizer("StepLR", optimizer)
        self.step_size = Count(1)(step_size, "StepLR: step_size")
        self.gamma = float(Real(0)(gamma, "StepLR: gamma"))
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return base_lr * self.gamma ** (step // self.step_size)

    def _rules(self) -> dict[str, Check]:
        return {"step_size": Count(1), "gamma": Real(0), **super()._rules()}


class CosineAnnealing(LRScheduler):
    """lr = eta_min + (base - eta_min) (1 + cos(pi t / T_max)) / 2 (PyTorch's closed form), periodic in t.

    T_max is an integer >= 1, eta_min a number >= 0."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        _check_optimizer("CosineAnnealing", optimizer)
        self.T_max = Count(1)(T_max, "CosineAnnealing: T_max")
        self.eta_min = float(Real(0)(eta_min, "CosineAnnealing: eta_min"))
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2

    def _rules(self) -> dict[str, Check]:
        return {"T_max": Count(1), "eta_min": Real(0), **super()._rules()}


CosineAnnealingLR = CosineAnnealing


class WarmupCosine(LRScheduler):
    """Linear warm-up over `warmup_steps` (lr = base (t + 1) / warmup_steps), then cosine decay to
    eta_min at `total_steps`, and eta_min after. Integers 0 <= warmup_steps < total_steps."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int,
        total_steps: int,
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ):
        _check_optimizer("WarmupCosine", optimizer)
        values = {
            "warmup_steps": Count(0)(warmup_steps, "WarmupCosine: warmup_steps"),
            "total_steps": Count(1)(total_steps, "WarmupCosine: total_steps"),
        }
        self._check_combination(values, "WarmupCosine")
        self.warmup_steps = values["warmup_steps"]
        self.total_steps = values["total_steps"]
        self.eta_min = float(Real(0)(eta_min, "WarmupCosine: eta_min"))
        super().__init__(optimizer, last_epoch)

    def _check_combination(self, values: dict[str, Any], where: str) -> None:
        if values["total_steps"] <= values["warmup_steps"]:
            raise ValueError(
                f"{where} needs 0 <= warmup_steps < total_steps, got {values['warmup_steps']}, "
                f"{values['total_steps']}"
            )

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        if step < self.warmup_steps:
            return base_lr * (step + 1) / self.warmup_steps
        if step >= self.total_steps:
            return self.eta_min
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * progress)) / 2

    def _rules(self) -> dict[str, Check]:
        return {"warmup_steps": Count(0), "total_steps": Count(1), "eta_min": Real(0), **super()._rules()}


class OneCycle(LRScheduler):
    """PyTorch's OneCycleLR (two phases, cosine or linear annealing): from max_lr / div_factor up to
    max_lr over pct_start of total_steps, then down to initial / final_div_factor. With
    cycle_momentum, momentum (or Adam's beta1) moves the opposite way between base and max.

    max_lr is a number >= 0 or one per parameter group; total_steps an integer >= 1; pct_start in
    [0, 1]; div_factor and final_div_factor > 0; the momenta >= 0 (< 1 where they become beta1)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | list[float],
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        last_epoch: int = -1,
    ):
        _check_optimizer("OneCycle", optimizer)
        Count(-1)(last_epoch, "OneCycle: last_epoch")  # checked before the groups are written to
        groups = optimizer.param_groups
        if isinstance(max_lr, (list, tuple)):
            max_lrs = Reals(Real(0), len(groups))(max_lr, "OneCycle: max_lr (one per parameter group)")
        else:
            max_lrs = [Real(0)(max_lr, "OneCycle: max_lr")] * len(groups)
        total_steps = Count(1)(total_steps, "OneCycle: total_steps")
        pct_start = Real(0, 1)(pct_start, "OneCycle: pct_start")
        anneal_strategy = Choice("cos", "linear")(anneal_strategy, "OneCycle: anneal_strategy")
        cycle_momentum = Flag()(cycle_momentum, "OneCycle: cycle_momentum")
        div_factor = Real(0, low_open=True)(div_factor, "OneCycle: div_factor")
        final_div_factor = Real(0, low_open=True)(final_div_factor, "OneCycle: final_div_factor")
        self.cycle_momentum = cycle_momentum and any(("momentum" in g or "betas" in g) for g in groups)
        # the momenta become Adam's beta1 (in [0, 1)) or SGD/RMSProp's momentum (>= 0)
        betas = self.cycle_momentum and any("betas" in g for g in groups)
        momentum = Real(0, 1, high_open=True) if betas else Real(0)
        self.base_momentum = momentum(base_momentum, "OneCycle: base_momentum")
        self.max_momentum = momentum(max_momentum, "OneCycle: max_momentum")
        self.total_steps = total_steps
        self.anneal_strategy = anneal_strategy
        self.phase_ends = [float(pct_start * total_steps) - 1, float(total_steps - 1)]
        for g, m in zip(groups, max_lrs):
            g["initial_lr"] = m / div_factor
            g["max_lr"] = m
            g["min_lr"] = g["initial_lr"] / final_div_factor
        self.max_lrs = list(max_lrs)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, step: int) -> tuple[int, float]:
        start = 0.0
        for i, end in enumerate(self.phase_ends):
            if step <= end or i == len(self.phase_ends) - 1:
                return i, (step - start) / (end - start) if end != start else 1.0
            start = end
        raise AssertionError("unreachable")

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        i, pct = self._phase(step)
        if i == 0:
            return self._anneal(group["initial_lr"], group["max_lr"], pct)
        return self._anneal(group["max_lr"], group["min_lr"], pct)

    def step(self) -> None:
        if self.last_epoch + 1 > self.total_steps:
            raise ValueError(f"OneCycle was stepped past total_steps={self.total_steps}")
        super().step()
        if self.cycle_momentum:
            i, pct = self._phase(self.last_epoch)
            m = (
                self._anneal(self.max_momentum, self.base_momentum, pct)
                if i == 0
                else self._anneal(self.base_momentum, self.max_momentum, pct)
            )
            for g in self.optimizer.param_groups:
                if "betas" in g:
                    g["betas"] = (m, g["betas"][1])
                elif "momentum" in g:
                    g["momentum"] = m

    def _rules(self) -> dict[str, Check]:
        n = len(self.optimizer.param_groups)
        return {
            "total_steps": Count(1),
            "anneal_strategy": Choice("cos", "linear"),
            "phase_ends": Reals(Real(-1), 2),
            "max_lrs": Reals(Real(0), n),
            "cycle_momentum": Flag(),
            "base_momentum": Real(0),
            "max_momentum": Real(0),
            **super()._rules(),
        }

    def _check_combination(self, values: dict[str, Any], where: str) -> None:
        if values["cycle_momentum"] and any("betas" in g for g in self.optimizer.param_groups):
            for key in ("base_momentum", "max_momentum"):
                Real(0, 1, high_open=True)(values[key], f"{where}: {key} (it becomes beta1)")
        start, end = values["phase_ends"]
        if not start <= end == values["total_steps"] - 1:
            raise ValueError(
                f"{where}: phase_ends {values['phase_ends']} do not fit total_steps={values['total_steps']} "
                f"(they are [pct_start * total_steps - 1, total_steps - 1])"
            )


OneCycleLR = OneCycle


# -- PyTorch's other closed-form schedules -----------------------------------------------------------------
class _Milestones:
    """A list of step numbers (integers >= 0), kept sorted; `increasing`: each larger than the last."""

    def __init__(self, increasing: bool = False):
        self.increasing = increasing

    def __call__(self, value: Any, what: str) -> list[int]:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{what} must be a list of integers >= 0, got {type(value).__name__} {value!r}")
        steps = [Count(0)(v, f"{what}[{i}]") for i, v in enumerate(value)]
        if self.increasing and any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"{what} must increase, got {steps}")
        return sorted(steps)


class MultiStepLR(LRScheduler):
    """lr = base * gamma ** (the number of milestones <= step); a milestone listed twice counts twice, as in
    PyTorch. milestones integers >= 0, gamma a number >= 0."""

    def __init__(self, optimizer: Optimizer, milestones: list[int], gamma: float = 0.1, last_epoch: int = -1):
        _check_optimizer("MultiStepLR", optimizer)
        self.milestones = _Milestones()(milestones, "MultiStepLR: milestones")
        self.gamma = float(Real(0)(gamma, "MultiStepLR: gamma"))
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)

    def _rules(self) -> dict[str, Check]:
        return {"milestones": _Milestones(), "gamma": Real(0), **super()._rules()}


class ExponentialLR(LRScheduler):
    """lr = base * gamma ** step; gamma a number >= 0."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        _check_optimizer("ExponentialLR", optimizer)
        self.gamma = float(Real(0)(gamma, "ExponentialLR: gamma"))
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return base_lr * self.gamma**step

    def _rules(self) -> dict[str, Check]:
        return {"gamma": Real(0), **super()._rules()}


class LinearLR(LRScheduler):
    """lr = base * (start_factor + (end_factor - start_factor) min(step, total_iters) / total_iters): a linear
    warm-up (or decay) over total_iters steps, then constant. start_factor in (0, 1], end_factor in [0, 1],
    total_iters an integer >= 1."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        _check_optimizer("LinearLR", optimizer)
        self.start_factor = float(Real(0, 1, low_open=True)(start_factor, "LinearLR: start_factor"))
        self.end_factor = float(Real(0, 1)(end_factor, "LinearLR: end_factor"))
        self.total_iters = Count(1)(total_iters, "LinearLR: total_iters")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        done = min(step, self.total_iters) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)

    def _rules(self) -> dict[str, Check]:
        return {"start_factor": Real(0, 1, low_open=True), "end_factor": Real(0, 1), "total_iters": Count(1),
                **super()._rules()}


class ConstantLR(LRScheduler):
    """lr = base * factor for the first total_iters steps, then base. factor in [0, 1], total_iters an
    integer >= 0."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1):
        _check_optimizer("ConstantLR", optimizer)
        self.factor = float(Real(0, 1)(factor, "ConstantLR: factor"))
        self.total_iters = Count(0)(total_iters, "ConstantLR: total_iters")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return base_lr * self.factor if step < self.total_iters else base_lr

    def _rules(self) -> dict[str, Check]:
        return {"factor": Real(0, 1), "total_iters": Count(0), **super()._rules()}


class PolynomialLR(LRScheduler):
    """lr = base * (1 - min(step, total_iters) / total_iters) ** power: 0 from total_iters on. total_iters an
    integer >= 1, power a number >= 0."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1):
        _check_optimizer("PolynomialLR", optimizer)
        self.total_iters = Count(1)(total_iters, "PolynomialLR: total_iters")
        self.power = float(Real(0)(power, "PolynomialLR: power"))
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return base_lr * (1.0 - min(step, self.total_iters) / self.total_iters) ** self.power

    def _rules(self) -> dict[str, Check]:
        return {"total_iters": Count(1), "power": Real(0), **super()._rules()}


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR: a cosine from base down to eta_min over T_0 steps, then again from base over T_0 T_mult steps,
    T_0 T_mult^2, ... (lr = eta_min + (base - eta_min) (1 + cos(pi t / T_i)) / 2, t the steps since the last
    restart). T_0 and T_mult integers >= 1, eta_min a number >= 0."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1):
        _check_optimizer("CosineAnnealingWarmRestarts", optimizer)
        self.T_0 = Count(1)(T_0, "CosineAnnealingWarmRestarts: T_0")
        self.T_mult = Count(1)(T_mult, "CosineAnnealingWarmRestarts: T_mult")
        self.eta_min = float(Real(0)(eta_min, "CosineAnnealingWarmRestarts: eta_min"))
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        t, period = max(step, 0), self.T_0
        if self.T_mult == 1:
            t %= period
        while t >= period:
            t -= period
            period *= self.T_mult
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / period)) / 2

    def _rules(self) -> dict[str, Check]:
        return {"T_0": Count(1), "T_mult": Count(1), "eta_min": Real(0), **super()._rules()}


class LambdaLR(LRScheduler):
    """lr = base * lr_lambda(step): one function for every parameter group, or a list of one per group. The
    functions are code, not state: state_dict() leaves them out, as PyTorch's leaves out plain functions."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
                 last_epoch: int = -1):
        _check_optimizer("LambdaLR", optimizer)
        n = len(optimizer.param_groups)
        fns = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(fns) != n:
            raise ValueError(f"LambdaLR: lr_lambda is a list of {len(fns)} functions for {n} parameter "
                             "groups")
        for i, fn in enumerate(fns):
            if not callable(fn):
                raise TypeError(f"LambdaLR: lr_lambda{f'[{i}]' if n > 1 else ''} must be a function of the "
                                f"step, got {type(fn).__name__}")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        i = next(i for i, g in enumerate(self.optimizer.param_groups) if g is group)
        factor = Real(0)(self.lr_lambdas[i](step), f"LambdaLR: lr_lambda({step}) (a factor of the lr)")
        return base_lr * float(factor)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}


class SequentialLR(LRScheduler):
    """PyTorch's SequentialLR: `schedulers[0]` until milestones[0], then `schedulers[1]` counting its steps
    from 0 at that milestone, and so on (a warm-up, then a decay:
    SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=5), CosineAnnealingLR(opt, 95)], milestones=[5])).
    The schedulers are closed-form ones of the same optimizer (not OneCycleLR, whose step moves momentum);
    milestones one fewer than them, increasing."""

    def __init__(self, optimizer: Optimizer, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1):
        _check_optimizer("SequentialLR", optimizer)
        if not isinstance(schedulers, (list, tuple)) or not schedulers:
            raise TypeError(f"SequentialLR: schedulers must be a non-empty list of schedulers, got "
                            f"{type(schedulers).__name__}")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler) or type(s).step is not LRScheduler.step:
                raise TypeError(f"SequentialLR: schedulers[{i}] is a {type(s).__name__}; SequentialLR takes "
                                "closed-form schedulers (StepLR, LinearLR, CosineAnnealingLR, ...)")
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: schedulers[{i}] schedules another optimizer than the one "
                                 "given")
        self._milestones = _Milestones(increasing=True)(milestones, "SequentialLR: milestones")
        if len(self._milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} "
                             f"milestones, got {len(self._milestones)}")
        self._schedulers = list(schedulers)
        for group in optimizer.param_groups:   # (each scheduler's constructor stepped it: back to the start)
            group["lr"] = group["initial_lr"]
        super().__init__(optimizer, last_epoch)

    def _current(self, step: int) -> tuple[LRScheduler, int]:
        """The scheduler in charge at `step`, and its own step count there."""
        i = bisect.bisect_right(self._milestones, step)
        return self._schedulers[i], step - (self._milestones[i - 1] if i else 0)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        scheduler, local = self._current(step)
        return scheduler.lr_at(base_lr, local, group)

    def refresh(self) -> None:
        super().refresh()
        scheduler, local = self._current(self.last_epoch)
        scheduler.last_epoch, scheduler._last_lr = local, list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in super().state_dict().items() if k != "_schedulers"}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def _rules(self) -> dict[str, Check]:
        def schedulers(value: Any, what: str) -> list[dict[str, Any]]:
            if not isinstance(value, (list, tuple)) or len(value) != len(self._schedulers):
                raise ValueError(f"{what} must be a list of {len(self._schedulers)} schedulers' states")
            for i, (s, v) in enumerate(zip(self._schedulers, value)):
                try:
                    s._check_state_dict(v)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"{what}[{i}]: {exc}") from None
            return list(value)

        return {"_milestones": _Milestones(increasing=True), "_schedulers": schedulers, **super()._rules()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = self._check_state_dict(state)
        for s, sub in zip(self._schedulers, values.pop("_schedulers")):
            s.load_state_dict(sub)
        self.__dict__.update(values)
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


class ReduceLROnPlateau(_StateChecks):
    """Multiply lr by `factor` when the metric given to step(metric) has not improved (by threshold,
    'rel' or 'abs', in 'min' or 'max' mode) for `patience` epochs; then wait `cooldown` epochs.

    factor is in [0, 1); patience and cooldown integers >= 0; threshold, min_lr and eps numbers >= 0."""

    _SETTINGS: dict[str, Check] = {
        "mode": Choice("min", "max"),
        "factor": Real(0, 1, high_open=True),
        "patience": Count(0),
        "threshold": Real(0),
        "threshold_mode": Choice("rel", "abs"),
        "cooldown": Count(0),
        "min_lr": Real(0),
        "eps": Real(0),
    }

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
    ):
        _check_optimizer("ReduceLROnPlateau", optimizer)
        given = dict(
            mode=mode,
            factor=factor,
            patience=patience,
            threshold=threshold,
            threshold_mode=threshold_mode,
            cooldown=cooldown,
            min_lr=min_lr,
            eps=eps,
        )
        s = {k: rule(given[k], f"ReduceLROnPlateau: {k}") for k, rule in self._SETTINGS.items()}
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = s["mode"], float(s["factor"]), s["patience"]
        self.threshold, self.threshold_mode = float(s["threshold"]), s["threshold_mode"]
        self.cooldown, self.min_lr, self.eps = s["cooldown"], float(s["min_lr"]), float(s["eps"])
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    def _is_better(self, value: float) -> bool:
        if self.mode == "min":
            bound = (
                self.best * (1 - self.threshold)
                if self.threshold_mode == "rel"
                else self.best - self.threshold
            )
            return value < bound
        bound = (
            self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        )
        return value > bound

    def step(self, metric: float) -> None:
        """One epoch's metric: a number (or anything float() takes but a str or bool). NaN counts as no
        improvement, as in PyTorch."""
        what = f"ReduceLROnPlateau.step: metric must be a number, got {type(metric).__name__}"
        if isinstance(metric, (str, bytes, bool, np.bool_)):
            raise TypeError(f"{what} {metric!r}")
        try:
            value = float(metric)
        except (TypeError, ValueError):
            raise TypeError(what) from None
        capture.host_step("ReduceLROnPlateau.step()")
        self.last_epoch += 1
        if self._is_better(value):
            self.best = value
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g in self.optimizer.param_groups:
                new_lr = max(g["lr"] * self.factor, self.min_lr)
                if g["lr"] - new_lr > self.eps:
                    g["lr"] = new_lr
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def _rules(self) -> dict[str, Check]:
        return {
            **self._SETTINGS,
            "best": Real(allow_inf=True),
            "num_bad_epochs": Count(0),
            "cooldown_counter": Count(0),
            "last_epoch": Count(0),
            "_last_lr": Reals(Real(0), len(self.optimizer.param_groups)),
        }

"""gradcheck: a backward rule against central differences of its forward pass, in float64 (the guide's 4.3).

The scalar checked is L = sum(w * f(inputs)) for a fixed random w, so every output element counts: the
tape's gradient of L (backward seeded with w) is compared, element by element, with
(L(x + h e_i) - L(x - h e_i)) / 2h.
A mismatch names the input, how many of its elements differ, and the worst of them with both values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, Tape, no_grad
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, NetclError


class GradcheckError(NetclError, AssertionError):
    """A backward rule's gradient differs from central differences of its forward pass (ag.gradcheck)."""


def gradcheck(fn: Callable[..., Node], inputs: Sequence[Any], *, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, seed: int = 0, raise_exception: bool = True) -> bool:
    """Check the gradients the tape gives `fn(*inputs)` (a Node) against central differences of `fn`, for each
    input Node that requires grad (float64: in float32 rounding hides a wrong rule, see the guide's 4.3);
    other inputs (Nodes, Tensors, numbers) are passed as they are. An element passes when
    |tape - numeric| <= atol + rtol * |numeric|. Returns True, or raises GradcheckError naming the input and
    its worst elements (False instead with raise_exception=False). Costs two forward passes per element
    checked: keep the inputs small (odd sizes like 3 or 5 find indexing mistakes)."""
    if isinstance(inputs, (Node, Tensor)):
        inputs = (inputs,)
    inputs = list(inputs)
    checked = [i for i, a in enumerate(inputs) if isinstance(a, Node) and a.requires_grad]
    if not checked:
        raise NetclError("gradcheck: no input requires grad; pass the inputs to check as "
                         "ag.tensor(t, requires_grad=True)")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise DTypeError(
                f"gradcheck: input {i} is {inputs[i].dtype}; the check runs in float64, where central "
                f"differences are good to ~1e-10 (float32's rounding is as large as a wrong rule's error): "
                f"ag.tensor(t.astype(np.float64), requires_grad=True)")
    with Tape() as tape:
        out = fn(*inputs)
    if not isinstance(out, Node):
        raise TypeError(f"gradcheck: fn must return one Node, got {type(out).__name__}")
    w = np.random.default_rng(seed).standard_normal(out.shape)
    hosts = {i: inputs[i].value.to_host().astype(np.float64) for i in checked}
    grads = [None] * len(checked)
    if out.requires_grad:  # (returned, not accumulated into any .grad)
        seed_grad = Tensor.from_host(out.queue, w.astype(out.dtype))
        grads = tape.gradient(out, [inputs[i] for i in checked], seed_grad, allow_unused=True)
    analytic = {i: np.zeros_like(hosts[i]) if g is None else g.to_host().astype(np.float64)
                for i, g in zip(checked, grads)}
    reached = {i: g is not None for i, g in zip(checked, grads)}

    def loss(i: int, values: np.ndarray) -> float:
        args = [Node(Tensor.from_host(a.queue, values)) if k == i else a for k, a in enumerate(inputs)]
        with no_grad():
            return float(np.sum(w * fn(*args).value.to_host().astype(np.float64)))

    for i in checked:
        x = hosts[i]
        numeric = np.zeros_like(x)
        flat, grid = x.reshape(-1), numeric.reshape(-1)
        for j in range(flat.size):
            keep = flat[j]
            flat[j] = keep + eps
            up = loss(i, x)
            flat[j] = keep - eps
            down = loss(i, x)
            flat[j] = keep
            grid[j] = (up - down) / (2 * eps)
        bad = np.abs(analytic[i] - numeric) > atol + rtol * np.abs(numeric)
        if bad.any():
            if not raise_exception:
                return False
            raise GradcheckError(_mismatch(i, x.shape, analytic[i], numeric, bad, reached[i], atol, rtol))
    return True


def _mismatch(i: int, shape: tuple[int, ...], analytic: np.ndarray, numeric: np.ndarray, bad: np.ndarray,
              reached: bool, atol: float, rtol: float) -> str:
    err = np.abs(analytic - numeric)
    worst = np.argsort(-err, axis=None)[: min(5, int(bad.sum()))]
    rows = "; ".join(f"{tuple(int(k) for k in np.unravel_index(j, shape))}: tape {analytic.flat[j]:.6g}, "
                     f"numeric {numeric.flat[j]:.6g}" for j in worst)
    note = "" if reached else (" No gradient reached it (its rule returned None, or nothing recorded it), so "
                               "the tape's is taken as zeros.")
    nz = np.abs(numeric) > atol
    if reached and nz.any() and bad.all():
        ratio = analytic[nz] / numeric[nz]
        if np.allclose(ratio, ratio[0], rtol=1e-3):
            note = f" The tape's is {ratio[0]:.6g} times the numeric one everywhere: a constant factor."
    return (f"gradcheck: the gradient of input {i} (shape {shape}) of sum(w * fn(...)), w random, differs "
            f"from central differences at "
            f"{int(bad.sum())} of {bad.size} elements (|tape - numeric| > {atol:g} + {rtol:g} * |numeric|); "
            f"the worst: {rows}.{note}")


__all__ = ["GradcheckError", "gradcheck"]

"""Finite-difference gradient check in float64 on the test device: the tests' spelling of netcl's
`ag.gradcheck` (one implementation of central differences, netcl/autograd/numerical.py).

`check_grads(queue, f, inputs)`: f maps Nodes to a Node; the scalar checked is sum(w * f(x)) for
a fixed random w, so every output element matters. Analytic gradients come from the tape
(seeded with w), numeric ones from central differences of the forward pass run outside a tape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import netcl.autograd as ag
from netcl.core.tensor import Tensor


def check_grads(
    queue,
    f: Callable[..., ag.Node],
    inputs: Sequence[np.ndarray],
    wrt: Sequence[int] | None = None,
    eps: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    seed: int = 0,
    extra: Sequence[Tensor] = (),
) -> None:
    """Raise (ag.GradcheckError, an AssertionError) where the tape's gradient of an input in `wrt` (default:
    all) differs from central differences: |tape - numeric| > atol + rtol * |numeric|."""
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    wrt = set(range(len(arrays))) if wrt is None else set(wrt)
    nodes = [ag.tensor(Tensor.from_host(queue, a), requires_grad=(i in wrt)) for i, a in enumerate(arrays)]
    ag.gradcheck(f, [*nodes, *extra], eps=eps, atol=atol, rtol=rtol, seed=seed)

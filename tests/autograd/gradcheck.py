"""Finite-difference gradient check in float64 on the test device.

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
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    wrt = list(range(len(arrays))) if wrt is None else list(wrt)

    def forward(arrs: Sequence[np.ndarray]) -> np.ndarray:
        nodes = [ag.tensor(Tensor.from_host(queue, a)) for a in arrs]
        return f(*nodes, *extra).value.to_host().astype(np.float64)

    out0 = forward(arrays)
    w = rng.standard_normal(out0.shape)
    with ag.Tape() as tape:
        nodes = [
            ag.tensor(Tensor.from_host(queue, a), requires_grad=(i in wrt)) for i, a in enumerate(arrays)
        ]
        out = f(*nodes, *extra)
    tape.backward(out, Tensor.from_host(queue, w.astype(out.dtype)))
    for i in wrt:
        analytic = nodes[i].grad.to_host() if nodes[i].grad is not None else np.zeros_like(arrays[i])
        numeric = np.zeros_like(arrays[i])
        flat = arrays[i].reshape(-1)
        for j in range(flat.size):
            keep = flat[j]
            flat[j] = keep + eps
            up = float(np.sum(w * forward(arrays)))
            flat[j] = keep - eps
            down = float(np.sum(w * forward(arrays)))
            flat[j] = keep
            numeric.reshape(-1)[j] = (up - down) / (2 * eps)
        np.testing.assert_allclose(
            analytic,
            numeric,
            rtol=rtol,
            atol=atol,
            err_msg=f"gradient of input {i} (shape {arrays[i].shape})",
        )

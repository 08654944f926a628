"""The profiler's op column names the op a user called through an operator or a method (`x @ y`,
`x += 1`, `Tensor.randn`, `node * 2`), not the wrapper that forwards to it ("method.method", "install",
"inplace.op")."""

from __future__ import annotations

import numpy as np

import netcl.autograd as ag
from netcl import profiling
from netcl.core.tensor import Tensor


def test_operator_methods_are_labelled_with_their_ops(queue):
    x = Tensor.from_host(queue, np.arange(16, dtype=np.float32).reshape(4, 4))
    w = ag.tensor(x, requires_grad=True)
    with profiling.profile() as prof:
        (x @ x).to_host()
        y = x.clone()
        y += 1.0
        y.to_host()
        x.T.contiguous()
        Tensor.randn(queue, (4,), seed=0)
        with ag.Tape() as tape:
            loss = (w @ w).sum()
        tape.backward(loss)
        queue.finish()
    names = {r.name for r in prof.rows("op")}
    assert {"matmul", "randn", "contiguous", "setitem", "matmul.backward"} <= names, names
    assert not {n for n in names if n.split(".")[0] in ("method", "install", "inplace", "reflected")}, names

"""What `netcl lm-train`'s recorded step needs of the ops below it: the embedding's backward (a scatter-add
of the output gradient into the table) runs inside a graph capture and replays on new ids."""

from __future__ import annotations

import numpy as np

import netcl.autograd as ag
from netcl.core.tensor import Tensor
from netcl.graph import Graph


def test_an_embedding_gradient_records_in_a_graph_and_replays(queue):
    """lm-train records its step: the embedding's backward (a scatter-add) must not read the ids back."""
    rng = np.random.default_rng(0)
    weight = ag.tensor(
        Tensor.from_host(queue, rng.standard_normal((7, 3)).astype(np.float32)), requires_grad=True
    )
    ids = Tensor.from_host(queue, np.array([[1, 4, 1], [6, 0, 1]], np.int32))
    grad = Tensor.from_host(queue, rng.standard_normal((2, 3, 3)).astype(np.float32))
    graph = Graph()
    with graph.capture():
        with ag.Tape() as tape:
            out = ag.embedding(weight, ids)
        tape.backward(out, grad)
    for new in ([[2, 2, 5], [3, 0, 6]], [[0, 0, 0], [0, 0, 0]]):
        ids.copy_from_host(np.array(new, np.int32))
        graph.replay()
        expected = np.zeros((7, 3))
        np.add.at(expected, np.array(new).reshape(-1), grad.to_host().reshape(-1, 3))
        np.testing.assert_allclose(weight.grad.to_host(), expected, rtol=1e-6, atol=1e-6)

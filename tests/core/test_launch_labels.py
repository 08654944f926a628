"""netcl.core.launch_labels: a launch's op is named by the layers' own declarations (names_ops, walks_through,
transparent), not by a table of module names; undeclared code (the user's) ends the walk."""

from __future__ import annotations

import itertools
import types

import numpy as np

from netcl import ops, profiling
from netcl.core import launch_labels
from netcl.core.tensor import Tensor


def _module(name: str, source: str) -> types.ModuleType:
    """A module named `name` (its frames carry that __name__) holding `source`'s functions, their code
    starting at a line of its own (equal code objects are one key of the labels' cache)."""
    mod = types.ModuleType(name)
    mod.ops = ops
    exec(compile("\n" * next(_first_lines) + source, f"<{name}>", "exec"), mod.__dict__)
    return mod


_first_lines = itertools.count(10, 10)


def _ops_of(fn, x) -> list[str]:
    with profiling.profile() as prof:
        out = fn(x)
        x.queue.finish()
    np.testing.assert_allclose(out.to_host(), x.to_host() @ x.to_host(), rtol=1e-5, atol=1e-5)
    return [s["op"] for s in prof.device_spans() if s["kind"] == "kernel"]


def test_layers_declare_which_frames_name_the_op(queue, rng):
    x = Tensor.from_host(queue, rng.standard_normal((3, 3)).astype(np.float32))
    source = "def square(x):\n    return helper(x)\n\ndef helper(x):\n    return ops.matmul(x, x)\n"
    user = _module("labels_test_user", source)  # undeclared: the walk stops there, netcl's op names it
    assert _ops_of(user.square, x) == ["matmul"]

    layer = _module("labels_test_layer.sub", source)
    launch_labels.names_ops("labels_test_layer")  # a package's declaration covers its modules
    assert _ops_of(layer.square, x) == ["square"]  # the outermost of its frames

    machinery = _module("labels_test_layer.machinery", source)
    launch_labels.walks_through("labels_test_layer.machinery")  # the innermost declaration wins
    assert _ops_of(machinery.square, x) == ["matmul"]


def test_transparent_wrappers_pass_the_label_on(queue, rng):
    x = Tensor.from_host(queue, rng.standard_normal((4, 4)).astype(np.float32))
    layer = _module("labels_test_wrappers", "def square(x):\n    return ops.matmul(x, x)\n"
                                            "def forward(x):\n    return square(x)\n")
    launch_labels.names_ops("labels_test_wrappers")
    assert _ops_of(layer.forward, x) == ["forward"]
    launch_labels.transparent(layer.forward)
    assert _ops_of(layer.forward, x) == ["square"]
    assert profiling.transparent is launch_labels.transparent  # the public name is the same function

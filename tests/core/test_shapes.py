"""Sizes, shapes and axes: integers only (NumPy's and PyTorch's TypeError for 2.7, 2.0, '12', None)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core import shapes
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError, SizeTypeError


@pytest.mark.parametrize("bad", [2.7, 2.0, "12", None, np.float64(3.0), [2]])
def test_a_size_that_is_not_an_integer_is_a_type_error_naming_it(bad):
    with pytest.raises(
        TypeError, match=repr(bad).replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        shapes.size(bad, "Linear: in_features")
    with pytest.raises(SizeTypeError):  # a ShapeError too, for code that catches those
        shapes.shape((3, bad))


def test_integers_of_every_kind_are_sizes():
    assert shapes.size(np.int64(5), "n") == 5 and shapes.size(True, "n") == 1  # bool is an int, as in NumPy
    assert shapes.shape(4) == (4,) and shapes.shape([2, np.int32(3)]) == (2, 3) and shapes.shape(()) == ()
    assert shapes.pair(3, "kernel_size") == (3, 3) and shapes.pair((1, 2), "stride") == (1, 2)
    assert shapes.varargs(((2, 3),)) == (2, 3) and shapes.varargs((2, 3)) == (2, 3)


def test_ranges():
    with pytest.raises(ShapeError, match="groups must be at least 1, got 0"):
        shapes.size(0, "groups", minimum=1)
    with pytest.raises(ShapeError, match="negative dimension"):
        shapes.shape((2, -1))
    with pytest.raises(TypeError, match="pair"):
        shapes.pair((1, 2, 3), "stride")
    assert shapes.axis(-1, 3) == 2
    with pytest.raises(ShapeError, match="axis 3 is out of range for a tensor of shape"):
        shapes.axis(3, 3, shape_of=(1, 2, 3))


def test_a_bare_negative_size_is_refused_by_name(queue):
    """Tensor.empty(q, shape=-4) said "cannot allocate -16 bytes"; (-4,) already named the -4."""
    for spelling in (-4, np.int64(-4), (-4,)):
        with pytest.raises(ShapeError, match=r"shape \(-4,\) has a negative dimension \(-4\)"):
            shapes.shape(spelling)
    with pytest.raises(ShapeError, match=r"negative dimension \(-4\)"):
        Tensor.empty(queue, shape=-4)
    with pytest.raises(ShapeError, match=r"negative dimension \(-1\)"):
        Tensor.zeros(queue, -1)
    assert Tensor.empty(queue, shape=0).shape == (0,)


def test_float_sizes_are_refused_after_the_int_shape_was_cached(queue):
    # (2.0,) hashes and compares equal to (2,): the layout caches must not let it through
    Tensor.empty(queue, (2,), np.float32)
    with pytest.raises(SizeTypeError):
        Tensor.full(queue, (2.0,), 1.0)
    x = Tensor.zeros(queue, (6,))
    x.reshape((3, 2))
    x.reshape(3, 2)
    with pytest.raises(SizeTypeError):
        x.reshape((3.0, 2))
    with pytest.raises(SizeTypeError):
        x.reshape(3.0, 2)
    with pytest.raises(SizeTypeError):
        x.view(3, True + 1.0)

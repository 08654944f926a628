"""netcl.nn.init.skipped: initialisers inside it draw and fill nothing (a model about to be loaded)."""

from __future__ import annotations

import numpy as np

from netcl.nn import init
from netcl.ops import random


def test_skipped_initialisers_draw_nothing(queue):
    random.manual_seed(5)
    with init.skipped():
        made = [init.normal(queue, (3, 4), std=0.1), init.uniform(queue, (5,), 1.0, "float16"),
                init.kaiming_uniform(queue, (2, 6)), init.zeros(queue, (7,)), init.ones(queue, (2, 2))]
    assert [(t.shape, t.dtype.name) for t in made] == [((3, 4), "float32"), ((5,), "float16"),
                                                       ((2, 6), "float32"), ((7,), "float32"),
                                                       ((2, 2), "float32")]
    after = init.normal(queue, (16,)).to_host()
    random.manual_seed(5)
    np.testing.assert_array_equal(after, init.normal(queue, (16,)).to_host())  # the stream did not move
    np.testing.assert_array_equal(init.ones(queue, (2, 2)).to_host(), np.ones((2, 2), np.float32))

"""How many elements a lane of a flat elementwise kernel loads: 16 bytes on GPUs for every storage dtype."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from netcl.core import dtypes
from netcl.jit import runner


def test_gpu_lanes_load_16_bytes_of_half_storage_too():
    gpu = SimpleNamespace(capabilities=SimpleNamespace(kind="gpu"))
    desc = (("add", None),)
    f16, bf16, f32 = np.dtype(np.float16), dtypes.bfloat16, np.dtype(np.float32)
    assert runner.choose_vec(gpu, desc, [f32, f32]) == runner.knobs().vec
    assert runner.choose_vec(gpu, desc, [f16, f16]) == 2 * runner.knobs().vec
    assert runner.choose_vec(gpu, desc, [bf16, f16]) == 2 * runner.knobs().vec
    assert runner.choose_vec(gpu, desc, [f16, f32]) == runner.knobs().vec  # float32 operands keep float4

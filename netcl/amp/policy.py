"""The autocast policy: one table of what each op does under netcl.amp.autocast.

Rules (netcl.autograd.autocast.Rule): "half" ops take their floating inputs in the autocast dtype where
their kernels have a path for it (the listed dtypes), else as "float32" ops: half inputs widened to float32
(their statistics and results stay float32). A parameter is cast once per autocast block. Ops not in
the table follow their inputs: elementwise ops compute in float32 and store in the inputs' dtype;
reductions accumulate in float32; losses take half logits as they are and return a float32 loss
(netcl.ops.loss).

An op whose half path lands opts in with one call, `allow("conv2d", "float16", "bfloat16")`, or by its row
below; the op's autograd function already calls autocast.cast_inputs with its name.
"""

from __future__ import annotations

from netcl.autograd.autocast import POLICY, Rule

HALF_DTYPES = ("float16", "bfloat16")

# op -> (rule, the half dtypes its kernels take)
TABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    # the GEMMs: float16 (IS_HALF) everywhere; bfloat16 on matrix units (gemm_mma.cl), elsewhere through
    # float32 products rounded once (netcl.ops.gemm)
    "matmul": ("half", ("float16", "bfloat16")),
    "linear": ("half", ("float16", "bfloat16")),
    # im2col, direct and Winograd kernels and the GEMM on half storage (float32 arithmetic)
    "conv2d": ("half", ("float16", "bfloat16")),
    # flash attention: float16 and bfloat16 storage, float32 softmax statistics and accumulators
    "flash_attention": ("half", ("float16", "bfloat16")),
    "softmax": ("float32", ()),
    "log_softmax": ("float32", ()),
    # batch norm: half x and y, float32 weight, bias and statistics (only x is cast)
    "batch_norm": ("half", ("float16", "bfloat16")),
    # row norms: half storage in and out, float32 arithmetic and statistics (norm.cl)
    "layer_norm": ("half", ("float16", "bfloat16")),
    "group_norm": ("half", ("float16", "bfloat16")),
    "rms_norm": ("half", ("float16", "bfloat16")),
    # the transformer's linear with its residual added in the GEMM epilogue: product and residual in half,
    # so the residual stream is stored half (PyTorch keeps it float32 by type promotion; here every node's
    # value lives until backward, so a float32 stream would be held beside the half copies the norms read:
    # 0.70x float32's activation memory instead of 0.5x on the GPT of bench/amp.py)
    "linear_residual": ("half", ("float16", "bfloat16")),
}


def allow(op: str, *dtype_names: str) -> None:
    """Let `op` run in the half dtypes named ("float16", "bfloat16") under autocast: the one call an op
    makes when its half kernels land."""
    bad = [d for d in dtype_names if d not in HALF_DTYPES]
    if bad or not dtype_names:
        raise ValueError(f"allow({op!r}, ...): give one or more of {HALF_DTYPES}, got {dtype_names}")
    rule, have = TABLE.get(op, ("half", ()))
    TABLE[op] = (rule, tuple(dict.fromkeys(have + dtype_names)))
    _install(op)


def _install(op: str) -> None:
    rule, names = TABLE[op]
    if rule not in ("half", "float32"):
        raise ValueError(f"autocast rule of {op!r} must be 'half' or 'float32', got {rule!r}")
    POLICY[op] = Rule(rule, frozenset(names))


for _op in TABLE:
    _install(_op)

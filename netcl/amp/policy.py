"""The autocast policy: one table of what each op does under netcl.amp.autocast, made from the ops'
declarations (netcl.ops.declaration: `OpDecl(..., autocast="half")` beside each op's forward).

Rules (netcl.autograd.autocast.Rule): "half" ops take their floating inputs in the autocast dtype where
their kernels have a path for it (the listed dtypes), else as "float32" ops: half inputs widened to float32
(their statistics and results stay float32). A parameter is cast once per autocast block. Ops not in
the table follow their inputs: elementwise ops compute in float32 and store in the inputs' dtype;
reductions accumulate in float32; losses take half logits as they are and return a float32 loss
(netcl.ops.loss).

Declared (see each declaration for why): the GEMMs (matmul, linear, linear_residual: float16 everywhere,
bfloat16 on matrix units or through float32 products rounded once), conv2d, flash_attention, the norms
(they cast only x: their weights, biases and statistics stay float32, and so do the parameters'
gradients) in half; softmax and log_softmax
in float32. An op whose half path lands opts in by its declaration, or with one call,
`allow("conv2d", "float16", "bfloat16")`; the op's autograd function casts its inputs by its name.
"""

from __future__ import annotations

from netcl.autograd.autocast import POLICY, Rule
from netcl.ops import declaration
from netcl.ops.declaration import HALF_DTYPES, OpDecl

# op -> (rule, the half dtypes its kernels take), one row per declaration with an autocast rule
TABLE: dict[str, tuple[str, tuple[str, ...]]] = {}


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


def _declared(decl: OpDecl) -> None:
    if decl.autocast is not None:
        TABLE[decl.name] = (decl.autocast, decl.half_dtypes if decl.autocast == "half" else ())
        _install(decl.name)


def _withdrawn(decl: OpDecl) -> None:
    if decl.autocast is not None:
        TABLE.pop(decl.name, None)
        POLICY.pop(decl.name, None)


declaration.subscribe(_declared, _withdrawn)

"""flash_attention on Nodes: streaming attention (netcl.ops.attention), generated from its declaration there.

The forward keeps out, the log-sum-exp of each query row and dropout's draw; the backward recomputes the
probabilities tile by tile (flash_attention_backward: a pass for dq, one for dk and dv, each skipped when no
input it feeds requires a gradient). Dropout's mask is regenerated from the forward's DropoutDraw. The mask
and kv_len are constants (no gradient flows to them).
"""

from __future__ import annotations

from netcl.autograd.declared import OPS

flash_attention = OPS["flash_attention"]

__all__ = ["flash_attention"]

"""PyTorch's path torch.nn.utils for its gradient clipping: `nn.utils.clip_grad_norm_` and
`nn.utils.clip_grad_value_` are netcl.optim's, re-exported (this module holds no code of its own)."""

from netcl.optim.clip import clip_grad_norm_, clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_"]

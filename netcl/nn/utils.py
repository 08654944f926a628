"""PyTorch's path torch.nn.utils for the one function of it netcl has: `nn.utils.clip_grad_norm_` is
netcl.optim.clip_grad_norm_, re-exported (this module holds no code of its own)."""

from netcl.optim.clip import clip_grad_norm_

__all__ = ["clip_grad_norm_"]

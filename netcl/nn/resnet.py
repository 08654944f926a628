"""ResNet for 32x32 images (the CIFAR layout of He et al. 2016): a 3x3 stem, four stages of basic blocks
(64, 128, 256, 512 channels, stride 2 from the second stage on), batch norm after every convolution,
1x1 strided convolutions (+ batch norm) on the shortcuts whose shape changes, global average pooling and
one linear layer. `resnet18` is [2, 2, 2, 2] blocks; state_dict keys follow torchvision's names
(`conv1.weight`, `layer2.0.downsample.0.weight`, `fc.bias`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import netcl.autograd as ag
from netcl import ops
from netcl.autograd.engine import Node
from netcl.core import shapes
from netcl.core.backend import as_queue
from netcl.nn.layers import AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, Sequential
from netcl.nn.module import Module
from netcl.ops import random


def _add_relu(a: Any, b: Any) -> Any:
    """relu(a + b): the end of a basic block (one fused kernel each way, netcl.autograd.apply)."""
    return ops.relu(ops.add(a, b))


class BasicBlock(Module):
    """x -> relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convolutions without bias.

    x (N, in_channels, H, W) -> (N, channels, H/stride, W/stride). The shortcut is the identity, or a
    1x1 convolution with `stride` + batch norm (`downsample`) when the shape changes."""

    expansion = 1

    def __init__(self, q: Any, in_channels: int, channels: int, stride: int = 1, dtype: Any = "float32",
                 generator: random.Generator | None = None):
        super().__init__()
        self.conv1 = Conv2d(q, in_channels, channels, 3, stride=stride, padding=1, bias=False, dtype=dtype,
                            generator=generator)
        self.bn1 = BatchNorm2d(q, channels, dtype=dtype)
        self.conv2 = Conv2d(q, channels, channels, 3, padding=1, bias=False, dtype=dtype, generator=generator)
        self.bn2 = BatchNorm2d(q, channels, dtype=dtype)
        if stride != 1 or in_channels != channels:
            self.downsample = Sequential(
                Conv2d(
                    q, in_channels, channels, 1, stride=stride, bias=False, dtype=dtype, generator=generator
                ),
                BatchNorm2d(q, channels, dtype=dtype),
            )
        else:
            self.downsample = None

    def forward(self, x: Node) -> Node:
        out = self.bn1(self.conv1(x), activation="relu")
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return ag.apply(_add_relu, out, identity)


class ResNet(Module):
    """ResNet for small images: (N, in_channels, H, W) -> (N, num_classes) logits.

    stem: 3x3 conv (stride 1, no bias) + batch norm + relu; `layers[i]` basic blocks in stage i with
    64 * 2**i channels (stride 2 at the start of stages 2-4); adaptive average pooling to 1x1; Linear."""

    def __init__(
        self,
        q: Any,
        layers: Sequence[int] = (2, 2, 2, 2),
        num_classes: int = 10,
        in_channels: int = 3,
        width: int = 64,
        dtype: Any = "float32",
        generator: random.Generator | None = None,
    ):
        super().__init__()
        q = as_queue(q)
        layers = tuple(shapes.size(n, "ResNet: blocks per stage", minimum=1) for n in layers)
        if len(layers) != 4:
            raise ValueError(f"ResNet: layers must give the blocks of 4 stages, got {layers}")
        self.num_classes = shapes.size(num_classes, "ResNet: num_classes", minimum=1)
        in_channels = shapes.size(in_channels, "ResNet: in_channels", minimum=1)
        width = shapes.size(width, "ResNet: width", minimum=1)
        self.conv1 = Conv2d(q, in_channels, width, 3, padding=1, bias=False, dtype=dtype, generator=generator)
        self.bn1 = BatchNorm2d(q, width, dtype=dtype)
        channels = width
        for i, blocks in enumerate(layers):
            out_channels = width * 2**i
            stage = []
            for j in range(blocks):
                stride = 2 if i > 0 and j == 0 else 1
                stage.append(BasicBlock(q, channels, out_channels, stride, dtype=dtype, generator=generator))
                channels = out_channels
            setattr(self, f"layer{i + 1}", Sequential(*stage))
        self.avgpool = AdaptiveAvgPool2d(1)
        self.flatten = Flatten()
        self.fc = Linear(q, channels, self.num_classes, dtype=dtype, generator=generator)

    def forward(self, x: Node) -> Node:
        x = self.bn1(self.conv1(x), activation="relu")
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(self.flatten(self.avgpool(x)))


def resnet18(q: Any, num_classes: int = 10, in_channels: int = 3, dtype: Any = "float32",
             generator: random.Generator | None = None) -> ResNet:
    """ResNet-18 for 32x32 images: [2, 2, 2, 2] basic blocks, 11.2M parameters at 10 classes."""
    return ResNet(q, (2, 2, 2, 2), num_classes, in_channels, dtype=dtype, generator=generator)


__all__ = ["BasicBlock", "ResNet", "resnet18"]

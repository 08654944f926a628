"""netcl.nn.resnet against the same network in PyTorch (float64): logits, loss, every gradient, running
statistics and eval-mode logits on shared weights; ResNet-18's size and torchvision's names; bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import netcl.autograd as ag
from netcl.core.tensor import Tensor
from netcl.nn.resnet import ResNet, resnet18
from netcl.ops import random


def _torch_resnet(layers, width, classes, in_channels):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            c = width
            for i, blocks in enumerate(layers):
                w = width * 2**i
                stage = [Block(c if j == 0 else w, w, 2 if i and j == 0 else 1) for j in range(blocks)]
                setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
                c = w
            self.fc = nn.Linear(c, classes)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            for i in range(1, 5):
                x = getattr(self, f"layer{i}")(x)
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return Net().double()


@pytest.mark.parametrize("layers,width,hw", [((1, 1, 1, 1), 4, 12), ((2, 1, 1, 1), 8, 9)])
def test_resnet_matches_torch(queue, rng, layers, width, hw):
    """A training-mode forward and backward on shared weights: logits, loss, the gradient of every
    parameter and the running statistics agree with PyTorch to float64 rounding; so do eval-mode logits.
    hw 9: odd sizes through the stride-2 stages (5, 3, 2)."""
    random.manual_seed(3)
    model = ResNet(queue, layers, num_classes=5, in_channels=2, width=width, dtype="float64")
    ref = _torch_resnet(layers, width, 5, 2)
    state = {k: torch.from_numpy(v.to_host().copy()) for k, v in model.state_dict().items()}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    x, y = rng.standard_normal((3, 2, hw, hw)), rng.integers(0, 5, 3).astype(np.int32)

    with ag.Tape() as tape:
        logits = model(ag.tensor(Tensor.from_host(queue, x)))
        loss = ag.cross_entropy(logits, ag.tensor(Tensor.from_host(queue, y)))
    tape.backward(loss)
    tl = ref(torch.from_numpy(x))
    tloss = torch.nn.functional.cross_entropy(tl, torch.from_numpy(y).long())
    tloss.backward()
    np.testing.assert_allclose(logits.value.to_host(), tl.detach().numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(loss.value.to_host()[0], tloss.item(), rtol=1e-10)
    tparams = dict(ref.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(tparams)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), tparams[name].grad.numpy(), rtol=1e-8, atol=1e-10,
                                   err_msg=name)
    tbuf = dict(ref.named_buffers())
    for name, b in model.named_buffers():
        np.testing.assert_allclose(b.to_host(), tbuf[name].numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    model.eval()
    ref.eval()
    with ag.no_grad():
        ev = model(ag.tensor(Tensor.from_host(queue, x))).value.to_host()
    np.testing.assert_allclose(ev, ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-9, atol=1e-10)


def test_resnet18_size_and_names(queue):
    model = resnet18(queue, num_classes=10)
    assert model.num_parameters() == 11_173_962  # torchvision's resnet18 with the 3x3 stem, 10 classes
    keys = list(model.state_dict())
    assert keys[:2] == ["conv1.weight", "bn1.weight"] and keys[-2:] == ["fc.weight", "fc.bias"]
    assert "layer2.0.downsample.0.weight" in keys and "layer1.0.downsample.0.weight" not in keys


def test_resnet_errors(queue):
    with pytest.raises(ValueError, match="4 stages"):
        ResNet(queue, (2, 2, 2))
    with pytest.raises(ValueError, match="num_classes"):
        ResNet(queue, num_classes=0)

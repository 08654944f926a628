"""The training loop behind `netcl train`: models, one step, an epoch, evaluation (reusable from tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl import amp, nn, ops
from netcl.core.tensor import Tensor
from netcl.data import DataLoader
from netcl.graph import Graph
from netcl.nn.resnet import resnet18

MODELS = ("cnn", "mlp", "resnet")


def prepare_images(kind: str, x: np.ndarray) -> np.ndarray:
    """The images as `kind` takes them: 'resnet' zero-pads H and W (evenly on both sides) up to a multiple
    of 8, so its three stride-2 stages halve whole sizes (Fashion-MNIST 28x28 -> 32x32, CIFAR's layout);
    the other models take the images as they are."""
    if kind != "resnet":
        return x
    h, w = x.shape[-2:]
    ph, pw = -h % 8, -w % 8
    if not ph and not pw:
        return x
    pad = [(0, 0)] * (x.ndim - 2) + [(ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2)]
    return np.pad(x, pad)


def build_model(kind: str, q: Any, image_shape: tuple[int, ...], classes: int) -> nn.Module:
    """'cnn': two 3x3 conv + relu + 2x2 max-pool stages, then a 128-unit hidden layer;
    'mlp': the seed's 784-256-128-10 shape (input size follows the images);
    'resnet': ResNet-18 in the CIFAR layout (netcl.nn.resnet; images through prepare_images first)."""
    c, h, w = image_shape
    if kind == "resnet":
        return resnet18(q, num_classes=classes, in_channels=c)
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(q, c * h * w, 256),
            nn.ReLU(),
            nn.Linear(q, 256, 128),
            nn.ReLU(),
            nn.Linear(q, 128, classes),
        )
    if kind == "cnn":
        flat = 32 * (h // 4) * (w // 4)
        return nn.Sequential(
            nn.Conv2d(q, c, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(q, 16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(q, flat, 128),
            nn.ReLU(),
            nn.Linear(q, 128, classes),
        )
    raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")


@dataclass
class MixedPrecision:
    """`--amp`: the autocast dtype, and for float16 a GradScaler (bfloat16 has float32's range: no scaling).
    Everything it adds to a step stays on the device, so the step is still recorded once and replayed."""

    dtype: str
    scaler: amp.GradScaler | None

    @classmethod
    def make(cls, dtype: str) -> MixedPrecision:
        return cls(dtype, amp.GradScaler() if dtype == "float16" else None)

    def describe(self) -> str:
        """The trainers' log line: "mixed precision: autocast <dtype>[, dynamic loss scaling]"."""
        return f"mixed precision: autocast {self.dtype}{', dynamic loss scaling' if self.scaler else ''}"

    def autocast(self) -> amp.autocast:
        """The forward's context: `with mixed.autocast(), ag.Tape() as tape: loss = ...`."""
        return amp.autocast(self.dtype)

    def backward_step(self, tape: ag.Tape, loss: ag.Node, optimizer: Any) -> None:
        """Backward of `loss` (scaled when there is a scaler) and the optimizer's step (skipped on the device
        when a gradient overflowed), then the scale's update; zero_grad is left to the caller."""
        if self.scaler is None:
            tape.backward(loss)
            optimizer.step()
            return
        tape.backward(self.scaler.scale(loss))
        self.scaler.step(optimizer)
        self.scaler.update()


def add_amp_argument(parser: Any) -> None:
    """`--amp [float16|bfloat16]` (netcl train, and any job that builds a MixedPrecision from it)."""
    parser.add_argument(
        "--amp",
        nargs="?",
        const="float16",
        choices=("float16", "bfloat16"),
        default=None,
        help="mixed precision: GEMMs under netcl.amp.autocast (float16, the default, with dynamic "
        "loss scaling; or bfloat16), float32 master weights and loss",
    )


def train_step(model: nn.Module, optimizer: Any, x: Tensor, y: Tensor, scheduler: Any = None,
               mixed: MixedPrecision | None = None) -> Tensor:
    """Forward, backward, update; returns the loss Tensor (1,) without waiting for it. `mixed`: the forward
    under amp.autocast, the backward and update through its GradScaler (overflowing steps skipped)."""
    with mixed.autocast() if mixed is not None else contextlib.nullcontext(), ag.Tape() as tape:
        loss = ag.cross_entropy(model(ag.tensor(x)), ag.tensor(y))
    if mixed is not None:
        mixed.backward_step(tape, loss, optimizer)
    else:
        tape.backward(loss)
        optimizer.step()
    optimizer.zero_grad()
    if scheduler is not None:
        scheduler.step()
    return loss.value


class GraphedStep:
    """train_step recorded (netcl.graph) on its first batch and replayed on later batches of the same
    shape: the same arithmetic, bit for bit, without the per-op Python (on the H200 the CNN step goes
    from ~3.3 ms to ~1.2 ms). Batches are copied into the captured input tensors; a batch of another
    shape (a last partial batch) runs eagerly. The scheduler steps on the host after each step."""

    def __init__(
        self, model: nn.Module, optimizer: Any, scheduler: Any = None, mixed: MixedPrecision | None = None
    ):
        self.model, self.optimizer, self.scheduler, self.mixed = model, optimizer, scheduler, mixed
        self.graph: Any = None
        self.x: Tensor | None = None
        self.y: Tensor | None = None
        self.loss: Tensor | None = None

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        if self.graph is None:
            self.x, self.y = x.clone(), y.clone()
            self.graph = Graph()
            with self.graph.capture():
                self.loss = train_step(self.model, self.optimizer, self.x, self.y, mixed=self.mixed)
        elif x.shape == self.x.shape and y.shape == self.y.shape and x.dtype == self.x.dtype:
            self.x.copy_(x)
            self.y.copy_(y)
            self.graph.replay()
        else:
            return train_step(self.model, self.optimizer, x, y, self.scheduler, self.mixed)
        if self.scheduler is not None:
            self.scheduler.step()
        return self.loss.clone()  # the captured loss is overwritten by the next replay


def train_epoch(
    model: nn.Module,
    optimizer: Any,
    loader: DataLoader,
    scheduler: Any = None,
    progress: Callable[[int, float | None], None] | None = None,
    report_every: int = 20,
    step: Callable[[Tensor, Tensor], Tensor] | None = None,
    mixed: MixedPrecision | None = None,
    balancer: Any = None,
) -> list[float]:
    """One pass over `loader`; returns the per-step losses (read from the device in batches).
    `step(x, y) -> loss` replaces train_step (a GraphedStep, which then owns the scheduler). `balancer` (a
    netcl.distributed.Balancer, data parallelism): the loader gives global batches, this rank trains on its
    rows of each, and the balancer counts (and re-measures) the steps; a rank it leaves out of a step only
    steps the scheduler, and reports no loss for it."""
    model.train()
    pending: list[Tensor] = []
    losses: list[float] = []
    for i, (x, y) in enumerate(loader):
        part = (x, y) if balancer is None else balancer.split((x, y))
        if part is not None:
            pending.append(
                step(*part) if step is not None else train_step(model, optimizer, *part, scheduler, mixed)
            )
        elif scheduler is not None and step is None:
            scheduler.step()  # the working ranks' schedules move on; so does this rank's
        if balancer is not None:
            balancer.step()
        if pending and ((i + 1) % report_every == 0 or i + 1 == len(loader)):
            values = [float(t.to_host()[0]) for t in pending]
            losses.extend(values)
            pending.clear()
            if progress is not None:
                progress(len(values), values[-1])
    return losses


@ag.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, q: Any, batch_size: int = 500) -> float:
    """Top-1 accuracy of `model` on host arrays (model in eval mode, nothing recorded)."""
    model.eval()
    correct = 0
    for start in range(0, len(y), batch_size):
        xb = Tensor.from_host(q, x[start : start + batch_size])
        pred = ops.argmax(model(ag.tensor(xb)).value, axis=-1).to_host()
        correct += int((pred == y[start : start + batch_size]).sum())
    model.train()
    return correct / max(len(y), 1)

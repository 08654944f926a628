import numpy as np
import netcl.autograd as ag
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.nn import Linear, ReLU, Sequential
from netcl.optim import AdamW

# 1. Connect to the hardware (auto-detects GPU, falls back to CPU)
dev = manager.default("auto")
q = dev.queue
print(f"Active Device: {dev.device_name} ({dev.backend})")

# 2. Build a neural network
model = Sequential(
    Linear(q, 784, 256), ReLU(),
    Linear(q, 256, 128), ReLU(),
    Linear(q, 128, 10),
)
opt = AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)

# 3. Create raw device tensors (synthetic batch: 32 samples, 10 classes)
x_raw = Tensor.from_host(q, np.random.randn(32, 784).astype(np.float32))
y_raw = Tensor.from_host(q, np.random.randint(0, 10, size=(32,)).astype(np.int32))

# 4. Record forward operations on the Autograd Tape
with ag.Tape() as tape:
    # ag.tensor() wraps raw Tensors into Autograd Nodes
    x_node = ag.tensor(x_raw)
    y_node = ag.tensor(y_raw)
    logits = model(x_node)
    loss = ag.cross_entropy(logits, y_node)

# 5. Reverse-mode automatic differentiation and optimizer step
tape.backward(loss)
opt.step()
opt.zero_grad()

print("Step completed. Batch loss:", loss.value.to_host()[0])

"""The layer everything stands on: devices, the OpenCL backend, memory, Tensor, dtypes."""

from netcl.core import launch_labels
from netcl.core.backend import Queue
from netcl.core.device import Capabilities, DeviceHandle, DeviceManager, manager
from netcl.core.memory import BufferPool, pinned_empty
from netcl.core.tensor import Tensor

__all__ = [
    "BufferPool", "Capabilities", "DeviceHandle", "DeviceManager", "Queue", "Tensor",
    "manager", "pinned_empty",
]

launch_labels.walks_through(__name__)  # netcl.profiling: launching, recording, allocating: no op of its own

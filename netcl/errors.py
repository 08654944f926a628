"""netcl's exception hierarchy: every error a public call raises is one of these."""

from __future__ import annotations


class NetclError(Exception):
    """Base of every exception netcl raises on purpose."""


class ConfigError(NetclError, ValueError):
    """A NETCL_* environment variable holds a value netcl cannot use (netcl.config names it and the values
    it takes)."""


class DeviceError(NetclError):
    """A device could not be found, opened or used (also: an OpenCL call failed)."""


class NoPlatformError(DeviceError):
    """No OpenCL platform is installed on this machine."""


class DeviceMismatchError(DeviceError, ValueError):
    """Tensors of two different queues or devices met in one operation."""


class OutOfMemoryError(DeviceError, MemoryError):
    """The device could not hold an allocation, even after netcl emptied its cache."""


class ShapeError(NetclError, ValueError):
    """A shape, axis, index or stride does not fit the operation."""


class IndexingError(ShapeError, IndexError):
    """An index that does not fit: out of range, too many, or not an index at all (NumPy's IndexError)."""


class SizeTypeError(ShapeError, TypeError):
    """A size, shape or axis that is not an integer (2.7, 2.0, '12', None): a TypeError, as in NumPy and
    PyTorch, and a ShapeError."""


class ScalarOverflowError(NetclError, OverflowError):
    """A Python scalar does not fit the dtype it meets (300 for uint8, 2**40 for int32), as NumPy raises."""


class DTypeError(NetclError, TypeError):
    """A dtype is unsupported, or unsupported on this device, or the combination is."""


class KernelBuildError(NetclError):
    """An OpenCL program failed to compile; carries the build log and the offending source lines."""

    def __init__(self, message: str, *, log: str = "", source: str = "", options: tuple[str, ...] = ()):
        super().__init__(message)
        self.log = log
        self.source = source
        self.options = options


class KernelVariantWarning(UserWarning):
    """A kernel variant does not build or run correctly on a device; netcl uses another one."""


class KernelLaunchError(DeviceError):
    """Enqueueing a kernel or a transfer failed for a reason other than memory."""


class GraphCaptureError(NetclError):
    """Something inside `Graph.capture()` cannot be recorded for replay (a host transfer, another
    queue, a nested capture), or a replay was asked of a graph that cannot give one."""


class DistributedError(NetclError):
    """A collective between processes failed: a rank crashed, stopped answering within the timeout, or the
    ranks disagreed about the call. `ranks` holds the ranks it names."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)

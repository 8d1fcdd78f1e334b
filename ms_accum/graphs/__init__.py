"""The graphs built on the window: the @jit_class Accumulator and the Cells."""
from .._exports import lazy

_EXPORTS = {
    "Accumulator": ".accumulator",
    "TrainingState": ".cells", "TrainForwardBackward": ".cells", "TrainOptim": ".cells", "TrainClear": ".cells",
    "TrainAccumulationCell": ".cells", "HostSteppedAccumulationCell": ".cells",
    "TrainWindowCell": ".window", "HostSteppedWindowCell": ".window",
    "TrainCachedWindowCell": ".cached",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)

"""ms_accum: gradient accumulation for MindSpore graph mode, equal to large-batch training."""
from .accumulator import Accumulator
from .buffer import AccumulationBuffer
from .cells import TrainAccumulationCell, TrainClear, TrainForwardBackward, TrainOptim

__all__ = [
    "Accumulator",
    "AccumulationBuffer",
    "TrainAccumulationCell",
    "TrainClear",
    "TrainForwardBackward",
    "TrainOptim",
]
__version__ = "0.1.0"

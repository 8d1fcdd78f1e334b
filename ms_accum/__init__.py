"""ms_accum: gradient accumulation for MindSpore graph mode, equal to large-batch training."""
from .accumulator import Accumulator
from .buffer import AccumulationBuffer
from .cells import TrainAccumulationCell, TrainClear, TrainForwardBackward, TrainOptim
from .executor import GradientAccumulation, StepRecord, TrainResult
from .models import LeNet5, MLP
from .verify import EquivalenceReport, verify_equivalence

__all__ = [
    "Accumulator",
    "AccumulationBuffer",
    "TrainAccumulationCell",
    "TrainClear",
    "TrainForwardBackward",
    "TrainOptim",
    "GradientAccumulation",
    "StepRecord",
    "TrainResult",
    "LeNet5",
    "MLP",
    "EquivalenceReport",
    "verify_equivalence",
]
__version__ = "0.1.0"

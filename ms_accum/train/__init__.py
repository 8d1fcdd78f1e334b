"""Training: the executor, its options, structures, runs and windows, records, schedules, checkpoints and resume,
data parallel."""
from .._exports import lazy

_EXPORTS = {
    "GradientAccumulation": ".executor",
    "WindowOptions": ".options", "GuardOptions": ".options", "StatisticsOptions": ".options",
    "Checkpoints": ".options", "LogOptions": ".options", "QUIET": ".options",
    "Validation": ".validation", "TensorBoardLog": ".tensorboard", "recompute_cells": ".recompute",
    "TrainResult": ".records", "StepRecord": ".records", "NonFiniteError": ".records",
    "CheckpointError": ".checkpoint", "save_checkpoint": ".checkpoint", "load_checkpoint": ".checkpoint",
    "load_into": ".checkpoint", "find_latest": ".checkpoint", "list_checkpoints": ".checkpoint",
    "AccumulationSchedule": ".schedule", "rampup": ".schedule", "SamplesLR": ".lr", "scale_lr": ".lr",
    "AdaptiveK": ".adaptive",
    "count_windows": ".windows",
    "Plan": ".plan", "Trial": ".plan",
    "init_data_parallel": ".distributed", "distributed_launch": ".distributed",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)

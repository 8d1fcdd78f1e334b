"""ms_accum: gradient accumulation for MindSpore graph mode, equal to large-batch training.

Importing it before `mindspore` caps oneDNN's CPU ISA on AVX-512 CPUs (`ms_accum.runtime`), which MindSpore reads
only when its native libraries load; so the public names load on first use (PEP 562), not with the package.
"""
import importlib

from . import runtime as _runtime  # noqa: F401  (imports no MindSpore; caps the ISA if it is not loaded yet)

_EXPORTS = {
    "Accumulator": "accumulator",
    "AccumulationBuffer": "buffer",
    "TrainAccumulationCell": "cells",
    "TrainClear": "cells",
    "TrainForwardBackward": "cells",
    "TrainOptim": "cells",
    "TrainWindowCell": "window",
    "TrainingState": "cells",
    "GradientAccumulation": "executor",
    "NonFiniteError": "executor",
    "StepRecord": "executor",
    "TrainResult": "executor",
    "TokenCrossEntropy": "losses",
    "LossOnly": "losses",
    "LeNet5": "models",
    "MLP": "models",
    "CharTransformer": "models",
    "EquivalenceReport": "verify",
    "verify_equivalence": "verify",
    "EvalResult": "evaluation",
    "evaluate": "evaluation",
    "evaluate_checkpoint": "evaluation",
    "replace_batchnorm": "norm",
    "scale_lr": "lr",
    "init_data_parallel": "parallel",
    "recompute_cells": "recompute",
    "plan": "planner",
    "Plan": "planner",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.2.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ms_accum' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(list(globals()) + __all__)

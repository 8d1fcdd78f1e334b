"""ms_accum: gradient accumulation for MindSpore graph mode, equal to large-batch training.

The layers, each importing only those below it (`tests/test_layout.py` checks it):

- ``ms_accum.core``: the window (the buffer and its rules, the guard, graph math, statistics, reducers, losses);
- ``ms_accum.graphs``: the `Accumulator` and the Cells built on it;
- ``ms_accum.train``: the `GradientAccumulation` executor, schedules, checkpoints and resume, data parallel;
- ``ms_accum.tools``: `verify_equivalence` and `plan` for your own model;
- ``ms_accum.demo``: the MNIST application that the command line and the tutorials run;
- ``ms_accum.cli``: the ``ms-accum`` command.

Importing ms_accum before `mindspore` caps oneDNN's CPU ISA on AVX-512 CPUs (`ms_accum.runtime`; docs/mindspore.md,
oneDNN's AVX-512 convolutions), which MindSpore reads only when its native libraries load; so the public names load on
first use (PEP 562).
"""
import importlib
import warnings

from . import runtime  # noqa: F401  (imports no MindSpore; caps the ISA if MindSpore is not loaded yet)
from ._compat import install_module_aliases

_EXPORTS = {
    # the graphs
    "Accumulator": "graphs.accumulator",
    "AccumulationBuffer": "core.buffer",
    "TrainForwardBackward": "graphs.cells",
    "TrainOptim": "graphs.cells",
    "TrainClear": "graphs.cells",
    "TrainAccumulationCell": "graphs.cells",
    "TrainWindowCell": "graphs.window",
    "TrainCachedWindowCell": "graphs.cached",
    "TokenCrossEntropy": "core.losses",
    "LossOnly": "core.losses",
    # training
    "GradientAccumulation": "train.executor",
    "TrainResult": "train.records",
    "StepRecord": "train.records",
    "NonFiniteError": "train.records",
    "CheckpointError": "train.checkpoint",
    "AccumulationSchedule": "train.schedule",
    "rampup": "train.schedule",
    "SamplesLR": "train.lr",
    "init_data_parallel": "train.distributed",
    # tools
    "verify_equivalence": "tools.verify",
    "EquivalenceReport": "tools.verify",
    "plan": "tools.planner",
    "Plan": "train.plan",
    "replace_batchnorm": "tools.norm",
    # the device and graph mode
    "set_device": "runtime",
}

# Names that were top-level in 0.2 and moved; they still work for this release, with a DeprecationWarning.
_DEPRECATED = {
    "LeNet5": "demo.models",
    "MLP": "demo.models",
    "CharTransformer": "demo.models",
    "EvalResult": "demo.evaluation",
    "evaluate": "demo.evaluation",
    "evaluate_checkpoint": "demo.evaluation",
    "TrainingState": "graphs.cells",
    "scale_lr": "train.lr",
    "recompute_cells": "train.recompute",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.3.0"

install_module_aliases(__name__)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = _EXPORTS[name]
    elif name in _DEPRECATED:
        module = _DEPRECATED[name]
        warnings.warn(f"'ms_accum.{name}' is deprecated and will be removed in the next release; import it from "
                      f"'ms_accum.{module}'.", DeprecationWarning, stacklevel=2)
    else:
        raise AttributeError(f"module 'ms_accum' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    if name in _EXPORTS:
        globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(list(globals()) + __all__)

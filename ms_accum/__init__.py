"""ms_accum: gradient accumulation for MindSpore graph mode, equal to large-batch training.

The names a script uses are here, in the order of the documentation (README.md's three ways in, then docs/training.md,
resume.md, schedules.md, adaptive-k.md, sequence-models.md, data-parallel.md, verify-and-plan.md); each layer's
package exports the rest of its public names:

- ``ms_accum.core``: the window (the buffer and its rules, the guard, graph math, statistics, reducers, losses, dropout
  streams);
- ``ms_accum.graphs``: the `Accumulator` and the Cells built on it;
- ``ms_accum.train``: the `GradientAccumulation` executor, its options, schedules, checkpoints and resume, data
  parallel;
- ``ms_accum.tools``: `verify_equivalence` and `plan` for your own model;
- ``ms_accum.demo``: the MNIST application that the command line and the tutorials run;
- ``ms_accum.cli``: the ``ms-accum`` command.

Each layer imports only those below it (`tests/test_layout.py` checks it). Every deprecated name and when it goes:
`ms_accum.deprecation`.

Importing ms_accum before `mindspore` caps oneDNN's CPU ISA on AVX-512 CPUs (`ms_accum.runtime`; docs/mindspore.md,
oneDNN's AVX-512 convolutions), which MindSpore reads only when its native libraries load; so the public names load on
first use (PEP 562).
"""
__version__ = "1.2.0"  # first: `ms_accum.deprecation` compares its table with it

from ._mindspore import check_version as _check_version, installed_version as _installed_version  # noqa: E402

_check_version(_installed_version())  # a MindSpore outside the tested range is refused here (docs/mindspore.md)

from . import runtime  # noqa: E402,F401  (imports no MindSpore; caps the ISA if MindSpore is not loaded yet)
from ._exports import lazy  # noqa: E402

# Name -> the package (or base module) that exports it.
_EXPORTS = {
    # Three ways in (README.md): the seeds' Accumulator and Cells, the executor, the tools; the device.
    "Accumulator": ".graphs", "TrainForwardBackward": ".graphs", "TrainOptim": ".graphs", "TrainClear": ".graphs",
    "GradientAccumulation": ".train", "verify_equivalence": ".tools", "plan": ".tools",
    "set_device": ".runtime",
    # The executor's options and what it returns (docs/training.md).
    "WindowOptions": ".train", "GuardOptions": ".train", "StatisticsOptions": ".train", "Checkpoints": ".train",
    "LogOptions": ".train", "QUIET": ".train", "Validation": ".train", "TensorBoardLog": ".train",
    "recompute_cells": ".train", "TrainResult": ".train", "StepRecord": ".train",
    # Resuming and faults (docs/resume.md).
    "load_into": ".train", "load_checkpoint": ".train", "save_checkpoint": ".train", "CheckpointError": ".train",
    "NonFiniteError": ".train",
    # Schedules and learning rates by samples (docs/schedules.md).
    "AccumulationSchedule": ".train", "rampup": ".train", "SamplesLR": ".train",
    # K from the noise scale (docs/adaptive-k.md).
    "AdaptiveK": ".train",
    # Sequence models (docs/sequence-models.md).
    "TokenCrossEntropy": ".core",
    # Data parallel (docs/data-parallel.md).
    "init_data_parallel": ".train",
    # Verify and plan (docs/verify-and-plan.md).
    "EquivalenceReport": ".tools", "Plan": ".train", "replace_batchnorm": ".tools",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)

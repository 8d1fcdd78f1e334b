"""MindSpore's doorway: the releases ms_accum supports, and every private or undocumented MindSpore name it relies on.

A MindSpore release may move or drop any name that is not in its documented API without a word. ms_accum reaches each
such name here and nowhere else, so that a release that moves one breaks this module, which says so (a clear error
naming the feature, or a fallback said once), never a run that trains wrong. Each entry says why it is needed and
since which release it is known to hold; `tests/test_mindspore.py` checks every one on each MindSpore of CI's matrix
(docs/mindspore.md, versions).

The version check reads the installed distribution's metadata, not the module: importing ms_accum first imports no
MindSpore (`ms_accum.runtime` must cap oneDNN before MindSpore loads).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
import sys
import warnings
from typing import Optional, Tuple

from ._validation import MessageError

# The releases CI tests, [first, end): pyproject.toml's range. 2.7 trains wrong in graph mode (docs/mindspore.md,
# versions), so it is refused, not served.
SUPPORTED = ((2, 8), (2, 11))
SUPPORTED_RANGE = ">=2.8,<2.11"
# Lets a maintainer try a release outside the range (a warning instead of the ImportError).
UNSUPPORTED_VARIABLE = "MS_ACCUM_ALLOW_UNSUPPORTED_MINDSPORE"


class UnsupportedMindSporeError(MessageError, ImportError):
    """The MindSpore found is outside the releases ms_accum supports, or its version cannot be read."""


def installed_version() -> Optional[str]:
    """The MindSpore release of this process: the loaded module's, else the installed distribution's; None when there
    is none."""
    module = sys.modules.get("mindspore")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    try:
        return importlib.metadata.version("mindspore")
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> Tuple[int, int]:
    """The (major, minor) of a version string such as ``"2.7.1.post1"`` or ``"2.10.0rc1"``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise UnsupportedMindSporeError("ms_accum cannot read the MindSpore version '{version}'.", version=version)
    return int(found.group(1)), int(found.group(2))


def supported(version: str) -> bool:
    """Whether `version` is in the range CI tests."""
    return SUPPORTED[0] <= release(version) < SUPPORTED[1]


def check_version(version: Optional[str]) -> None:
    """
    Refuses a MindSpore outside the supported range, before anything is built.

    Args:
        version (str, optional): The MindSpore release found; None (none installed) passes: importing it fails anyway.

    Raises:
        ImportError: If `version` is outside the range and ``MS_ACCUM_ALLOW_UNSUPPORTED_MINDSPORE`` is not ``1`` (with
            it, a `UserWarning`).
    """
    if version is None or supported(version):
        return
    allowed = os.environ.get(UNSUPPORTED_VARIABLE) == "1"
    error = UnsupportedMindSporeError(
        "ms_accum supports MindSpore {supported}, but found MindSpore {version}. Install a supported release (pip "
        "install 'mindspore{supported}'); docs/mindspore.md, versions, says what breaks on others. {then}",
        supported=SUPPORTED_RANGE, version=version,
        then=(f"{UNSUPPORTED_VARIABLE}=1: going on untested." if allowed
              else f"To try it anyway, set {UNSUPPORTED_VARIABLE}=1."))
    if not allowed:
        raise error
    warnings.warn(str(error), UserWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------------------------------------
# MindSpore's private and undocumented names. Each entry's comment: why ms_accum needs it; since which release it needs
# it (2.8, the oldest supported, unless said) and where it is known to hold (`KNOWN`, the releases CI tests). MindSpore
# is imported inside the functions: importing this module must load none (the version gate above runs first).

KNOWN = f"{SUPPORTED[0][0]}.{SUPPORTED[0][1]}–{SUPPORTED[1][0]}.{SUPPORTED[1][1] - 1}"  # "2.8–2.10"


class MindSporeChangedError(MessageError, RuntimeError):
    """A MindSpore name that ms_accum relies on is missing from the running release: the message names the feature,
    the name, the releases it holds for, and the release found."""


def _changed(feature: str, what: str, then: str) -> MindSporeChangedError:
    """The error for a missing name: `feature` of ms_accum needs `what`, which this release lacks; `then` says what
    happens instead or what to do."""
    return MindSporeChangedError("ms_accum's {feature} needs MindSpore's {what} (MindSpore {known}), but MindSpore "
                                 "{found} has none: {then}", feature=feature, what=what, known=KNOWN,
                                 found=installed_version(), then=then)


@functools.lru_cache(maxsize=None)  # each fallback is said once per process
def _fall_back(feature: str, what: str, instead: str) -> None:
    warnings.warn(str(_changed(feature, what, instead)), UserWarning, stacklevel=3)


# --- Cells ------------------------------------------------------------------------------------------------------------

def primitives(cell) -> dict:
    """The Primitives `cell` holds as attributes, by name."""
    # `Cell.__setattr__` keeps a Primitive in the instance's __dict__ (besides its private `_primitives`), so reading
    # __dict__ needs no private name; finding random ops (core/dropout.py, graphs/cached.py) and sparse gathers
    # (core/guard.py); since 2.8 (known to hold 2.8–2.10).
    from mindspore import ops
    return {name: value for name, value in vars(cell).items() if isinstance(value, ops.Primitive)}


# `nn.WithLossCell` keeps its two Cells under these names, which its public constructor sets and only
# `backbone_network` reads back: `WithLossColumns` calls them in its construct, and a buffer built for a
# WithLossCell asks its loss how it reduces (graphs/cells.py); since 2.8 (known to hold 2.8–2.10).
WITH_LOSS_BACKBONE, WITH_LOSS_FN = "_backbone", "_loss_fn"


def with_loss_cells(cell) -> Tuple[object, object]:
    """
    The network and the loss of `cell`, an `nn.WithLossCell`.

    Raises:
        MindSporeChangedError: If `nn.WithLossCell` keeps them under other names in this release.
    """
    found = (getattr(cell, WITH_LOSS_BACKBONE, None), getattr(cell, WITH_LOSS_FN, None))
    if None in found:
        raise _changed("loss columns (WithLossColumns)", f"nn.WithLossCell to keep its Cells as '{WITH_LOSS_BACKBONE}' "
                       f"and '{WITH_LOSS_FN}'", "wrap the network and its loss in a Cell of your own that returns the "
                       "loss, and pass loss_fn=None.")
    return found


def loss_of(network):
    """
    The loss Cell `network` wraps as `nn.WithLossCell` does (its subclasses, `nn.WithEvalCell`), else None.

    Raises:
        MindSporeChangedError: If `network` is an `nn.WithLossCell` and this release keeps its loss under another name
            (a window's reduction would otherwise be guessed, not read from the loss).
    """
    from mindspore import nn
    loss_fn = getattr(network, WITH_LOSS_FN, None)
    if loss_fn is None and isinstance(network, nn.WithLossCell):
        raise _changed("window reduction", f"nn.WithLossCell to keep its loss as '{WITH_LOSS_FN}'",
                       "give the network and the loss apart (GradientAccumulation(network, loss_fn, ...)), or the "
                       "reduction to the AccumulationBuffer yourself.")
    return loss_fn


@functools.lru_cache(maxsize=None)
def batchnorm_types() -> tuple:
    """The classes of the BatchNorm layers that normalize by the batch's statistics: MindSpore's base class of
    `nn.BatchNorm1d`, `nn.BatchNorm2d` and `nn.SyncBatchNorm` (so a user's subclass of it counts too), or, where a
    release has none, those three (said once)."""
    # `nn.layer.normalization._BatchNorm`, private: verify_equivalence names BatchNorm as a cause and
    # replace_batchnorm swaps it for GroupNorm (tools/causes.py, tools/norm.py); since 2.8 (known to hold 2.8–2.10).
    from mindspore import nn
    try:
        from mindspore.nn.layer.normalization import _BatchNorm  # pylint: disable=import-outside-toplevel
        return (_BatchNorm,)
    except ImportError:
        _fall_back("BatchNorm detection", "nn.layer.normalization._BatchNorm", "only nn.BatchNorm1d, nn.BatchNorm2d "
                   "(nn.BatchNorm3d's inner one) and nn.SyncBatchNorm and their subclasses are taken for BatchNorm.")
        return (nn.BatchNorm1d, nn.BatchNorm2d, nn.SyncBatchNorm)


# --- Random ops -------------------------------------------------------------------------------------------------------

# A Primitive's attributes, which `add_prim_attr` writes and `Primitive.attrs` holds: how ms_accum reads a random op's
# seeds and marks (core/dropout.py, graphs/cached.py); since 2.8 (known to hold 2.8–2.10).
def prim_attrs(prim) -> dict:
    """The attributes of the Primitive `prim` (none for another object)."""
    return getattr(prim, "attrs", None) or {}


# `nn.Dropout` calls its `ops.Dropout` primitive under this name, which `DropoutStreams` replaces while it draws, and
# reads the op's keep probability and seeds under these attribute names (`ops.Dropout`'s constructor arguments);
# since 2.8 (known to hold 2.8–2.10).
DROPOUT_OP = "dropout"
DROPOUT_KEEP, DROPOUT_SEEDS = "keep_prob", ("Seed0", "Seed1")
# How MindSpore's random primitives name their two seeds: `ops.Dropout`'s, and those of `ops.StandardNormal`,
# `ops.UniformReal`, ...; `TrainCachedWindowCell` refuses unseeded ones (graphs/cached.py); since 2.8 (2.8–2.10).
RANDOM_SEED_ATTRS = (DROPOUT_SEEDS, ("seed", "seed2"))
# MindSpore marks its random primitives with this attribute: such an op is never merged with another call, nor its
# unused output dropped; ms_accum marks its own dropout kernel so and finds random ops by it (core/dropout.py);
# since 2.8 (known to hold 2.8–2.10).
RANDOM_EFFECT_ATTR = "side_effect_hidden"


def dropout_op(cell):
    """The `ops.Dropout` primitive that `cell`, an `nn.Dropout`, calls: what `DropoutStreams` replaces. None for
    another Cell, and where this release's `nn.Dropout` does not hold it as `DROPOUT_OP`, with its keep probability and
    seeds and marked as random; that is said once, and `nn.Dropout` keeps MindSpore's kernel."""
    from mindspore import nn, ops
    if not isinstance(cell, nn.Dropout):
        return None
    prim = primitives(cell).get(DROPOUT_OP)
    if isinstance(prim, ops.Dropout) and all(name in prim_attrs(prim) for name in _DROPOUT_ATTRS):
        return prim
    attrs = ", ".join(f"'{name}'" for name in _DROPOUT_ATTRS)
    _fall_back("seeded dropout", f"nn.Dropout to call an ops.Dropout '{DROPOUT_OP}' holding {attrs}",
               "nn.Dropout keeps MindSpore's kernel: runs may differ and a resumed run draws other masks "
               "(docs/resume.md).")
    return None


_DROPOUT_ATTRS = (DROPOUT_KEEP, *DROPOUT_SEEDS, RANDOM_EFFECT_ATTR)


def dropout_settings(prim) -> Tuple[float, int, int]:
    """
    The keep probability and the two seeds of an `ops.Dropout` primitive.

    Raises:
        MindSporeChangedError: If the primitive holds them under other names in this release.
    """
    attrs = prim_attrs(prim)
    names = (DROPOUT_KEEP, *DROPOUT_SEEDS)
    if not all(name in attrs for name in names):
        raise _changed("seeded dropout", f"ops.Dropout to hold {', '.join(map(repr, names))}",
                       "ms_accum cannot draw the op's masks from its seeds.")
    return float(attrs[DROPOUT_KEEP]), int(attrs[DROPOUT_SEEDS[0]]), int(attrs[DROPOUT_SEEDS[1]])


def mark_random(prim) -> None:
    """Marks `prim` as MindSpore marks its random ops (`RANDOM_EFFECT_ATTR`)."""
    prim.add_prim_attr(RANDOM_EFFECT_ATTR, True)


# MindSpore's own list of its random functions (`ops.uniform`, `ops.randn`, ...): ms_accum warns about those called in
# a construct, whose draws it does not reach (core/dropout.py); since 2.8 (known to hold 2.8–2.10). As of 2.10, for a
# release without the list:
_RANDOM_FUNCTIONS_2_10 = (
    "choice_with_mask", "gamma", "laplace", "log_uniform_candidate_sampler", "multinomial",
    "multinomial_with_replacement", "normal", "poisson", "rand", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "random_categorical", "random_gamma", "random_poisson", "randperm", "shuffle", "standard_laplace",
    "standard_normal", "uniform", "uniform_candidate_sampler")


@functools.lru_cache(maxsize=None)
def random_functions() -> frozenset:
    """The names of MindSpore's random functions: `mindspore.ops.function.random_func.__all__`, or, where a release has
    none, those of MindSpore 2.10 (said once)."""
    try:
        from mindspore.ops.function import random_func  # pylint: disable=import-outside-toplevel
        return frozenset(random_func.__all__)
    except (ImportError, AttributeError):
        _fall_back("check for random ops", "list mindspore.ops.function.random_func.__all__",
                   "it looks for the random functions of MindSpore 2.10 instead.")
        return frozenset(_RANDOM_FUNCTIONS_2_10)


# --- Custom kernels ---------------------------------------------------------------------------------------------------

# `ops.Custom(func_type="aot")` loads "<library path>:<entry>" and calls
#     extern "C" int entry(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
#                          void *stream, void *extra)
# with the inputs' then the outputs' buffers in `params` (dtypes as "float32", ...), 0 for success: the convention of
# ms_accum's dropout kernel (core/kernels/seeded_dropout.cc); since 2.8 (known to hold 2.8–2.10).
AOT = "aot"


def aot_primitive(library: str, entry: str, out_shape, out_dtype, bprop=None):
    """
    The `ops.Custom` primitive that calls `entry` of a shared library by the aot convention (`AOT`).

    Args:
        library (str): The shared library's path.
        entry (str): The function's name in it.
        out_shape (Callable): The outputs' shapes from the inputs', as `ops.Custom` takes it.
        out_dtype (Callable): The outputs' dtypes from the inputs', as `ops.Custom` takes it.
        bprop (Callable, optional): The backward, as `ops.Custom` takes it. Default: ``None``.
    """
    from mindspore import ops
    return ops.Custom(f"{library}:{entry}", out_shape=out_shape, out_dtype=out_dtype, func_type=AOT, bprop=bprop)


# --- Optimizers -------------------------------------------------------------------------------------------------------

# `nn.Optimizer`'s undocumented record of how it was built, read back to build each rank's part of it
# (train/sharding.py); each since 2.8 (known to hold 2.8–2.10):
OPTIMIZER_ATTRIBUTES = {
    "loss_scale": "the loss_scale given, which MindSpore multiplies into the weight decays it keeps",
    "is_group": "whether it was built from parameter groups",
    "weight_decay": "without groups, the weight decay given times loss_scale (a Tensor)",
    "group_weight_decay": "with groups, each parameter's weight decay times loss_scale",
    "group_grad_centralization": "with groups, each parameter's grad_centralization",
    "dynamic_weight_decay": "whether a weight decay is a Cell (a schedule), which cannot be read back",
    "use_lazy": "nn.Adam's lazy update (state kept off the Parameters)",
    "use_offload": "nn.Adam's offload to the host (state kept off the Parameters)",
}
_REQUIRED = object()


def optimizer_attribute(optimizer, name: str, default=_REQUIRED):
    """
    The attribute `name` of `optimizer`, else `default` when given.

    Args:
        optimizer (nn.Optimizer): The optimizer.
        name (str): One of `OPTIMIZER_ATTRIBUTES`, or a constructor argument the class keeps under its own name
            (`ms_accum.train.sharding.REBUILT`).
        default (Any, optional): What an optimizer without it has (``use_lazy`` of a class other than `nn.Adam`).

    Raises:
        MindSporeChangedError: If it has none and no `default` is given.
    """
    value = getattr(optimizer, name, default)
    if value is _REQUIRED:
        raise _changed("optimizer sharding", f"{type(optimizer).__name__} to keep its '{name}'",
                       "pass shard_optimizer a factory params -> optimizer that builds your optimizer over a rank's "
                       "parameters.")
    return value


def listed_rates(optimizer) -> Optional[int]:
    """How many rates a learning rate given as a list holds (the fewest of any group's), one per optimizer step; None
    when none is a list. MindSpore keeps a list in an undocumented schedule, `_IteratorLearningRate`, under its own name
    `learning_rate` (since 2.8, known to hold 2.8–2.10), and gathers the step's rate from it in the graph; a schedule in
    another place reads as no list."""
    from mindspore import nn
    try:
        from mindspore.nn.optim.optimizer import _IteratorLearningRate
    except ImportError:
        return None
    rates = optimizer.learning_rate
    rates = rates if isinstance(rates, (tuple, list, nn.CellList)) else [rates]  # one per group, or one for all
    held = [rate.learning_rate.shape[0] for rate in rates if isinstance(rate, _IteratorLearningRate)]
    return min(held) if held else None


# --- Learning-rate schedules ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def learning_rate_schedule() -> type:
    """MindSpore's base class of learning-rate schedules, or, where the module that holds it moved, the base of its
    public schedules (said once)."""
    # `mindspore.nn.learning_rate_schedule.LearningRateSchedule`: not exported by `mindspore.nn` (2.8–2.10), yet what
    # an optimizer takes as a schedule; `SamplesLR` and sharding's held rate subclass it, TensorBoard's log evaluates
    # it (train/lr.py, train/sharding.py, train/tensorboard.py); since 2.8 (known to hold 2.8–2.10).
    from mindspore import nn
    try:
        from mindspore.nn.learning_rate_schedule import LearningRateSchedule  # pylint: disable=import-outside-toplevel
        return LearningRateSchedule
    except ImportError:
        _fall_back("learning-rate schedules", "module mindspore.nn.learning_rate_schedule",
                   "ms_accum takes nn.WarmUpLR's base class for it.")
        return nn.WarmUpLR.__mro__[1]


def __getattr__(name: str):
    # `from .._mindspore import LearningRateSchedule`: resolved on first use, so importing the door loads no MindSpore.
    if name == "LearningRateSchedule":
        return learning_rate_schedule()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- Communication ----------------------------------------------------------------------------------------------------

def _global_comm():
    # `mindspore.communication.GlobalComm` is exported, but its fields are undocumented; read when called, since
    # `init()` sets them.
    from mindspore import communication
    return getattr(communication, "GlobalComm", None)


def communication_initialized() -> bool:
    """Whether `mindspore.communication.init()` has run in this process; where a release does not say, whether the
    process is one of several ranks (said once)."""
    # GlobalComm.INITED: without init(), get_rank() and get_group_size() answer 0 and 1 rather than fail, so
    # collectives would be compiled for a group that does not exist (core/parallel.py); since 2.8 (2.8–2.10).
    inited = getattr(_global_comm(), "INITED", None)
    if inited is not None:
        return bool(inited)
    _fall_back("data parallel", "communication.GlobalComm.INITED", "a process is taken for a rank of a data-parallel "
               "job when mindspore.communication.get_group_size() is above 1.")
    from mindspore.communication import get_group_size
    try:
        return get_group_size() > 1
    except (RuntimeError, ValueError):  # a release that refuses to answer before init()
        return False


def world_group() -> str:
    """
    The group of every rank, as `init()` named it for the backend (``mccl_world_group`` on CPU).

    Raises:
        MindSporeChangedError: If this release keeps no such name.
    """
    # GlobalComm.WORLD_COMM_GROUP: the collectives of data parallel and gradient caching run over it
    # (core/parallel.py, train/distributed.py, graphs/cached.py); since 2.8 (known to hold 2.8–2.10).
    group = getattr(_global_comm(), "WORLD_COMM_GROUP", None)
    if group is None:
        raise _changed("data parallel", "communication.GlobalComm.WORLD_COMM_GROUP", "ms_accum cannot name the group "
                       "of all ranks for its collectives; train on one device.")
    return group


# --- Logging ----------------------------------------------------------------------------------------------------------

def mindspore_logger():
    """MindSpore's Python logger, or None where a release offers no way to it (said once)."""
    # `mindspore.log._get_logger`: a failed save is silenced in MindSpore's log, whose CRITICAL line would name
    # ms_accum's temporary file, while ms_accum's own error says more (train/checkpoint.py); since 2.8 (2.8–2.10).
    from mindspore import log
    getter = getattr(log, "_get_logger", None)
    if getter is None:
        _fall_back("checkpoint writer", "mindspore.log._get_logger", "MindSpore's own line about a failed save is "
                   "left in the log.")
    return None if getter is None else getter()


# --- oneDNN ----------------------------------------------------------------------------------------------------------

# oneDNN, which MindSpore bundles for its CPU kernels (mindspore/lib): libdnnl.so.2 (oneDNN 2.2) in MindSpore 2.8,
# libdnnl.so.3 (oneDNN 3.x) in 2.9 and 2.10. Asked for the ISA its kernels run (`ms_accum.runtime`): the slow AVX-512
# convolutions (docs/mindspore.md, oneDNN's AVX-512 convolutions); since 2.8 (2.8–2.10).
ONEDNN_LIBRARIES = ("libdnnl.so.3", "libdnnl.so.2")
# The variable that caps oneDNN's ISA, read when the library loads: ONEDNN_MAX_CPU_ISA in oneDNN 3.x, only the older
# DNNL_MAX_CPU_ISA in the oneDNN 2.2 of MindSpore 2.8 (measured: the first alone left 2.8 on AVX-512); since 2.8.
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


@functools.lru_cache(maxsize=None)
def onednn() -> Optional["ctypes.CDLL"]:
    """The oneDNN library this process loaded (the one MindSpore loaded: found in the process's mappings, or by its
    known names, never loading a second copy); None where it is not loaded, or cannot be found (said once on x86, where
    MindSpore ships one)."""
    import ctypes
    import platform
    candidates = list(ONEDNN_LIBRARIES)
    # Linux: the file MindSpore loaded, whatever its name.
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8") as maps:
        candidates[:0] = sorted({line.split()[-1] for line in maps if "/libdnnl.so" in line})
    for candidate in candidates:
        with contextlib.suppress(OSError, AttributeError):
            library = ctypes.CDLL(candidate, mode=os.RTLD_NOLOAD)
            library.dnnl_get_effective_cpu_isa  # noqa: B018  (a library without it is not oneDNN)
            return library
    if platform.machine().lower() in ("x86_64", "amd64"):
        _fall_back("CPU kernel check", f"bundled oneDNN ({' or '.join(ONEDNN_LIBRARIES)})",
                   "which ISA its CPU kernels run is judged by the CPU's flags alone.")
    return None

"""Every deprecated name, keyword, module path and flag of ms_accum, in one table, with the version it goes away.

`TABLE` maps what a user wrote to its `Deprecation`: what replaces it, the version that first warned, the version that
no longer has it. Everything in the package that warns of a deprecation does so through `deprecated`, with the
table's text; no other module raises a ``DeprecationWarning``
(`tests/test_deprecation.py` checks both, and fails when an entry outlives its removal version).

Removal needs a major version (semantic versioning): what is deprecated in 1.x is removed in 2.0.0. Entries whose
version has come stay in the table as the record of what went and what replaces it, and what went fails with the
table's line (`tests/test_deprecation.py` walks every such entry), as the error Python would raise:

- a name of a package or module: `ImportError`, from its PEP 562 ``__getattr__`` (`no_attribute`; `module_getattr`
  for a module that has no other), alike for ``module.name`` and ``from module import name``; a name of a removed
  module is said with the module's line;
- a keyword of a callable: Python's `TypeError` for an unexpected keyword, the table's line after it; an attribute of
  a class's instances: Python's `AttributeError`, the line after it (both by the decorator `removed_from`);
- a command-line flag: argparse's error for that argument, with the line (`ms_accum.cli.arguments.add_removed_flags`).

No import hook: a removed module path fails at ``import ms_accum.data`` as any missing module does, while
``ms_accum.data`` as an attribute names its replacement; a name that moved is served by its package's ``__getattr__``
and a keyword by its callable.

The keys: ``ms_accum.x.Name`` for a module, a name or an attribute; ``Callable(keyword=...)`` for a keyword of that
callable (``ms_accum.x.Callable(keyword=...)``); ``ms-accum <command> --flag`` for a command-line flag.
"""
import functools
import warnings
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from . import __version__


class Deprecation(NamedTuple):
    """What replaces a deprecated thing, and when it went or goes.

    Args:
        use (str): The replacement, as the warning and the error say it (``"use ..."``, ``"import ..."``).
        deprecated_in (str, optional): The version that first warned; None when it went without a release that
            warned (0.3's own dropout seeding, the inner Cells at the top).
        removed_in (str): The first version without it.
    """

    use: str
    deprecated_in: Optional[str]
    removed_in: str


# The executor's keywords of 0.2 and 0.3, which 0.3 moved into option objects: keyword -> (option, its field).
# `ms_accum.train.options.with_deprecated` moves them.
EXECUTOR_KEYWORDS: Dict[str, Tuple[str, str]] = {
    "clip_norm": ("window", "clip_norm"), "reduction": ("window", "reduction"),
    "buffer_dtype": ("window", "buffer_dtype"),
    "policy": ("guard", "policy"), "loss_scaler": ("guard", "loss_scaler"),
    "stop_on_nonfinite": ("guard", "stop_on_nonfinite"),
    "statistics": ("statistics", "norms"), "noise_scale": ("statistics", "noise_scale"),
    "skip_outliers": ("statistics", "skip_outliers"), "outlier_warmup": ("statistics", "outlier_warmup"),
    "ckpt_dir": ("checkpoints", "directory"), "ckpt_name": ("checkpoints", "name"),
    "save_every": ("checkpoints", "save_every"), "keep_last": ("checkpoints", "keep_last"),
    "metadata": ("checkpoints", "metadata"), "resume": ("checkpoints", "resume"),
    "log_every": ("log", "every"), "verbose": ("log", "verbose"), "on_step": ("log", "on_step"),
}

# Each option: its class, and the executor's method that takes it.
_OPTIONS = {"window": ("WindowOptions", ""), "guard": ("GuardOptions", ""),
            "statistics": ("StatisticsOptions", ""), "checkpoints": ("Checkpoints", ".train_process"),
            "log": ("LogOptions", ".train_process")}


def executor_key(keyword: str) -> str:
    """The table's key of the executor's deprecated `keyword`: a keyword of its constructor or of `train_process`."""
    return f"ms_accum.GradientAccumulation{_OPTIONS[EXECUTOR_KEYWORDS[keyword][0]][1]}({keyword}=...)"


TABLE: Dict[str, Deprecation] = {
    # --- 0.2's flat package, kept by 0.3 for one release: removed in 1.0.0. ---
    **{f"ms_accum.{old}": Deprecation(f"import 'ms_accum.{new}'", "0.3.0", "1.0.0") for old, new in {
        "buffer": "core", "guard": "core", "statistics": "core", "losses": "core", "accumulator": "graphs",
        "cells": "graphs", "window": "graphs", "executor": "train", "resume": "train", "checkpoint": "train",
        "schedule": "train", "lr": "train", "recompute": "train", "verify": "tools", "causes": "tools",
        "planner": "tools", "norm": "tools", "factory": "tools", "data": "demo", "models": "demo",
        "evaluation": "demo", "_ops": "core._ops"}.items()},
    "ms_accum.parallel": Deprecation(
        "import 'ms_accum.core' and 'ms_accum.train' (init_data_parallel)", "0.3.0", "1.0.0"),
    **{f"ms_accum.{name}": Deprecation(f"import it from 'ms_accum.{layer}'", "0.3.0", "1.0.0") for name, layer in {
        "LeNet5": "demo", "MLP": "demo", "CharTransformer": "demo", "EvalResult": "demo", "evaluate": "demo",
        "evaluate_checkpoint": "demo", "TrainingState": "graphs", "scale_lr": "train"}.items()},
    "ms_accum.executor.windows_per_epoch": Deprecation(
        "use ms_accum.train.count_windows(num_batches, 1, K, 1, partial_window)", "0.3.0", "1.0.0"),
    "ms_accum.statistics.harmonic_mean": Deprecation("use len(w) / sum(1 / x for x in w)", "0.3.0", "1.0.0"),
    "ms_accum.factory.builtin_model": Deprecation("use ms_accum.tools.load_model", "0.3.0", "1.0.0"),
    **{f"ms_accum.train.{owner}{spelling}": Deprecation("use 'accumulate_step'", "0.3.0", "1.0.0")
       for owner in ("StepRecord", "Plan", "Trial") for spelling in ("(accumulate_steps=...)", ".accumulate_steps")},
    # --- 0.3's dropout seeding, replaced by the streams without a release that warned: removed in 1.0.0. ---
    **{f"ms_accum.core.dropout.{name}": Deprecation(
        "use ms_accum.core.DropoutStreams(network).drawing()", None, "1.0.0")
       for name in ("seed_dropout", "seed_dropout_on_cpu", "seeded_ops")},
    # --- The inner Cells and the buffer, top-level in 0.2 and 0.3; a script that builds them imports their layer. ---
    **{f"ms_accum.{name}": Deprecation(f"import it from 'ms_accum.{layer}'", None, "1.0.0")
       for name, layer in {"TrainAccumulationCell": "graphs", "TrainWindowCell": "graphs",
                           "TrainCachedWindowCell": "graphs", "AccumulationBuffer": "core",
                           "LossOnly": "core"}.items()},
    # --- The executor's keywords of 0.2 and 0.3, replaced by option objects in 0.3: removed in 2.0.0. ---
    **{executor_key(keyword): Deprecation(f"use {option}={_OPTIONS[option][0]}({field}=...)", "0.3.0", "2.0.0")
       for keyword, (option, field) in EXECUTOR_KEYWORDS.items()},
    "ms_accum.GradientAccumulation(recompute=...)": Deprecation(
        "call ms_accum.recompute_cells(network, names) before building the executor", "0.3.0", "2.0.0"),
    # --- K's one spelling outside the seeds' doors is accumulate_step: the flag follows in 1.0.0. ---
    **{f"ms-accum {command} --accumulate-steps": Deprecation("use --accumulate-step", "1.0.0", "2.0.0")
       for command in ("train", "verify")},
    # --- A K policy looks ahead with peek and decides with open_window; calling one meant either. ---
    "ms_accum.AccumulationSchedule.__call__": Deprecation("use peek(samples)", "1.3.0", "2.0.0"),
}


def version(text: str) -> tuple:
    """``"1.0.0"`` as ``(1, 0, 0)``, to compare versions."""
    return tuple(int(part) for part in text.split("."))


def removed(key: str) -> bool:
    """Whether `key`'s removal version has come (this package's ``__version__`` or later)."""
    return version(TABLE[key].removed_in) <= version(__version__)


def message(key: str) -> str:
    """The table's sentence for `key`: deprecated and going, or gone, and what replaces it."""
    entry = TABLE[key]
    if removed(key):
        return f"'{key}' was removed in ms_accum {entry.removed_in}: {entry.use}."
    return (f"'{key}' is deprecated since ms_accum {entry.deprecated_in} and will be removed in {entry.removed_in}; "
            f"{entry.use}.")


def deprecated(key: str, stacklevel: int = 2) -> None:
    """Warns that `key` is deprecated, with the table's text, at the frame `stacklevel` up from the caller (1: the
    caller; 2, the default: its caller, as `warnings.warn` counts from its own caller).

    Raises:
        KeyError: If `key` is not in the table.
        RuntimeError: If `key`'s removal version has come: the code that warns must go (a test runs into it).
    """
    if removed(key):
        raise RuntimeError(f"'{key}' outlived its removal in ms_accum {TABLE[key].removed_in}: delete it and its "
                           f"warning.")
    warnings.warn(message(key), DeprecationWarning, stacklevel=stacklevel + 1)


def removal(key: str) -> str:
    """The table's line for `key`, gone, said after Python's own error that names it: ``removed in ms_accum 1.0.0; use
    'accumulate_step'.``"""
    return f"removed in ms_accum {TABLE[key].removed_in}; {TABLE[key].use}."


def no_attribute(module: str, name: str) -> Exception:
    """For a package's ``__getattr__``: the error for ``module.name``. A name the table has is an `ImportError` with
    the table's line and, for a removed module, where each name the table lists under it went
    (``ms_accum.executor.windows_per_epoch`` is reached through ``ms_accum.executor``, which fails first); any other
    name is Python's own `AttributeError`.

    An ImportError, not an AttributeError, as ``from module import name`` asks the module's ``__getattr__`` and replaces
    any AttributeError with its own "cannot import name", dropping the line (every release; no class can be both since
    Python 3.10): a removed name is an import that fails, however it is asked for."""
    key = f"{module}.{name}"
    if key not in TABLE:
        return AttributeError(f"module '{module}' has no attribute '{name}'")
    inner = [message(inner) for inner in TABLE
             if inner.startswith(f"{key}.") and inner[len(key) + 1:].isidentifier() and removed(inner)]
    return ImportError(" ".join([message(key), *inner]), name=module)


def module_getattr(module: str) -> Callable[[str], None]:
    """The PEP 562 ``__getattr__`` of a module that has none of its own: a name the table lists as removed from it
    fails with the table's line (`no_attribute`). ``__getattr__ = module_getattr(__name__)``."""
    def __getattr__(name: str) -> None:  # noqa: N807
        raise no_attribute(module, name)
    return __getattr__


def removed_from(owner: str) -> Callable:
    """A decorator: the function or class `owner` refuses each keyword the table lists as removed from it (the key
    ``f"{owner}({keyword}=...)"``) with Python's `TypeError` for an unexpected keyword, the table's line after it
    (`removal`); a class's instances fail for each attribute the table lists (``f"{owner}.{name}"``) with Python's
    `AttributeError`, the line after it.

    Args:
        owner (str): The callable's path as the table keys it (``"ms_accum.train.Plan"``).

    Raises:
        KeyError: When decorating, if the table lists nothing removed from `owner` (the decorator would do nothing).
    """
    keywords, attributes = {}, {}
    for key in TABLE:
        rest = key[len(owner):]
        if key.startswith(owner) and removed(key):
            if rest.startswith("(") and rest.endswith("=...)"):
                keywords[rest[1:-len("=...)")]] = key
            elif rest.startswith(".") and rest[1:].isidentifier():
                attributes[rest[1:]] = key
    if not keywords and not attributes:
        raise KeyError(f"the deprecation table lists nothing removed from '{owner}'")

    def decorate(target):
        function = target.__init__ if isinstance(target, type) else target

        @functools.wraps(function)
        def refusing(*args, **kwargs):
            for keyword in kwargs:  # the first one given, as Python names the first unexpected keyword
                if keyword in keywords:
                    raise TypeError(f"{function.__qualname__}() got an unexpected keyword argument '{keyword}': "
                                    f"{removal(keywords[keyword])}")
            return function(*args, **kwargs)

        if not isinstance(target, type):
            return refusing
        if keywords:
            target.__init__ = refusing
        if attributes:  # (the classes decorated have no __getattr__ of their own)
            def __getattr__(self, name: str):  # noqa: N807  (called only when an attribute is not found)
                error = AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
                if name in attributes:
                    raise AttributeError(f"{error}: {removal(attributes[name])}")
                error.name, error.obj = name, self  # Python 3.10+ suggests a close name from these
                raise error
            target.__getattr__ = __getattr__
        return target
    return decorate

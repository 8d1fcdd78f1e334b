"""The public names of ms_accum 0.2 (a flat package), kept for one release: ``import ms_accum.data`` still works and
warns that it moved, and so does a name whose 0.2 module was split (``from ms_accum.parallel import
init_data_parallel``) or a keyword that was renamed (``Plan(accumulate_steps=...)``). `tests/test_compat.py` lists
every 0.2 name. Delete this module, its call in ``__init__`` and its decorators in the next release."""
import functools
import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {
    "_ops": "core._ops", "buffer": "core.buffer", "guard": "core.guard", "statistics": "core.statistics",
    "parallel": "core.parallel", "losses": "core.losses",
    "accumulator": "graphs.accumulator", "cells": "graphs.cells", "window": "graphs.window",
    "executor": "train.executor", "resume": "train.resume", "checkpoint": "train.checkpoint",
    "schedule": "train.schedule", "lr": "train.lr", "recompute": "train.recompute",
    "verify": "tools.verify", "causes": "tools.causes", "planner": "tools.planner", "norm": "tools.norm",
    "factory": "tools.factory",
    "data": "demo.data", "models": "demo.models", "evaluation": "demo.evaluation",
}

# Names of a 0.2 module that live elsewhere than its new module: (old module, name) -> "new.module" or
# "new.module:new_name". `ms_accum.parallel` was split in two: the window's reduction stayed in the core, joining msrun
# went up to training.
MOVED_NAMES = {
    **{("parallel", name): "train.distributed" for name in (
        "LAUNCHER_ROLES", "distributed_launch", "init_data_parallel", "check_same_on_all_ranks", "gather_ints")},
    ("executor", "StepRecord"): "train.records", ("executor", "NonFiniteError"): "train.records",
    ("executor", "PARTIAL_WINDOWS"): "_choices", ("executor", "count_windows"): "train.windows",
    ("executor", "windows_per_epoch"): "_compat:windows_per_epoch",
    ("causes", "in_inference"): "core.inference",
    ("planner", "REDUCTIONS"): "_choices",
    ("factory", "builtin_model"): "tools.factory:load_model",
    ("statistics", "harmonic_mean"): "_compat:harmonic_mean",
}

# Names of 0.2 that are gone, with what replaced them: internals of 0.2's executor, which the structures replaced.
REMOVED = {
    **{("executor", name): "the structures of 'ms_accum.train.structures' (GradientAccumulation(structure=...))"
       for name in ("MicroBatches", "ThreeGraphsRunner", "FusedRunner", "WindowRunner")},
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"'{old}' is deprecated and will be removed in the next release; {new}.", DeprecationWarning,
                  stacklevel=stacklevel + 1)


class _SplitModule(types.ModuleType):
    """A 0.2 module whose names now live in several modules: its new module's names, and `MOVED_NAMES`'s."""

    def __init__(self, name: str, package: str, old: str) -> None:
        super().__init__(name)
        self.__package_name, self.__old = package, old
        self.__module = importlib.import_module(f"{package}.{MOVED[old]}")

    def __getattr__(self, name: str):
        key = (self.__old, name)
        if key in MOVED_NAMES:
            module, _, new_name = MOVED_NAMES[key].partition(":")
            place = "ms_accum._compat" if module == "_compat" else f"{self.__package_name}.{module}"
            if module != "_compat":
                _warn(f"{self.__name__}.{name}", f"import {new_name or name!r} from {place!r}", 2)
            else:
                _warn(f"{self.__name__}.{name}", "it is kept for this release only", 2)
            return getattr(importlib.import_module(place), new_name or name)
        if key in REMOVED:
            raise AttributeError(f"'{self.__name__}.{name}' was removed in ms_accum 0.3: use {REMOVED[key]}.")
        return getattr(self.__module, name)

    def __dir__(self):
        return sorted(set(dir(self.__module)) | {name for old, name in MOVED_NAMES if old == self.__old})


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<package>.<old name>`` and makes it the module at its new place (or, for a split module, a module that
    finds its names in every new place)."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, old = fullname.rpartition(".")
        if prefix != self.package or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        old = spec.name.rpartition(".")[2]
        new = f"{self.package}.{MOVED[old]}"
        others = sorted({f"'{self.package}.{place.partition(':')[0]}'" for (module, _), place in MOVED_NAMES.items()
                         if module == old and not place.startswith("_compat")})
        _warn(spec.name, f"import '{new}'" + (f" (and {', '.join(others)})" if others else ""), 2)
        if any(module == old for module, _ in {**MOVED_NAMES, **REMOVED}):
            return _SplitModule(spec.name, self.package, old)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the new module ran when it was imported


def install_module_aliases(package: str) -> None:
    """Lets the 0.2 module paths of `package` import their new modules."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias(package))


def renamed_keyword(old: str, new: str):
    """A class decorator: its constructor also takes the keyword `old`, 0.2's name of `new`, with a warning."""
    def decorate(cls):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):  # noqa: N807
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{cls.__name__}() got both '{new}' and its deprecated name '{old}'")
                _warn(f"{cls.__name__}({old}=...)", f"use '{new}'", 2)
                kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)
        cls.__init__ = __init__
        return cls
    return decorate


def windows_per_epoch(num_batches: int, mini_steps: int, partial_window: str = "apply") -> int:
    """0.2's `ms_accum.executor.windows_per_epoch`: the optimizer steps of one epoch of `num_batches` batches in
    windows of `mini_steps` (`ms_accum.train.windows.count_windows` over one epoch)."""
    count_windows = importlib.import_module("ms_accum.train.windows").count_windows
    return count_windows(num_batches, 1, mini_steps, 1, partial_window)


def harmonic_mean(weights) -> float:
    """0.2's `ms_accum.statistics.harmonic_mean`: the harmonic mean of positive `weights`."""
    return len(weights) / sum(1.0 / w for w in weights)

"""The module paths of ms_accum 0.2 (a flat package), kept for one release: ``import ms_accum.data`` still works and
warns that it moved. Delete this module, and its call in ``__init__``, in the next release."""
import importlib
import importlib.abc
import importlib.util
import sys
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


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<package>.<old name>`` and makes it the module at its new place."""

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
        warnings.warn(f"'{spec.name}' is deprecated and will be removed in the next release; import '{new}'.",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the new module ran when it was imported


def install_module_aliases(package: str) -> None:
    """Lets the 0.2 module paths of `package` import their new modules."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias(package))

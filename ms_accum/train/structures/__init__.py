"""Structures: how the executor runs a window's micro-batches (docs/structures.md).

Each structure is one module here, named as the structure, whose `STRUCTURE` class owns its Cells, its refusals and its
loop (`base.Structure`). Adding one takes its module and its name in `ms_accum._choices.STRUCTURES`, nothing else.
"""
from __future__ import annotations

import importlib
from typing import Type

from ..._choices import AUTO_STRUCTURE
from .base import Closer, Parts, Structure, WindowResult

__all__ = ["Closer", "Parts", "Structure", "WindowResult", "structure_class"]


def structure_class(name: str) -> Type[Structure]:
    """The class of the structure `name` (one of `ms_accum._choices.STRUCTURES`; ``"auto"`` is `AUTO_STRUCTURE`)."""
    name = AUTO_STRUCTURE if name == "auto" else name
    return importlib.import_module(f".{name}", __name__).STRUCTURE

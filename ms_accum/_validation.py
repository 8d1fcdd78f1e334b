"""Argument checks that speak MindSpore's error wording.

Every public entry point validates its arguments here, before anything is compiled or written, so a user
sees `For 'Accumulator', the argument 'accumulate_step' must be a positive int, but got 0.` instead of a
graph-compiler trace. `assert` is never used: it vanishes under `python -O`.
"""
from __future__ import annotations

import math
import os
from typing import Any, Iterable, Optional, Tuple, Type, Union


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_positive_int(value: Any, arg_name: str, cls_name: str, minimum: int = 1) -> int:
    """Return `value` if it is an int >= `minimum` (bool is refused: `True` is not a step count)."""
    kind = "a positive int" if minimum == 1 else "a non-negative int"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"For '{cls_name}', the argument '{arg_name}' must be {kind}, "
                        f"but got {value!r} of type {_type_name(value)}.")
    if value < minimum:
        raise ValueError(f"For '{cls_name}', the argument '{arg_name}' must be {kind}, but got {value}.")
    return value



def check_positive_float(value: Any, arg_name: str, cls_name: str, allow_none: bool = False) -> Optional[float]:
    """Return `value` as a float if it is a finite real number > 0 (or None when `allow_none`)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"For '{cls_name}', the argument '{arg_name}' must be a positive float, "
                        f"but got {value!r} of type {_type_name(value)}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"For '{cls_name}', the argument '{arg_name}' must be a positive float, "
                         f"but got {value}.")
    return float(value)


def check_value_in(value: Any, arg_name: str, options: Iterable[str], cls_name: str) -> str:
    """Return `value` if it is one of `options`."""
    options = tuple(options)
    if not isinstance(value, str):
        raise TypeError(f"For '{cls_name}', the argument '{arg_name}' must be str, one of {list(options)}, "
                        f"but got {value!r} of type {_type_name(value)}.")
    if value not in options:
        raise ValueError(f"For '{cls_name}', the argument '{arg_name}' must be one of {list(options)}, "
                         f"but got '{value}'.")
    return value


def check_isinstance(value: Any, arg_name: str, types: Union[Type, Tuple[Type, ...]], cls_name: str) -> Any:
    """Return `value` if it is an instance of `types` (None is always refused)."""
    if not isinstance(value, types):
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise TypeError(f"For '{cls_name}', the argument '{arg_name}' must be {expected}, "
                        f"but got {value!r} of type {_type_name(value)}.")
    return value


def check_callable(value: Any, arg_name: str, cls_name: str) -> Any:
    """Return `value` if it can be called (a Cell or a function)."""
    if value is None or not callable(value):
        raise TypeError(f"For '{cls_name}', the argument '{arg_name}' must be a Cell or a callable, "
                        f"but got {value!r} of type {_type_name(value)}.")
    return value


def check_writable_dir(path: Any, arg_name: str, cls_name: str) -> str:
    """Create `path` if needed and prove it is writable, so a long run cannot fail at its first save."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"For '{cls_name}', the argument '{arg_name}' must be a directory path, "
                        f"but got {path!r} of type {_type_name(path)}.")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"For '{cls_name}', the argument '{arg_name}' must be a writable directory, "
                         f"but '{path}' is a file.")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ValueError(f"For '{cls_name}', the argument '{arg_name}' must be a writable directory, "
                         f"but '{path}' cannot be created: {err.strerror}.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"For '{cls_name}', the argument '{arg_name}' must be a writable directory, "
                         f"but '{path}' is not writable.")
    return path

"""Argument checks that speak MindSpore's error wording.

Every public entry point validates its arguments here, before anything is compiled or written, so a user
sees `For 'Accumulator', the argument 'accumulate_step' must be a positive int, but got 0.` instead of a
graph-compiler trace. `assert` is never used: it vanishes under `python -O`.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
from typing import Any, Iterable, Optional, Tuple, Type, Union


class ArgumentError(Exception):
    """An argument refused. `detail` says which argument and what was expected; the public function the user called
    (`door`) puts its name in front, in MindSpore's wording: ``For 'Accumulator', the argument ...``.

    Inner code raises it without knowing who called: the outermost `door` an error passes through names it, so a
    class built by another (the executor's buffer) speaks in the name the user called. `named` fixes the name for
    good, for an error about another door's arguments found later (a loss that does not fit, found when training).
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.caller: Optional[str] = None
        self.final = False

    def named(self, name: str) -> "ArgumentError":
        """This error, named after `name` whatever door it passes through next."""
        self.caller, self.final = name, True
        return self

    def __str__(self) -> str:
        return self.detail if self.caller is None else f"For '{self.caller}', {self.detail}"


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type."""


class ArgumentValueError(ArgumentError, ValueError):
    """An argument of the right type and a wrong value."""


class NoBatchError(ArgumentValueError):
    """A dataset that yields no batch of the size asked for: `samples` is how many samples it holds (None if unknown),
    so a caller can say which batch size would do."""

    def __init__(self, detail: str, samples: Optional[int]) -> None:
        super().__init__(detail)
        self.samples = samples


class door(contextlib.ContextDecorator):  # noqa: N801  (read as a decorator: @door("Accumulator"))
    """A public entry point: an `ArgumentError` raised inside is named after `name`, unless an outer door, the one
    the user called, names it after itself. As a decorator or a ``with`` block. A `final` door names them for good:
    for errors about another door's arguments found later (a loss that does not fit, found when training)."""

    def __init__(self, name: str, final: bool = False) -> None:
        self.name, self.final = name, final

    def __enter__(self) -> "door":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, ArgumentError) and not error.final:
            error.caller, error.final = self.name, self.final
        return False


def describe_exception(err: BaseException) -> str:
    """`err` in one line, for a message that wraps a user's or MindSpore's error: its type and first paragraph
    (MindSpore appends its stacks after a blank line or a rule of dashes), and the last exception line of a Python
    traceback it quotes (a data pipeline's map function that raised)."""
    text = str(err).strip()
    head = first_paragraph(text)
    causes = [line.strip() for line in text.splitlines() if _EXCEPTION_LINE.match(line.strip())]
    cause = f" {causes[-1]}" if causes and causes[-1] not in head else ""
    return f"{type(err).__name__}: {head or '(no message)'}{cause}"


def first_paragraph(text: str) -> str:
    """The lines of `text` before its first blank line or rule of dashes, joined into one."""
    lines = []
    for line in text.strip().splitlines():
        if not line.strip() or line.strip().startswith("---"):
            break
        lines.append(line.strip())
    return " ".join(lines)


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)(: .*)?$")  # the last line of a Python traceback


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_positive_int(value: Any, arg_name: str, minimum: int = 1) -> int:
    """Return `value` if it is an int >= `minimum` (bool is refused: `True` is not a step count)."""
    kind = "a positive int" if minimum == 1 else "a non-negative int"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"the argument '{arg_name}' must be {kind}, "
                                f"but got {value!r} of type {_type_name(value)}.")
    if value < minimum:
        raise ArgumentValueError(f"the argument '{arg_name}' must be {kind}, but got {value}.")
    return value


def check_positive_float(value: Any, arg_name: str, allow_none: bool = False) -> Optional[float]:
    """Return `value` as a float if it is a finite real number > 0 (or None when `allow_none`)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"the argument '{arg_name}' must be a positive float, "
                                f"but got {value!r} of type {_type_name(value)}.")
    if not math.isfinite(value) or value <= 0:
        raise ArgumentValueError(f"the argument '{arg_name}' must be a positive float, "
                                 f"but got {value}.")
    return float(value)


def check_value_in(value: Any, arg_name: str, options: Iterable[str]) -> str:
    """Return `value` if it is one of `options`."""
    options = tuple(options)
    if not isinstance(value, str):
        raise ArgumentTypeError(f"the argument '{arg_name}' must be str, one of {list(options)}, "
                                f"but got {value!r} of type {_type_name(value)}.")
    if value not in options:
        raise ArgumentValueError(f"the argument '{arg_name}' must be one of {list(options)}, "
                                 f"but got '{value}'.")
    return value


def check_isinstance(value: Any, arg_name: str, types: Union[Type, Tuple[Type, ...]]) -> Any:
    """Return `value` if it is an instance of `types` (None is always refused)."""
    if not isinstance(value, types):
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise ArgumentTypeError(f"the argument '{arg_name}' must be {expected}, "
                                f"but got {value!r} of type {_type_name(value)}.")
    return value


def check_callable(value: Any, arg_name: str) -> Any:
    """Return `value` if it can be called (a Cell or a function)."""
    if value is None or not callable(value):
        raise ArgumentTypeError(f"the argument '{arg_name}' must be a Cell or a callable, "
                                f"but got {value!r} of type {_type_name(value)}.")
    return value


def check_writable_dir(path: Any, arg_name: str) -> str:
    """Create `path` if needed and prove it is writable, so a long run cannot fail at its first save."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ArgumentTypeError(f"the argument '{arg_name}' must be a directory path, "
                                f"but got {path!r} of type {_type_name(path)}.")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentValueError(f"the argument '{arg_name}' must be a writable directory, "
                                 f"but '{path}' is a file.")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ArgumentValueError(f"the argument '{arg_name}' must be a writable directory, "
                                 f"but '{path}' cannot be created: {err.strerror}.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ArgumentValueError(f"the argument '{arg_name}' must be a writable directory, "
                                 f"but '{path}' is not writable.")
    return path

"""Argument checks that speak MindSpore's error wording.

Every public entry point validates its arguments here, before anything is compiled or written, so a user
sees `For 'Accumulator', the argument 'accumulate_step' must be a positive int, but got 0.` instead of a
graph-compiler trace. `assert` is never used: it vanishes under `python -O`.
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import os
import string
from typing import Any, Iterable, List, Optional, Tuple, Type, Union


class Words:
    """How a message names arguments: the library says ``'name'`` and ``name=value``; the command line subclasses it
    to say its flags (`ms_accum.cli.errors`). The one place either wording is written."""

    def name(self, name: str) -> str:
        """A reference to the argument `name`."""
        return f"'{name}'"

    def subject(self, name: str) -> str:
        """The argument `name` as the subject of a sentence."""
        return f"the argument {self.name(name)}"

    def plain(self, name: str) -> str:
        """The argument `name` unquoted, as prose names it."""
        return name

    def setting(self, name: str, value: Any) -> str:
        """The argument `name` given `value`."""
        return f"{name}={value!r}"

    def unset(self, value: Any) -> str:
        """What a setting must be to be left out, `value` in the library (``None``, ``False``)."""
        return f"be {value}"

    def aside(self, text: str) -> str:
        """A remark for library users only (the command line leaves it out)."""
        return text

    def term(self, value: "Term") -> str:
        """An upper layer's object inside a message: its `str`, the library's words for it."""
        return str(value)


LIBRARY = Words()


class Message:
    """
    Text as data: a `template` whose fields name arguments or hold values, rendered by `render` in a reader's `Words`.
    A field's form says which it is:

    - ``{@name}``: the argument `name`, quoted (``{@name:subject}``: as a sentence's subject, "the argument ...";
      ``{@name:plain}``: unquoted, as prose names a flag); it takes no value;
    - ``{name=}``: the argument `name` set to the value ``values[name]``;
    - ``{key}``, ``{key!r}``, ``{key:spec}``: the value ``values[key]``, formatted; a value with a ``render(words)``
      method (another message, a `Term`) is rendered in the same words, an `Argument` (an argument named only at run
      time) as an argument field with the same spec;
    - ``{_none}``, ``{_false}``: what a setting must be to be left out ("be None", "be False"; the command line
      says "not be given"); they take no value.

    So a message's wording can change freely: no reader parses it (the command line renders the same data). The
    template is checked as the message is built: a field of another form, a value field without a value, or a value
    that no field uses is a `TypeError`, a bug in ms_accum (tests/test_messages.py checks every template).
    """

    def __init__(self, template: str, **values: Any) -> None:
        self.template, self.values = template, values
        _check(template, values)
        if isinstance(self, BaseException):  # an error or a warning: its exception arguments are the bare template
            super().__init__(template)

    @property
    def arguments(self) -> Tuple[str, ...]:
        """The arguments the message is about, in the order it names them."""
        named = (self._named(field) for _, field, _, _ in _parts(self.template) if field is not None)
        return tuple(dict.fromkeys(name for name in named if name is not None))

    def render(self, words: Words = LIBRARY) -> str:
        """The message in `words` (the library's by default)."""
        return "".join(literal + ("" if field is None else self._field(field, spec, conversion, words))
                       for literal, field, spec, conversion in _parts(self.template))

    def __str__(self) -> str:
        return self.render()

    def _named(self, field: str) -> Optional[str]:
        """The argument `field` names, if it names one."""
        if field.startswith("@"):
            return field[1:]
        if field.endswith("="):
            return field[:-1]
        value = self.values.get(field)
        return value.name if isinstance(value, (Argument, Setting)) else None

    def _field(self, field: str, spec: str, conversion: Optional[str], words: Words) -> str:
        if field in UNSET:
            return words.unset(UNSET[field])
        if field.startswith("@"):
            return _reference(words, field[1:], spec)
        if field.endswith("="):
            return words.setting(field[:-1], self.values[field[:-1]])
        value = self.values[field]
        if isinstance(value, Argument):
            return value.render(words, spec)
        if hasattr(value, "render"):
            return value.render(words)
        return format(repr(value) if conversion == "r" else value, spec)


# The fields that say what a setting must be to be left out (`Words.unset`).
UNSET = {"_none": None, "_false": False}
# How an argument field says its argument, by its spec (``{@name:spec}``, or an `Argument` value's field): the
# `Words` method that says it.
REFERENCES = {"": "name", "subject": "subject", "plain": "plain"}


def _parts(template: str) -> list:
    """The template's (literal, field, spec, conversion) parts."""
    return list(string.Formatter().parse(template))


def _check(template: str, values: dict) -> None:
    """Refuses a template whose fields and `values` do not match (`Message`): a bug in ms_accum, so a `TypeError` that
    names the template, found by tests rather than by a user reading a garbled message."""
    try:
        parts = _parts(template)
    except ValueError as err:
        raise TypeError(f"The message template {template!r} does not parse: {err}.") from None
    used, bad = set(), []
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field.startswith("@"):  # (the name, whether spec and conversion fit the form, whether it takes a value)
            name, fits, valued = field[1:], spec in REFERENCES and not conversion, False
        elif field in UNSET:
            name, fits, valued = field[1:], not spec and not conversion, False
        elif field.endswith("="):
            name, fits, valued = field[:-1], not spec and not conversion, True
        else:
            name, fits, valued = field, conversion in (None, "r") and "{" not in spec, True
        if not (name.isidentifier() and fits):
            bad.append(repr(field))
        elif valued:
            used.add(name)
    missing, unused = sorted(used - set(values)), sorted(set(values) - used)
    if bad or missing or unused:
        said = [f"{what}: {', '.join(names)}" for what, names in (("fields of no known form", bad),
                                                                  ("fields without a value", missing),
                                                                  ("values no field uses", unused)) if names]
        raise TypeError(f"The message template {template!r} does not fit its values: {'; '.join(said)}.")


def _reference(words: Words, name: str, spec: str) -> str:
    """The argument `name` in `words`, as `spec` asks (`REFERENCES`; another spec is a KeyError)."""
    return getattr(words, REFERENCES[spec])(name)


class Argument:
    """An argument named only at run time (a check shared by several arguments), inside a message."""

    def __init__(self, name: str) -> None:
        self.name = name

    def render(self, words: Words, spec: str = "") -> str:
        return _reference(words, self.name, spec)


class Setting:
    """An argument set to a value, inside a message, when which argument is known only at run time."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def render(self, words: Words) -> str:
        return words.setting(self.name, self.value)


class Aside:
    """A remark inside a message for library users only, e.g. a method to call (`Words.aside`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def render(self, words: Words) -> str:
        return words.aside(self.text)


class Term:
    """An upper layer's object inside a message (a training state's window): the library says its `str`, and a reader
    may say it in its own terms (`Words.term`); this layer knows none of them."""

    def render(self, words: Words) -> str:
        return words.term(self)


class MessageError(Message, Exception):
    """An error whose text is a `Message`."""


class CallError(MessageError):
    """A call refused, as data: the `Message` says what was expected; the public function the user called (`door`) is
    named in front, in MindSpore's wording: ``For 'Accumulator', the argument ...``.

    Inner code raises it without knowing who called: the outermost `door` an error passes through names it, so a class
    built by another (the executor's buffer) speaks in the name the user called. `named` fixes the name for good, for an
    error about another door's arguments found later (a loss that does not fit, found when training)."""

    def __init__(self, template: str, **values: Any) -> None:
        super().__init__(template, **values)
        self.caller: Optional[str] = None
        self.final = False

    def named(self, name: str) -> "CallError":
        """This error, named after `name` whatever door it passes through next."""
        self.caller, self.final = name, True
        return self

    def __str__(self) -> str:
        text = self.render()
        return text if self.caller is None else f"For '{self.caller}', {text}"


class ArgumentError(CallError):
    """An argument refused: the `Message` says which arguments (`arguments`) and what was expected."""


class StateError(CallError, RuntimeError):
    """A call refused for the state it finds, not for its arguments (a buffer that holds an open window, a process
    that no launcher started, every dropout slot taken): the message says what the state must be."""


_AS_DATA = (Message, Argument, Setting, Aside, Term)


class ArgumentWarning(Message, UserWarning):
    """A warning about arguments, as data: a command line renders the `Message` in its own words. (Unlike an error it
    names no door: the warning's line, the user's call, says where.)"""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type."""


class ArgumentValueError(ArgumentError, ValueError):
    """An argument of the right type and a wrong value."""


class NoBatchError(ArgumentValueError):
    """A dataset that yields no batch of the size asked for: `samples` is how many samples it holds (None if unknown),
    so a caller can say which batch size would do."""

    def __init__(self, template: str, samples: Optional[int], **values: Any) -> None:
        super().__init__(template, **values)
        self.samples = samples


def as_data(value: Any) -> Any:
    """`value`, a message (an error whose text is one) or a value inside one, as JSON data, to cross a process
    boundary whole (a plan's trial): a message, `Argument`, `Setting`, `Aside` or `Term` as its class's name, its
    exception arguments and its state; `from_data` rebuilds it. A value of another kind is a TypeError."""
    if value is None or type(value) in (str, bool, int, float):
        return value
    if type(value) in (list, tuple):
        return {type(value).__name__: [as_data(item) for item in value]}
    if type(value) is dict:
        return {"dict": [[key, as_data(item)] for key, item in value.items()]}
    if not isinstance(value, _AS_DATA):
        raise TypeError(f"{type(value).__name__} is not message data.")
    kind = type(value)
    return {"kind": [kind.__module__, kind.__qualname__, as_data(getattr(value, "args", ())), as_data(vars(value))]}


def from_data(data: Any) -> Any:
    """The value `as_data` made `data` of."""
    if not isinstance(data, dict):
        return data
    [(tag, body)] = data.items()
    if tag == "dict":
        return {key: from_data(item) for key, item in body}
    if tag in ("list", "tuple"):
        return (list if tag == "list" else tuple)(map(from_data, body))
    module, name, args, state = body
    kind = getattr(importlib.import_module(module), name) if module.startswith(__package__ + ".") else None
    if not (isinstance(kind, type) and issubclass(kind, _AS_DATA)):  # the class a trial names must be one of these
        raise TypeError(f"{module}.{name} is not a kind of message data.")
    value = kind.__new__(kind, *from_data(args))
    vars(value).update(from_data(state))
    return value


class door(contextlib.ContextDecorator):  # noqa: N801  (read as a decorator: @door("Accumulator"))
    """A public entry point: a `CallError` raised inside is named after `name`, unless an outer door, the one
    the user called, names it after itself. As a decorator or a ``with`` block. A `final` door names them for good:
    for errors about another door's arguments found later (a loss that does not fit, found when training)."""

    def __init__(self, name: str, final: bool = False) -> None:
        self.name, self.final = name, final

    def __enter__(self) -> "door":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, CallError) and not error.final:
            error.caller, error.final = self.name, self.final
        return False


def describe_exception(err: BaseException) -> str:
    """`err` in one line, for a message that wraps a user's or MindSpore's error: its type and first paragraph
    (MindSpore appends its stacks after a blank line or a rule of dashes), and the last exception line of a Python
    traceback it quotes (a data pipeline's map function that raised)."""
    text = str(err).strip()
    head = first_paragraph(text)
    causes = [line.strip() for line in text.splitlines() if _is_exception_line(line.strip())]
    cause = f" {causes[-1]}" if causes and causes[-1] not in head else ""
    return f"{type(err).__name__}: {head or '(no message)'}{cause}"


class ChildError(Exception):
    """
    An exception a child process raised (a plan's trial), as it crosses back: its line there (`describe_exception`'s)
    and its traceback's frames, which a command line shows as it shows any error's.

    Args:
        line (str): The exception's type and message.
        frames (list[traceback.FrameSummary]): Its traceback's frames, innermost last.
    """

    def __init__(self, line: str, frames: list) -> None:
        super().__init__(line)
        self.frames = frames


def causes(err: BaseException) -> List[BaseException]:
    """`err` and the exceptions it was raised from or while handling, as Python prints them: outermost first."""
    chain: List[BaseException] = []
    while err is not None and all(err is not seen for seen in chain):
        chain.append(err)
        err = err.__cause__ if err.__cause__ is not None or err.__suppress_context__ else err.__context__
    return chain


def first_paragraph(text: str) -> str:
    """The lines of `text` before its first blank line or rule of dashes, joined into one."""
    lines = (line.strip() for line in text.strip().splitlines())
    return " ".join(itertools.takewhile(lambda line: line and not line.startswith("---"), lines))


def _is_exception_line(line: str) -> bool:
    """Whether `line` is the last line of a Python traceback: ``package.SomeError`` or ``SomeError: message``."""
    name = line.partition(": ")[0]
    return name.endswith(("Error", "Exception")) and all(part.isidentifier() for part in name.split("."))


def wrong_type(value: Any, arg_name: str, expected: str) -> ArgumentTypeError:
    """The refusal of `value` for the argument `arg_name`, which must be `expected` (e.g. "a positive int")."""
    return ArgumentTypeError("{arg:subject} must be {expected}, but got {value!r} of type {type}.",
                             arg=Argument(arg_name), expected=expected, value=value, type=type(value).__name__)


def check_positive_int(value: Any, arg_name: str, minimum: int = 1) -> int:
    """Return `value` if it is an int >= `minimum` (bool is refused: `True` is not a step count)."""
    kind = "a positive int" if minimum == 1 else "a non-negative int"
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(value, arg_name, kind)
    if value < minimum:
        raise ArgumentValueError("{arg:subject} must be {kind}, but got {value}.", arg=Argument(arg_name), kind=kind,
                                 value=value)
    return value


def check_positive_float(value: Any, arg_name: str, allow_none: bool = False) -> Optional[float]:
    """Return `value` as a float if it is a finite real number > 0 (or None when `allow_none`)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(value, arg_name, "a positive float")
    if not math.isfinite(value) or value <= 0:
        raise ArgumentValueError("{arg:subject} must be a positive float, but got {value}.", arg=Argument(arg_name),
                                 value=value)
    return float(value)


def check_value_in(value: Any, arg_name: str, options: Iterable[str]) -> str:
    """Return `value` if it is one of `options`."""
    options = tuple(options)
    if not isinstance(value, str):
        raise wrong_type(value, arg_name, f"str, one of {list(options)}")
    if value not in options:
        raise ArgumentValueError("{arg:subject} must be one of {options}, but got '{value}'.", arg=Argument(arg_name),
                                 options=list(options), value=value)
    return value


def check_isinstance(value: Any, arg_name: str, types: Union[Type, Tuple[Type, ...]]) -> Any:
    """Return `value` if it is an instance of `types` (None is always refused)."""
    if not isinstance(value, types):
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise wrong_type(value, arg_name, expected)
    return value


def check_callable(value: Any, arg_name: str) -> Any:
    """Return `value` if it can be called (a Cell or a function)."""
    if value is None or not callable(value):
        raise wrong_type(value, arg_name, "a Cell or a callable")
    return value


def check_writable_dir(path: Any, arg_name: str) -> str:
    """Create `path` if needed and prove it is writable, so a long run cannot fail at its first save."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise wrong_type(path, arg_name, "a directory path")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentValueError("{arg:subject} must be a writable directory, but '{path}' is a file.",
                                 arg=Argument(arg_name), path=path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ArgumentValueError("{arg:subject} must be a writable directory, but '{path}' cannot be created: "
                                 "{reason}.", arg=Argument(arg_name), path=path, reason=err.strerror) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ArgumentValueError("{arg:subject} must be a writable directory, but '{path}' is not writable.",
                                 arg=Argument(arg_name), path=path)
    return path

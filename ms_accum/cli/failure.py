"""What a command prints when it fails, around its one line (`errors.error_line`): whose error it was decides.

- An error the user fixes from the command line, the files or the machine (`expected`: an argument, data, a
  checkpoint, a window that is not finite, no C++ compiler, the disk, memory) is the one line alone.
- An error whose traceback passes through the user's own code (a factory, its data, a network's ``construct``) shows
  those frames first, as Python shows a traceback but with the user's frames only, and the exception they raised;
  then the line. MindSpore raises a ``construct``'s compile errors and a dataset's Python errors from its own frames
  and quotes the user's in its message (``In file PATH:LINE``, or a Python traceback): those are shown as frames too.
- Anything else raised in ms_accum's own code is a bug in ms_accum: the line, and how to report it (with what
  ``ms-accum env`` prints).
- ``--traceback``, or ``MS_ACCUM_TRACEBACK=1`` in the environment: the whole stack of any error (every exception of the
  chain, every frame, MindSpore's full message) before the line.

Whose code a frame is, its file says: ms_accum's package, the standard library, site-packages and MindSpore are not the
user's; any other file is, and so is the factory's own module wherever it is installed.
"""
from __future__ import annotations

import argparse
import ast
import functools
import linecache
import os
import site
import sys
import sysconfig
import traceback
from typing import Iterable, List, Optional, Tuple

from .. import __version__
from .._validation import ChildError, MessageError, causes, describe_exception
from .errors import error_line

VARIABLE = "MS_ACCUM_TRACEBACK"
HEADER = "Traceback (most recent call last, your code's frames):"
TRACKER = "the project's issue tracker (README.md, Reporting a problem)"  # the package knows no public address
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wants_traceback(args: argparse.Namespace) -> bool:
    """Whether the whole stack is asked for: ``--traceback`` (after the command or before it), or `VARIABLE` set to
    anything but "" or "0"."""
    asked = getattr(args, "traceback", False) or getattr(args, "traceback_first", False)
    return bool(asked) or os.environ.get(VARIABLE, "") not in ("", "0")


def explain(err: BaseException, args: argparse.Namespace) -> str:
    """What the command prints on stderr for `err`, its last line the one `error_line`: the user's frames above it
    when their code raised, the whole stack when asked for, and the bug notice when ms_accum's own code raised."""
    own = _factory_files(args)
    stack = ("".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip("\n")
             if wants_traceback(args) else users_traceback(err, own))
    lines = [stack] if stack else []
    lines.append(f"ms-accum {args.command}: error: {error_line(err, args)}")
    if is_bug(err, own):
        with_what = "this output" if wants_traceback(args) else "the output of the same command with --traceback"
        lines.append(f"ms-accum {args.command}: this is a bug in ms_accum {__version__}: please report it with "
                     f"{with_what} and what 'ms-accum env --json' prints, on {TRACKER}.")
    return "\n".join(lines)


def users_traceback(err: BaseException, own: Tuple[str, ...] = ()) -> str:
    """The user's frames of `err` as Python prints a traceback, under `HEADER`, and the exception they raised; "" when
    no frame is the user's. Of the chain of causes, the exception nearest the root that has user frames is shown: the
    error the user's code raised, not the one ms_accum wrapped it in."""
    for cause in reversed(causes(err)):
        frames = [frame for frame in _frames(cause) if is_users(frame.filename, own)]
        if frames:
            listed = "".join(traceback.StackSummary.from_list(frames).format()).rstrip("\n")
            line = str(cause) if isinstance(cause, ChildError) else describe_exception(cause)  # as its process said
            return f"{HEADER}\n{listed}\n{line}"
    return ""


def is_bug(err: BaseException, own: Tuple[str, ...] = ()) -> bool:
    """Whether `err` is a bug in ms_accum: not an error it raises for the user (`expected`), nor one of the user's
    code, and raised in ms_accum's own code (the standard library's frames it called left aside). An error raised
    inside MindSpore is not counted: the user's network is as likely a cause as ms_accum (--traceback shows it)."""
    chain = causes(err)
    if expected(err) or expected(chain[-1]) or users_traceback(err, own):
        return False
    frames = [frame.filename for frame in traceback.extract_tb(chain[-1].__traceback__)
              if not _under(frame.filename, _stdlib()) or _under(frame.filename, _site())]
    return bool(frames) and _under(frames[-1], (PACKAGE,))


def expected(err: BaseException) -> bool:
    """Whether `err` is a failure ms_accum reports to the user rather than a bug: its own errors about arguments,
    data, checkpoints and a window that is not finite (`MessageError`), a kernel that cannot be built here, the
    operating system's errors (a file, the disk) and memory running out."""
    return isinstance(err, (MessageError, OSError, MemoryError))


def is_users(filename: str, own: Tuple[str, ...] = ()) -> bool:
    """Whether the file `filename` is the user's code: a real file outside ms_accum, the standard library,
    site-packages and MindSpore, or one of `own` (the factory's module, wherever it is installed)."""
    if not filename or filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    mindspore = os.path.dirname(getattr(sys.modules.get("mindspore"), "__file__", None) or "")
    return _under(filename, own) or not _under(filename, (PACKAGE, mindspore, *_stdlib(), *_site()))


def _frames(err: BaseException) -> List[traceback.FrameSummary]:
    """Every frame of `err`: those of its traceback (a planner's trial's, in its process), the file and line of a
    SyntaxError, then the frames MindSpore quotes in its message (a construct it compiled, a dataset's Python
    function), innermost last."""
    frames = list(traceback.extract_tb(err.__traceback__)) + (err.frames if isinstance(err, ChildError) else [])
    if isinstance(err, SyntaxError) and err.filename and err.lineno:
        frames.append(traceback.FrameSummary(err.filename, err.lineno, "<module>"))
    return frames + quoted_frames(str(err))


def quoted_frames(text: str) -> List[traceback.FrameSummary]:
    """The frames a MindSpore message quotes: ``# 3 In file PATH:LINE[~LINE], COLUMNS`` (the construct code it
    compiled, nested expressions of one function each, kept as that function's innermost line) and
    ``File "PATH", line N, in NAME`` (a Python traceback, a dataset's)."""
    frames: List[traceback.FrameSummary] = []
    for line in (raw.strip() for raw in text.splitlines()):
        number, marker, where = line.partition(" In file ")
        if marker and number.startswith("#"):
            path, _, lines = (where.rpartition(", ")[0] or where).rpartition(":")
            first = lines.split("~")[0]
            if path and first.isdigit():
                # The innermost function around the line, as a traceback names a frame.
                around = [(start, name) for start, end, name in _functions(path) if start <= int(first) <= end]
                frame = traceback.FrameSummary(path, int(first), max(around)[1] if around else "<module>")
                if frames and (frames[-1].filename, frames[-1].name) == (frame.filename, frame.name):
                    frames.pop()  # an outer expression of the same function: Python shows one line per call
                frames.append(frame)
        elif line.startswith('File "'):
            path, _, rest = line[len('File "'):].partition('", line ')
            lineno, _, name = rest.partition(", in ")
            if lineno.isdigit():
                frames.append(traceback.FrameSummary(path, int(lineno), name or "<module>"))
    return frames


@functools.lru_cache(maxsize=32)
def _functions(path: str) -> Tuple[Tuple[int, int, str], ...]:
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):  # not Python, or not readable: the frame is named by its module
        return ()
    return tuple((node.lineno, node.end_lineno, node.name) for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _factory_files(args: argparse.Namespace) -> Tuple[str, ...]:
    """The file or package directory of the factory's module (``--model package.module:function``), which is the
    user's code even when installed in site-packages; none for a built-in model, or one of ms_accum or MindSpore."""
    model = getattr(args, "model", None) or ""
    top = model.partition(":")[0].split(".")[0] if ":" in model else ""
    module = sys.modules.get(top) if top not in ("", "ms_accum", "mindspore") else None
    if module is None:
        return ()
    return tuple(getattr(module, "__path__", None) or [getattr(module, "__file__", None) or ""])


@functools.lru_cache(maxsize=None)
def _stdlib() -> Tuple[str, ...]:
    """The standard library's directories (in a virtualenv, ``platstdlib`` holds its site-packages too)."""
    paths = sysconfig.get_paths()
    return tuple(paths[name] for name in ("stdlib", "platstdlib") if paths.get(name))


@functools.lru_cache(maxsize=None)
def _site() -> Tuple[str, ...]:
    """Where packages are installed: sysconfig's site-packages and the site module's directories."""
    paths = sysconfig.get_paths()
    roots = {paths.get("purelib"), paths.get("platlib"), site.getusersitepackages(),
             *getattr(site, "getsitepackages", list)()}  # absent in some old virtualenvs' site module
    return tuple(root for root in roots if root)


def _under(filename: str, roots: Iterable[Optional[str]]) -> bool:
    path = os.path.realpath(filename)
    return any(path == real or path.startswith(real.rstrip(os.sep) + os.sep)
               for real in (os.path.realpath(root) for root in roots if root))

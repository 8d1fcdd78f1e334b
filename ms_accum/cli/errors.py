"""What a command says when something fails or warns: one line, in its own terms.

The library's errors and warnings are `ms_accum._validation.Message`s: data naming the arguments they are about. A
command renders them in `CliWords`, which say each argument by the flag its parser added for it (`arguments.Parser`),
so no message's wording is an interface: reword one and the command line follows (tests/test_cli_errors.py). The
command line's own errors are messages too, rendered by the same `error_line`.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Optional

from .._validation import (Argument, CallError, Message, MessageError, Term, Words, describe_exception, first_paragraph)

# What a factory returned, by the library's name for it: an error about it names the factory's part.
FACTORY_PARTS = {"network": "network", "loss_fn": "loss_fn", "optimizer": "optimizer", "train_dataset": "'train' data"}


class CliWords(Words):
    """The library's messages in a command's terms: arguments by their flags (those of the command's parser, which
    `args` carries as `flags`: `arguments.Parser`), a factory's parts as the factory's, a training state's window as
    the flags that give it, and no remark meant for library users."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.flags = getattr(args, "flags", {})
        model = getattr(args, "model", None) or ""
        self.factory = model if ":" in model else None

    def name(self, name: str) -> str:
        return f"'{self.plain(name)}'"

    def plain(self, name: str) -> str:
        return self.flags.get(name, name)

    def subject(self, name: str) -> str:
        if self.factory is not None and name in FACTORY_PARTS:
            return f"the {FACTORY_PARTS[name]} of the factory '{self.factory}'"
        return super().subject(name)

    def setting(self, name: str, value: Any) -> str:
        flag = self.flags.get(name)
        if flag is None:
            return super().setting(name, value)
        if value is True or value is False or value is None:
            return flag if value else f"no {flag}"
        return f"{flag} {value}"

    def unset(self, value: Any) -> str:
        return "not be given"

    def aside(self, text: str) -> str:
        return ""

    def term(self, value: Term) -> str:
        # Imported when said: the training layer loads MindSpore, which the command line loads after capping oneDNN.
        from ..train.adaptive import AdaptiveSettings
        from ..train.resume import Layout
        if isinstance(value, Layout):  # --batch-size is the global micro-batch
            k, batch, ranks = value.k, value.batch * value.ranks, value.ranks
            return f"--accumulate-step {k} x --batch-size {batch}" + (f" over {ranks} workers" if ranks > 1 else "")
        if isinstance(value, AdaptiveSettings):  # the settings the command line cannot give are its defaults
            settings = value.settings
            return (f"--adaptive-k {settings['k_min']}:{settings['k_max']} --adaptive-fraction {settings['fraction']} "
                    f"--lr-rule {settings['lr_rule']} --batch-size {settings['global_micro_batch']}")
        return super().term(value)


class CliError(MessageError):
    """A failure the user can fix, a `Message` rendered in the command's own terms (`error_line`); printed as one
    line, named after the command as a refused call is, unless its template starts with another error's line
    (``{error}``), which is named already. `summary`: what the command did before it failed (the checkpoint `train`
    saved), printed with --json."""

    def __init__(self, template: str, summary: Optional[dict] = None, **values: Any) -> None:
        super().__init__(template, **values)
        self.summary = summary


def error_line(err: BaseException, args: argparse.Namespace) -> str:
    """`err` as the one line the command prints, in its terms (`CliWords`): a call refused (`CallError`) and the
    command's own refusals (`CliError`) are named after the command the user ran; anything else is its type and first
    paragraph, with the error a MindSpore data pipeline wraps, and what the command was doing when it happened
    (`during`)."""
    if isinstance(err, MessageError):
        text = first_paragraph(err.render(CliWords(args)))
        tool = f"ms-accum {args.command}" if getattr(args, "command", None) else "ms-accum"  # None: before a command
        named = isinstance(err, CallError) or (isinstance(err, CliError) and not err.template.startswith("{error}"))
        return f"For '{tool}', {text}" if named else text
    what = getattr(err, "ms_accum_during", None)
    return describe_exception(err) + (f" (while {what})" if what else "")


def smaller_batch(err, args: argparse.Namespace, name: str, world: int = 1) -> CliError:
    """A split that yields no batch (`ms_accum._validation.NoBatchError`): its line, and the flag of the argument
    `name` set to a batch size it holds."""
    most = f" of at most {err.samples * world}" if err.samples else " smaller"
    return CliError("{error} Pass a {flag:plain}{most}.", error=error_line(err, args), flag=Argument(name), most=most)


@contextlib.contextmanager
def during(what: str):
    """Marks an error that is not the tool's own with what the command was doing (`error_line` says it)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001  (only marked, and raised again)
        if not hasattr(err, "ms_accum_during"):
            with contextlib.suppress(AttributeError, TypeError):
                err.ms_accum_during = what
        raise


def warning_printer(args: argparse.Namespace):
    """`warnings.showwarning` for a command: a warning is one line in its terms, ``ms-accum train: warning: ...``."""
    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001  (warnings' signature)
        text = message.render(CliWords(args)) if isinstance(message, Message) else str(message)
        print(f"ms-accum {args.command}: warning: {first_paragraph(text)}", file=sys.stderr)
    return show

"""The command line's argument types and the arguments several commands share (public: a script's own argparse can
take `positive_int` and the others, as the tutorials do)."""
from __future__ import annotations

import argparse
import functools
import math
from typing import Any, Callable, Dict, Optional, Tuple

from .._choices import DEMO_FACTORIES, DEVICES
from .._validation import Argument, ArgumentValueError, CallError, MessageError, check_value_in
from ..deprecation import TABLE, removal, removed
from .errors import CliError, error_line

MODEL_NAMES = tuple(DEMO_FACTORIES)
OPTIMIZERS = ("momentum", "sgd", "adam")
# The model, micro-batch, K and structure when the command line does not say. `train` leaves them None until
# `apply_plan` has read its plan (--plan), which says them too.
DEFAULTS = {"model": "lenet5", "batch_size": 32, "accumulate_step": 4, "structure": "auto"}


class FlagError(MessageError, argparse.ArgumentTypeError):
    """What a flag's text must be, refused by its type (`positive_int` and the others): argparse says it after the
    flag (``argument --lr: must be ...``, in a script's own argparse), a `Parser` as the library's sentence."""


class Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` that keeps, as each argument is added, the flag an error names it by (`flags`, read
    by `errors.CliWords`), so a flag's name is written once, where it is added; and that says a flag's value refused (by
    its type or its choices), a required flag missing and a flag no parser knows as the command says any refusal
    (`errors.error_line`), still argparse's usage error.

    `flags` maps each option's destination, and each name the library gives what the option sets (``sets``:
    ``add_argument("--epochs", ..., sets=("epoch",))``), to the option's first long flag. A command's parser is a
    `Parser` too (`add_subparsers` makes its sub-parsers of the parser's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: Dict[str, str] = {}
        self.command: Optional[str] = None  # the command the last parse found, for a flag no parser knew
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, sets: Tuple[str, ...] = (), **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.option_strings and action.dest != argparse.SUPPRESS:
            flag = next((name for name in action.option_strings if name.startswith("--")), action.option_strings[0])
            for name in (action.dest, *sets):
                self.flags.setdefault(name, flag)  # a deprecated spelling, added later, keeps the flag
        if action.type is not None or action.choices is not None:
            action.type = functools.partial(self._value, action, action.type)
        return action

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        self.command = getattr(namespace, "command", None)  # the top parser refuses a flag no parser knew
        return namespace, extras

    def error(self, message: str):
        """argparse's own refusals of a command's flags (a required one missing, one no parser knows) said as the
        command says any refusal; either is still argparse's usage error (exit 2)."""
        for start, sep, refusal in _ARGPARSE_REFUSALS:
            if message.startswith(start):
                flag = message[len(start):].split(sep)[0]
                command = self.command or self.get_default("command")
                message = error_line(refusal(flag), argparse.Namespace(command=command, flags=self.flags))
                break
        super().error(message)

    def _value(self, action: argparse.Action, kind: Optional[Callable[[str], Any]], text: str) -> Any:
        """`text` as `kind` reads it (as it is if None), one of `action`'s choices if it has them. Refused, it is an
        `argparse.ArgumentError` of no argument: argparse prints it as it is, in the usage error (exit 2)."""
        try:
            value = text if kind is None else kind(text)
            if action.choices is not None:
                check_value_in(value, action.dest, action.choices)
            return value
        except FlagError as err:
            refusal: CallError = ArgumentValueError("{flag:subject} {rule}.", flag=Argument(action.dest), rule=err)
        except CallError as err:
            refusal = err
        words = argparse.Namespace(command=self.get_default("command"), flags=self.flags)
        raise argparse.ArgumentError(None, error_line(refusal, words))


# argparse's messages (the same from Python 3.9 to 3.13), each with its refusal and what separates the flags it lists.
_ARGPARSE_REFUSALS = (
    ("the following arguments are required: ", ", ",
     lambda flag: ArgumentValueError("{flag:subject} must be given.", flag=Argument(flag))),
    ("unrecognized arguments: ", " ",
     lambda flag: ArgumentValueError("{flag:subject} is not one it takes (see --help).", flag=Argument(flag))))


def _number(kind, positive: bool, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise FlagError("must be {what}, but got {text!r}", what=what, text=text) from None
        if (kind is float and not math.isfinite(value)) or value < 0 or (positive and value == 0):
            raise FlagError("must be {what}, but got {text}", what=what, text=text)
        return value
    return parse


positive_int = _number(int, True, "a positive int")
non_negative_int = _number(int, False, "a non-negative int")
positive_float = _number(float, True, "a positive float")
non_negative_float = _number(float, False, "a non-negative float")


def model_or_factory(text: str) -> str:
    """A built-in model's name, or a factory's ``package.module:function`` (`ms_accum.tools.factory`)."""
    if text in MODEL_NAMES or ":" in text:
        return text
    raise FlagError("must be one of {names} or package.module:function (a factory returning network, loss, optimizer "
                    "and sample), but got {text!r}", names=", ".join(MODEL_NAMES), text=text)


class _OldSpelling(argparse.Action):
    """An option that also answers to its deprecated spelling (`ms_accum.deprecation`): `main` warns of each used."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.old_spellings = getattr(namespace, "old_spellings", []) + [option_string]


class _Removed(argparse.Action):
    """A flag the deprecation table lists as removed: given, it is argparse's error for that argument (exit 2), with
    the table's line (`ms_accum.deprecation.removal`)."""

    def __init__(self, option_strings, dest, key: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.key = key

    def __call__(self, parser, namespace, values, option_string=None):
        raise argparse.ArgumentError(self, removal(self.key))


def add_removed_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """A refusal (`_Removed`) for each flag of `command` that the deprecation table lists as removed
    (``ms-accum <command> --flag``): argparse would only say the flag is not recognized."""
    for key in TABLE:
        words = key.split()
        if len(words) == 3 and words[:2] == ["ms-accum", command] and removed(key):
            parser.add_argument(words[2], action=_Removed, dest=argparse.SUPPRESS, key=key)


def accumulate_schedule(text: str) -> dict:
    """``samples:K,...`` as a dict (`ms_accum.train.schedule.parse_schedule`)."""
    from ..train.schedule import parse_schedule
    return parse_schedule(text, "accumulate_schedule")


def k_bounds(text: str) -> tuple:
    """``MIN:MAX``, the bounds of an adaptive K (`ms_accum.AdaptiveK`), as two ints."""
    low, colon, high = text.partition(":")
    if not (colon and low.strip().isdigit() and high.strip().isdigit()) or int(low) < 1:
        raise FlagError("must be MIN:MAX, two positive ints such as 2:16, but got {text!r}", text=text)
    if int(high) < int(low):
        raise FlagError("must be MIN:MAX with MIN <= MAX, but got {text!r}", text=text)
    return int(low), int(high)


def memory_size(text: str) -> int:
    """Bytes of a size such as 800MiB or 2GiB (`ms_accum.tools.planner.parse_size`)."""
    from ..tools.planner import parse_size
    return parse_size(text, "memory")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", metavar="DIR", help="MNIST directory (default: $MS_ACCUM_MNIST, else "
                                                      "./datasets/MNIST_Data)")
    parser.add_argument("--device", choices=DEVICES, default="CPU")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def add_training_arguments(parser: argparse.ArgumentParser, batch_help: str, planned: bool = False) -> None:
    """What `train` and `verify` share: the model (a built-in one or your own), K, B, the optimizer and the seed.
    `planned` (`train`): the model, K and B stay None unless given, for `apply_plan` to fill in."""
    default = dict.fromkeys(DEFAULTS) if planned else DEFAULTS
    add_model_argument(parser, default["model"], DEFAULTS["model"])
    parser.add_argument("--accumulate-step", type=positive_int, default=default["accumulate_step"], metavar="K",
                        sets=("mini_steps",),
                        help=f"K, micro-batches per optimizer step (default {DEFAULTS['accumulate_step']})")
    parser.add_argument("--accumulate-steps", type=positive_int, dest="accumulate_step", action=_OldSpelling,
                        help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=positive_int, default=default["batch_size"], metavar="B",
                        help=f"{batch_help} (default {DEFAULTS['batch_size']})")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help="default: momentum for lenet5, sgd for mlp")
    parser.add_argument("--lr", type=positive_float, help="learning rate (default 0.01)")
    parser.add_argument("--momentum", type=non_negative_float, help="momentum (default 0.9 for lenet5, 0 for mlp)")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S", sets=("data_seed",))


def add_model_argument(parser: argparse.ArgumentParser, default: Optional[str], shown: str) -> None:
    """--model, `default` when not given, which its help calls `shown`."""
    parser.add_argument("--model", type=model_or_factory, default=default, metavar="{lenet5,mlp,MODULE:FUNCTION}",
                        help=f"a built-in model, or your factory returning (network, loss, optimizer, sample[, "
                             f"dataset]), whose optimizer and data are used as they are (docs/your-model.md; default "
                             f"{shown})")


def add_fallback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--download", action="store_true", help="download MNIST if it is not found")
    parser.add_argument("--synthetic-fallback", action="store_true",
                        help="if MNIST is neither found nor downloadable, generate a synthetic MNIST-format set")


def refuse_with_factory(args: argparse.Namespace, factory: bool, names) -> None:
    """A factory brings its own optimizer and data: the flags that would set them are refused, not ignored."""
    given = [name for name in names if getattr(args, name, None) not in (None, False)]
    if factory and given:
        raise CliError("{flag:plain} applies to the built-in models, but {@model:plain} is the factory '{model}', "
                       "whose optimizer and data are its own (change them in the factory).", flag=Argument(given[0]),
                       model=args.model)

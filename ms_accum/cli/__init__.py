"""`ms-accum`: train LeNet5, the MLP or your own model with gradient accumulation, evaluate checkpoints, verify that
accumulation equals the large batch, and plan the micro-batch and K for a global batch within a memory budget.

    ms-accum train --model lenet5 --accumulate-step 4 --batch-size 32 --epochs 3 --ckpt-dir ckpt
    ms-accum eval --ckpt ckpt/lenet5.ckpt [--json]
    ms-accum verify --model lenet5 --accumulate-step 4 --batch-size 32 [--json]
    ms-accum verify --model mypackage.models:build --accumulate-step 4 --batch-size 8   (your own model)
    ms-accum plan --model mypackage.models:build --global-batch 256 --memory 2GiB --output plan.json
    ms-accum train --plan plan.json   (the plan's model, B, K and structure)
    ms-accum env [--json]   (what a problem report needs: versions, CPU, compiler, kernel cache, device, ranks)
    ms-accum eval --ckpt ckpt/mypackage_models_build.ckpt   (on the factory's own evaluation data)
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True $(which ms-accum) train ...

Your model is a factory, ``package.module:function`` (`ms_accum.tools.factory`, docs/your-model.md).
Under msrun, `train` is data parallel by itself: each worker reads its shard with batch-size / workers samples
per micro-batch, the windows are all-reduced, and only rank 0 prints, plots, saves and evaluates.

An error ends with one line on stderr that names flags, files and commands (exit 2 for a bad command line, else 1):
after your code's frames when your code raised it, before a bug notice when ms_accum's did (docs/cli.md, `failure`).
MindSpore is imported only after the CPU kernel setting of `ms_accum.runtime` is applied.

The package holds a module per command (its arguments and its `run`), `arguments` (the argument types a script's own
argparse may use too: `positive_int`, `positive_float`, ...), `errors` (how a failure becomes one line) and `failure`
(what is printed around that line: whose error it was).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from typing import List, Optional

from .. import runtime  # noqa: F401  (imported with the package, before MindSpore: oneDNN's CPU ISA is capped)
from ..deprecation import message
from . import env, evaluate, plan, train, train_arguments, verify
from .arguments import Parser, add_removed_flags, non_negative_float, non_negative_int, positive_float, positive_int
from .errors import CliError, error_line, warning_printer
from .failure import VARIABLE, explain, wants_traceback

__all__ = ["main", "build_parser", "positive_int", "positive_float", "non_negative_int", "non_negative_float",
           "FLAGS", "CliError", "error_line"]


# What --help says of failures (docs/cli.md, "When something fails").
FAILURES = (f"When something fails: a bad command line, bad data or a bad checkpoint is one line on stderr (exit 2 or "
            f"1). An error in your own code (a factory, its data, a network's construct) shows your code's frames, "
            f"then that line. An error in ms_accum's own code says it is a bug and how to report it. --traceback, or "
            f"{VARIABLE}=1 in the environment, shows the whole stack of any error.")


def build_parser() -> argparse.ArgumentParser:
    """The command line: a sub-command per task, each with its own options, `--traceback` (before or after the
    command), and a refusal for each flag the deprecation table lists as removed."""
    parser = Parser(prog="ms-accum", description=__doc__.split("\n\n")[0], epilog=FAILURES)
    # Before the command too (`ms-accum --traceback train ...`), under a name of its own: a sub-command's default
    # would overwrite the value.
    parser.add_argument("--traceback", dest="traceback_first", action="store_true",
                        help="on an error, print the whole stack (as after the command)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (train_arguments, evaluate, verify, plan, env):
        command.add_parser(sub)
    for name, command in sub.choices.items():
        command.epilog = FAILURES
        command.add_argument("--traceback", action="store_true",
                             help=f"on an error, print the whole stack of every exception, ms_accum's and MindSpore's "
                                  f"frames included (as {VARIABLE}=1 does)")
        add_removed_flags(command, name)
        command.set_defaults(command=name, flags=command.flags)  # how its errors name it and its arguments
        parser.flags = {**command.flags, **parser.flags}  # every command's, the first's where they differ
    return parser


# Each argument a command sets, by its destination and the library's names for it, and its flag, as the parser adds
# them (`arguments.Parser`); where commands differ, the first's (eval names batch_size --eval-batch-size).
FLAGS = build_parser().flags


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `ms-accum` console script; returns the exit status. Whatever fails, the command ends with
    one line on stderr (`error_line`), after the user's frames when their code raised it, before a bug notice when
    ms_accum's own code did; `--traceback` prints the whole stack instead of the user's frames (`failure.explain`)."""
    args = build_parser().parse_args(argv)
    # MindSpore's log: critical only, so an error stays one line (a graph that fails to compile also logs it as an
    # ERROR, with its C++ stack); set GLOG_v to see more.
    os.environ.setdefault("GLOG_v", "4")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = warning_printer(args)
            for spelling in getattr(args, "old_spellings", ()):  # said to the user: Python hides DeprecationWarning
                print(f"ms-accum {args.command}: warning: {message(f'ms-accum {args.command} {spelling}')}",
                      file=sys.stderr)
            commands = {"train": train, "eval": evaluate, "verify": verify, "plan": plan, "env": env}
            summary = commands[args.command].run(args)
    except KeyboardInterrupt:
        if wants_traceback(args):  # where it was stopped: a run that hangs is found this way
            traceback.print_exc()
        print(f"ms-accum {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (every failure ends in its one line)
        done = getattr(err, "summary", None)
        if args.json and done is not None:  # what the command did before it failed: the checkpoint `train` saved
            print(json.dumps(done))
        print(explain(err, args), file=sys.stderr)
        return 1
    if args.json and summary is not None:
        print(json.dumps(summary))
    return 1 if summary is not None and summary.get("passed") is False else 0

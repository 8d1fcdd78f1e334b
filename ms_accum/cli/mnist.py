"""MNIST for the built-in models: found, downloaded or generated (`find_data`), and their optimizer settings."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from .errors import CliError, CliWords

SYNTHETIC_NOTE = "SYNTHETIC data, not MNIST"
# (train, test) images of the offline fallback: enough that `make run` (LeNet5, 1 epoch of K=4 x 32) learns them
# far above chance, so a newcomer without MNIST still sees training work (docs/cli.md).
FALLBACK_SIZES = (30000, 2000)


def find_data(args: argparse.Namespace, rank: Optional[int] = None) -> tuple:
    """(directory, synthetic) following --data, $MS_ACCUM_MNIST, ./datasets/MNIST_Data, download, fallback.

    `rank` is the data-parallel rank, if any: each worker then generates a fallback set of its own (the same
    files), because one worker replacing a shared directory would pull it from under another one reading it."""
    from ..demo.data import DataError, check_mnist_dir, download_mnist, is_synthetic, make_synthetic_mnist, \
        resolve_data_dir
    if args.data:  # asked for explicitly: no fallback, the user must hear what is wrong ("" is unset: resolve_data_dir)
        return check_mnist_dir(args.data), is_synthetic(args.data)
    path = resolve_data_dir(None)
    try:
        return check_mnist_dir(path), is_synthetic(path)
    except DataError as err:
        reason = err
    if args.download:
        try:
            return download_mnist(os.path.dirname(os.path.abspath(path))), False
        except DataError as err:
            reason = err
    if not args.synthetic_fallback:
        raise CliError("{reason} Pass {@data:plain} DIR, set MS_ACCUM_MNIST, add {@download:plain}, or add "
                       "{@synthetic_fallback:plain} to train on generated data.", reason=reason)
    root = os.path.join(os.path.dirname(os.path.abspath(path)), "synthetic")
    if rank is not None:
        root = os.path.join(root, f"rank{rank}")
    if not rank:  # no launcher, or rank 0: one notice per job
        said = reason.render(CliWords(args)).rstrip(".")
        print(f"ms-accum: MNIST is not available ({said}). Falling back to {SYNTHETIC_NOTE}, generated in {root}: its "
              f"accuracy says nothing about MNIST.", file=sys.stderr, flush=True)
    return make_synthetic_mnist(root, *FALLBACK_SIZES), True


def optimizer_settings(args: argparse.Namespace) -> dict:
    """The model's documented optimizer settings, overridden by the command line's."""
    from ..demo.models import OPTIMIZER_DEFAULTS
    return {**OPTIMIZER_DEFAULTS[args.model], **{k: getattr(args, k) for k in ("optimizer", "lr", "momentum")
                                                if getattr(args, k) is not None}}


def accuracy_line(evaluation, synthetic: bool) -> str:
    return str(evaluation) + (f" [{SYNTHETIC_NOTE}]" if synthetic else "")

"""`ms-accum`: train LeNet5, the MLP or your own model with gradient accumulation, evaluate checkpoints, verify that
accumulation equals the large batch, and plan the micro-batch and K for a global batch within a memory budget.

    ms-accum train --model lenet5 --accumulate-steps 4 --batch-size 32 --epochs 3 --ckpt-dir ckpt
    ms-accum eval --ckpt ckpt/lenet5.ckpt [--json]
    ms-accum verify --model lenet5 --accumulate-steps 4 --batch-size 32 [--json]
    ms-accum verify --model mypackage.models:build --accumulate-steps 4 --batch-size 8   (your own model)
    ms-accum plan --model mypackage.models:build --global-batch 256 --memory 2GiB --output plan.json
    ms-accum train --plan plan.json   (the plan's model, B, K and structure)
    ms-accum eval --ckpt ckpt/mypackage_models_build.ckpt   (on the factory's own evaluation data)
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True $(which ms-accum) train ...

Your model is a factory, ``package.module:function`` (`ms_accum.tools.factory`, docs/your-model.md).
Under msrun, `train` is data parallel by itself: each worker reads its shard with batch-size / workers samples
per micro-batch, the windows are all-reduced, and only rank 0 prints, plots, saves and evaluates.

Errors are one line on stderr (exit 2 for a bad command line, 1 for anything else: bad data, checkpoints, a factory,
or a failure while training), never a traceback, and they name flags, files and commands, not the library's classes.
MindSpore is imported only after the CPU kernel setting of `ms_accum.runtime` is applied.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

from ._choices import CHECKPOINT_FORMATS, DEMO_FACTORIES, DEVICES, OUTLIER_WARMUP, PARTIAL_WINDOWS, POLICIES, STRUCTURES
from . import runtime  # imported with the package, before MindSpore: oneDNN's CPU ISA is capped
from ._validation import ArgumentError, NoBatchError, describe_exception, door, first_paragraph

MODEL_NAMES = tuple(DEMO_FACTORIES)
OPTIMIZERS = ("momentum", "sgd", "adam")
SYNTHETIC_NOTE = "SYNTHETIC data, not MNIST"
# (train, test) images of the offline fallback: enough that `make run` (LeNet5, 1 epoch of K=4 x 32) learns them
# far above chance, so a newcomer without MNIST still sees training work (docs/cli.md).
FALLBACK_SIZES = (30000, 2000)


# The model, micro-batch, K and structure when the command line does not say. `train` leaves them None until
# `_apply_plan` has read its plan (--plan), which says them too.
DEFAULTS = {"model": "lenet5", "batch_size": 32, "accumulate_steps": 4, "structure": "auto"}


class CliError(Exception):
    """A failure the user can fix; printed as one line. `summary`: what the command did before it failed (the
    checkpoint `train` saved), printed with --json."""

    def __init__(self, message: str, summary: Optional[dict] = None) -> None:
        super().__init__(message)
        self.summary = summary


def _number(kind, positive: bool, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, but got '{text}'") from None
        if (kind is float and not math.isfinite(value)) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"must be {what}, but got {text}")
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
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(MODEL_NAMES)} or package.module:function (a "
                                     f"factory returning network, loss, optimizer and sample), but got '{text}'")


def build_parser() -> argparse.ArgumentParser:
    """The command line: a sub-command per task, each with its own options."""
    parser = argparse.ArgumentParser(prog="ms-accum", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    _add_eval_parser(sub)
    _add_verify_parser(sub)
    _add_plan_parser(sub)
    return parser


def _add_train_parser(sub) -> None:
    train = sub.add_parser("train", help="train with gradient accumulation, save a checkpoint, evaluate it")
    _add_training_arguments(train, "micro-batch size; each update sees K*B samples", planned=True)
    train.add_argument("--epochs", type=positive_int, default=1, metavar="E")
    train.add_argument("--structure", choices=STRUCTURES,
                       help=f"how micro-batches run (default {DEFAULTS['structure']}: three_graphs, the least memory; "
                            f"window and fused are faster and keep more activations alive)")
    _add_window_arguments(train)
    train.add_argument("--num-samples", type=positive_int, metavar="N", help="train on the first N images only")
    _add_data_arguments(train)
    _add_fallback_arguments(train)
    _add_checkpoint_arguments(train)
    train.add_argument("--accumulate-schedule", type=accumulate_schedule, metavar="SAMPLES:K,...",
                       help="K as a schedule of the global samples consumed, e.g. 0:2,4096:4,16384:8 (a batch "
                            "ramp-up; instead of --accumulate-steps)")
    train.add_argument("--plan", metavar="FILE",
                       help="take --batch-size, --accumulate-steps and --structure from a plan that 'ms-accum plan "
                            "--output FILE' wrote for this model")
    train.add_argument("--distributed", action="store_true",
                       help="require data parallelism over msrun's workers (automatic under msrun); --batch-size "
                            "is then the global micro-batch, split evenly over the workers")


def _add_window_arguments(train: argparse.ArgumentParser) -> None:
    """How each window becomes an update: clipping, statistics and outliers, non-finite windows, loss scaling,
    recomputation, an epoch's last window."""
    train.add_argument("--clip-norm", type=positive_float, help="clip each window's gradient to this global norm")
    train.add_argument("--statistics", action="store_true",
                       help="measure each window's and each micro-batch's gradient norm, listed in --json (a few "
                            "percent of a small network's step; implied by --noise-scale and --skip-outliers)")
    train.add_argument("--noise-scale", action="store_true",
                       help="estimate the gradient noise scale (the critical batch size) from the micro-batches' and "
                            "the windows' gradient norms; shown per step, in --json and in the loss plot")
    train.add_argument("--skip-outliers", type=positive_float, metavar="Z",
                       help="leave out of its window a micro-batch whose loss or gradient norm lies beyond Z standard "
                            "deviations of the recent ones (a loss spike); reported with its epoch and batch")
    train.add_argument("--outlier-warmup", type=non_negative_int, default=OUTLIER_WARMUP, metavar="N",
                       help=f"micro-batches seen before any is judged an outlier (default {OUTLIER_WARMUP}, "
                            "at least 8)")
    train.add_argument("--policy", choices=POLICIES, default="skip_window",
                       help="a non-finite loss or gradient skips its window (default) or only its micro-batch")
    train.add_argument("--stop-on-nonfinite", action="store_true", help="stop at the first non-finite window")
    train.add_argument("--loss-scale", choices=("none", "static", "dynamic"), default="none",
                       help="MindSpore loss scaling, checked and updated once per window (default none)")
    train.add_argument("--loss-scale-value", type=positive_float, default=2.0 ** 16, metavar="S",
                       help="the (initial) loss scale (default 65536)")
    train.add_argument("--recompute", nargs="+", metavar="CELL", help="sub-cells to recompute in the backward "
                                                                      "pass, e.g. conv1 conv2 (saves memory)")
    train.add_argument("--shard-optimizer", action="store_true",
                       help="under msrun, each worker keeps and steps the optimizer state of its own part of the "
                            "parameters (less memory per worker, the same updates; docs/data-parallel.md)")
    train.add_argument("--partial-window", choices=PARTIAL_WINDOWS, default="apply",
                       help="what to do with an epoch's last, incomplete window (default apply)")


def _add_checkpoint_arguments(train: argparse.ArgumentParser) -> None:
    """Where `train` saves, how often, what it resumes from, and whether it evaluates the result."""
    train.add_argument("--ckpt-dir", default="ckpt", metavar="DIR", help="where the checkpoint goes (default ckpt)")
    train.add_argument("--save-every", type=positive_int, metavar="N",
                       help="save the whole training state every N optimizer steps, to resume from")
    train.add_argument("--keep-last", type=positive_int, metavar="N", help="keep only the newest N training states")
    train.add_argument("--ckpt-format", choices=CHECKPOINT_FORMATS, default="ckpt",
                       help="the checkpoints' format: MindSpore's ckpt (default) or safetensors (MindFormers 2, "
                            "Hugging Face tools); --resume and eval read either")
    train.add_argument("--resume", nargs="?", const=True, metavar="FILE",
                       help="continue from FILE, or from the newest training state in --ckpt-dir (a fresh start if "
                            "there is none); the end result equals the uninterrupted run's")
    train.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation after training")
    train.add_argument("--eval-batch-size", type=positive_int, metavar="B",
                       help="the evaluation's batch size (default: the training micro-batch, --batch-size over the "
                            "workers)")
    train.add_argument("--eval-every", type=positive_int, metavar="N",
                       help="score the held-out data (MNIST's test set, a factory's 'eval' split) every N optimizer "
                            "steps and after the last: in the output, --json and the loss plot")
    train.add_argument("--keep-best", choices=("loss", "accuracy"),
                       help="with --eval-every: keep the best-scoring network as <ckpt-dir>/<model>-best.ckpt (or "
                            ".safetensors)")
    train.add_argument("--tensorboard", metavar="DIR",
                       help="write each step's loss, learning rate, K, gradient norm, noise scale and validation "
                            "for TensorBoard into DIR (needs pip install 'ms_accum[tensorboard]')")


def _add_eval_parser(sub) -> None:
    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the MNIST test set, or a factory's evaluation "
                                           "data (strict loading)")
    evaluate.add_argument("--ckpt", required=True, metavar="FILE")
    _add_model_argument(evaluate, None, "the model recorded in the checkpoint")
    evaluate.add_argument("--eval-batch-size", "--batch-size", type=positive_int, dest="eval_batch_size", metavar="B",
                          help="the evaluation's batch size (default: the micro-batch the checkpoint was trained with, "
                               "else 256)")
    evaluate.add_argument("--num-samples", type=positive_int, metavar="N", help="evaluate the first N test images")
    _add_data_arguments(evaluate)


def _add_verify_parser(sub) -> None:
    verify = sub.add_parser("verify", help="check that K accumulated micro-batches give the update of one K*B "
                                           "batch, parameter by parameter (exit 1 if not)")
    _add_training_arguments(verify, "micro-batch size; the large batch is the first K*B training images, or K*B "
                                    "samples from a factory's sample()")
    verify.add_argument("--rtol", type=positive_float, default=1e-5, help="relative tolerance (default 1e-5)")
    verify.add_argument("--atol", type=positive_float, default=1e-6, help="absolute tolerance (default 1e-6)")
    _add_data_arguments(verify)
    _add_fallback_arguments(verify)


def _add_plan_parser(sub) -> None:
    planner = sub.add_parser("plan", help="choose the micro-batch, K and structure for a global batch within a "
                                          "memory budget, from peak memory measured in fresh processes")
    _add_model_argument(planner, DEFAULTS["model"], DEFAULTS["model"])
    planner.add_argument("--global-batch", type=positive_int, required=True, metavar="N",
                         help="samples per optimizer step, over all ranks")
    planner.add_argument("--memory", type=memory_size, metavar="SIZE",
                         help="the budget per rank, e.g. 800MiB or 2GiB (default: the device's free memory)")
    planner.add_argument("--ranks", type=positive_int, default=1, metavar="R",
                         help="data-parallel ranks sharing the global batch (default 1)")
    planner.add_argument("--output", metavar="FILE", help="write the plan as JSON, for 'ms-accum train --plan FILE'")
    planner.add_argument("--device", choices=DEVICES, default="CPU")
    planner.add_argument("--json", action="store_true", help="print the plan as one JSON line")
    planner.add_argument("--quiet", action="store_true", help="no line per trial")


def accumulate_schedule(text: str) -> dict:
    """``samples:K,...`` as a dict (`ms_accum.train.schedule.parse_schedule`)."""
    from .train.schedule import parse_schedule
    try:
        with door("ms-accum train"):
            return parse_schedule(text, "--accumulate-schedule")
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def memory_size(text: str) -> int:
    """Bytes of a size such as 800MiB or 2GiB (`ms_accum.tools.planner.parse_size`)."""
    from .tools.planner import parse_size
    try:
        with door("ms-accum plan"):
            return parse_size(text, "--memory")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", metavar="DIR", help="MNIST directory (default: $MS_ACCUM_MNIST, else "
                                                      "./datasets/MNIST_Data)")
    parser.add_argument("--device", choices=DEVICES, default="CPU")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_training_arguments(parser: argparse.ArgumentParser, batch_help: str, planned: bool = False) -> None:
    """What `train` and `verify` share: the model (a built-in one or your own), K, B, the optimizer and the seed.
    `planned` (`train`): the model, K and B stay None unless given, for `_apply_plan` to fill in."""
    default = dict.fromkeys(DEFAULTS) if planned else DEFAULTS
    _add_model_argument(parser, default["model"], DEFAULTS["model"])
    parser.add_argument("--accumulate-steps", type=positive_int, default=default["accumulate_steps"], metavar="K",
                        help=f"micro-batches per optimizer step (default {DEFAULTS['accumulate_steps']})")
    parser.add_argument("--batch-size", type=positive_int, default=default["batch_size"], metavar="B",
                        help=f"{batch_help} (default {DEFAULTS['batch_size']})")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help="default: momentum for lenet5, sgd for mlp")
    parser.add_argument("--lr", type=positive_float, help="learning rate (default 0.01)")
    parser.add_argument("--momentum", type=non_negative_float, help="momentum (default 0.9 for lenet5, 0 for mlp)")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S")


def _add_model_argument(parser: argparse.ArgumentParser, default: Optional[str], shown: str) -> None:
    """--model, `default` when not given, which its help calls `shown`."""
    parser.add_argument("--model", type=model_or_factory, default=default, metavar="{lenet5,mlp,MODULE:FUNCTION}",
                        help=f"a built-in model, or your factory returning (network, loss, optimizer, sample[, "
                             f"dataset]), whose optimizer and data are used as they are (docs/your-model.md; default "
                             f"{shown})")


def _add_fallback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--download", action="store_true", help="download MNIST if it is not found")
    parser.add_argument("--synthetic-fallback", action="store_true",
                        help="if MNIST is neither found nor downloadable, generate a synthetic MNIST-format set")


def find_data(args: argparse.Namespace, rank: Optional[int] = None) -> tuple:
    """(directory, synthetic) following --data, $MS_ACCUM_MNIST, ./datasets/MNIST_Data, download, fallback.

    `rank` is the data-parallel rank, if any: each worker then generates a fallback set of its own (the same
    files), because one worker replacing a shared directory would pull it from under another one reading it.
    """
    from .demo.data import DataError, check_mnist_dir, download_mnist, is_synthetic, make_synthetic_mnist, \
        resolve_data_dir
    if args.data is not None:  # asked for explicitly: no fallback, the user must hear what is wrong
        return check_mnist_dir(args.data), is_synthetic(args.data)
    path = resolve_data_dir(None)
    try:
        return check_mnist_dir(path), is_synthetic(path)
    except DataError as err:
        reason = str(err)
    if args.download:
        try:
            return download_mnist(os.path.dirname(os.path.abspath(path))), False
        except DataError as err:
            reason = str(err)
    if not args.synthetic_fallback:
        raise CliError(f"{reason} Pass --data DIR, set MS_ACCUM_MNIST, add --download, or add "
                       f"--synthetic-fallback to train on generated data.")
    root = os.path.join(os.path.dirname(os.path.abspath(path)), "synthetic")
    if rank is not None:
        root = os.path.join(root, f"rank{rank}")
    if not rank:  # no launcher, or rank 0: one notice per job
        print(f"ms-accum: MNIST is not available ({reason.rstrip('.')}). Falling back to {SYNTHETIC_NOTE}, "
              f"generated in {root}: its accuracy says nothing about MNIST.", file=sys.stderr, flush=True)
    return make_synthetic_mnist(root, *FALLBACK_SIZES), True


def _progress(total: int, desc: str, quiet: bool):
    from tqdm import tqdm
    # disable=None: no bar when stderr is not a terminal (CI logs, pipes), where every refresh is a new line.
    return tqdm(total=total, desc=desc, unit="step", disable=True if quiet else None, leave=False,
                dynamic_ncols=True)


def save_loss_plot(losses: List[float], path: str, title: str, ks: Optional[List[int]] = None,
                   noise: Optional[List[Optional[float]]] = None,
                   validation: Optional[List[Tuple[int, float]]] = None) -> str:
    """Writes the per-step loss curve as a PNG; with `ks`, each step's K, a dashed line marks where K changed; with
    `noise`, each step's noise scale estimate is drawn on a second axis; `validation`'s (step, loss) are dots."""
    import matplotlib
    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, linewidth=1, label="window loss")
    if validation:
        ax.plot(*zip(*validation), "o-", color="tab:green", markersize=3, linewidth=1, label="validation loss")
        ax.legend(fontsize=8)
    for step in range(1, len(ks or [])):
        if ks[step] != ks[step - 1]:
            ax.axvline(step + 1, color="gray", linestyle="--", linewidth=0.8)
            ax.annotate(f"K={ks[step]}", (step + 1, 1), xycoords=("data", "axes fraction"), fontsize=8,
                        xytext=(2, -10), textcoords="offset points")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("window loss")
    if noise is not None:
        steps = [step for step, value in enumerate(noise, 1) if value is not None and value > 0]
        right = ax.twinx()
        right.plot(steps, [noise[step - 1] for step in steps], color="tab:orange", linewidth=1)
        right.set_ylabel("gradient noise scale (samples)", color="tab:orange")
        right.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _launcher_world_size(args: argparse.Namespace) -> Optional[int]:
    """msrun's worker count, or None without a launcher; checked against the arguments before anything starts.

    Every check here gives the same answer in every process msrun started, the scheduler included, so a bad
    command line stops them all (a scheduler that stops alone leaves the workers waiting for it).
    """
    from .train.distributed import distributed_launch
    world = distributed_launch()
    if world is None:
        if args.distributed:
            raise CliError("distributed mode requested without a launcher: start it with msrun, e.g. 'msrun "
                           "--worker_num=2 --local_worker_num=2 --master_port=8118 --join=True "
                           "$(which ms-accum) train ...' (MS_ROLE and MS_WORKER_NUM are not set).")
        return None
    if args.batch_size % world:
        raise CliError(f"For 'ms-accum train', the argument '--batch-size' (the global micro-batch) must be "
                       f"divisible by the world size {world}, but got {args.batch_size}.")
    return world


@dataclass
class _Job:
    """What `train` trains: the network, loss, optimizer and dataset, where the data came from, and how the result is
    evaluated."""

    network: object
    loss_fn: object
    optimizer: object
    dataset: object
    ckpt_name: str
    source: str  # the data, as the summary names it
    synthetic: bool
    settings: dict  # recorded in the checkpoint: the optimizer and where the data is
    reads: str = ""  # what this rank reads, as an error names it
    held_out: object = None  # batch size -> this rank's shard of the held-out data, for --eval-every


def _demo_job(args: argparse.Namespace, parallel, world: int) -> _Job:
    """LeNet5 or the MLP on MNIST (found, downloaded or generated), with the optimizer of the command line."""
    from mindspore import nn
    from .demo.data import dataset_for
    from .demo.evaluation import recorded_data_dir
    from .demo.models import build_model, make_optimizer
    data_dir, synthetic = find_data(args, None if parallel is None else parallel.rank)
    settings = _optimizer_settings(args)
    network = build_model(args.model)
    shards, num_samples = {}, args.num_samples
    if parallel is not None:
        # Same seed on every rank: one shuffle of the whole set, cut into disjoint shards. num_samples counts
        # per shard in MindSpore's DistributedSampler (measured), so each worker takes its share, rounded up.
        shards = {"num_shards": world, "shard_id": parallel.rank}
        num_samples = None if num_samples is None else -(-num_samples // world)
    try:
        with door("ms-accum train"):
            dataset = dataset_for(args.model, data_dir, args.batch_size // world, usage="train", shuffle=True,
                                  seed=args.seed, num_samples=num_samples, **shards)
    except NoBatchError as err:
        given = f" of --num-samples {args.num_samples}" if args.num_samples else ""
        per = f" per worker ({world})" if world > 1 else ""
        raise CliError(f"For 'ms-accum train', the {err.samples} training image(s){given}{per} in "
                       f"{os.path.abspath(data_dir)} hold no micro-batch of {args.batch_size // world}: pass a "
                       f"--batch-size of at most {err.samples * world}.") from err
    return _Job(network=network, loss_fn=nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                optimizer=make_optimizer(settings, network.trainable_params()), dataset=dataset, ckpt_name=args.model,
                source=os.path.abspath(data_dir), synthetic=synthetic,
                reads=f"the MNIST training images in {os.path.abspath(data_dir)}",
                settings={**settings, "data_dir": recorded_data_dir(data_dir, args.ckpt_dir), "synthetic": synthetic},
                held_out=lambda size: dataset_for(args.model, data_dir, size, usage="test", **shards))


def _factory_job(args: argparse.Namespace, parallel, world: int) -> _Job:
    """Your factory's network, loss and optimizer (as it built them) on its own training data, this rank's shard."""
    from .tools.factory import load_model
    call = (args.batch_size // world, "train", 0 if parallel is None else parallel.rank, world)
    try:
        with door("ms-accum train"):
            user = load_model(args.model)
            dataset = user.data(*call)
    except NoBatchError as err:
        raise CliError(_smaller_batch(err, args, "--batch-size", world)) from err
    return _Job(network=user.network, loss_fn=user.loss_fn, optimizer=user.optimizer, dataset=dataset,
                ckpt_name=re.sub(r"\W", "_", args.model), source=f"the data of {args.model}", synthetic=False,
                settings={"optimizer": type(user.optimizer).__name__},
                reads=f"dataset{call} of the factory '{args.model}'",
                held_out=lambda size: user.data(size, "eval", call[2], world))


def run_train(args: argparse.Namespace) -> Optional[dict]:
    """Trains, saves, plots and evaluates; returns the summary, or None on a data-parallel rank other than 0."""
    from .tools.factory import is_factory
    planned = _apply_plan(args)
    if args.keep_best and args.eval_every is None:
        raise CliError(f"--keep-best {args.keep_best} keeps the best of the scores --eval-every N asks for: give both.")
    factory = is_factory(args.model)
    _refuse_with_factory(args, factory, ("optimizer", "lr", "momentum", "data", "num_samples", "download",
                                         "synthetic_fallback"))
    parallel = _join_launcher(args)
    world = 1 if parallel is None else parallel.group_size
    main = parallel is None or parallel.is_main
    import mindspore as ms
    from .tools.planner import PeakMemory
    memory = PeakMemory()  # as the planner's trials count it, so a plan's prediction and a run compare
    ms.set_seed(args.seed)
    with _during(f"reading the data of {args.model}"):
        job = (_factory_job if factory else _demo_job)(args, parallel, world)
    validation = _validation(args, job, world)
    executor = _executor(args, job, planned, world)
    board = _tensorboard(args, job, main)
    checkpoints = _checkpoints(args, job, world, main)
    label = f"{args.model}, K={_k_text(args)} x B={args.batch_size}" + (
        f" ({SYNTHETIC_NOTE})" if job.synthetic else "") + ("" if parallel is None else f", {world} workers")
    with _during(f"training on {job.reads}"):
        result = _train(args, executor, job, checkpoints, validation, board, label, args.quiet or not main)
    if not main:
        return None
    summary = _summary(args, job, result, executor.statistics, world)
    summary.update(peak_memory_mib=memory.mib(),
                   predicted_peak_mib=None if planned is None else planned.predicted_peak_mib)
    summary["loss_plot"] = plot = os.path.join(checkpoints.directory, f"{job.ckpt_name}_loss.png")
    with _during(f"writing the loss curve {plot}"):
        save_loss_plot(result.losses, plot, label, summary["accumulate_step"], summary["noise_scale"],
                       [(i, record.validation["loss"]) for i, record in enumerate(result.steps, 1)
                        if record.validation is not None])
    if not args.json:
        _print_trained(label, summary, result, job.synthetic)
    if not args.no_eval:
        evaluation = _evaluate_trained(args, summary, factory, world)
        summary.update(evaluation.as_dict())
        if not args.json:
            print(_accuracy_line(evaluation, job.synthetic))
    return summary


def _summary(args: argparse.Namespace, job: _Job, result, statistics: bool, world: int) -> dict:
    """What `train` reports of its run (--json prints it)."""
    return {"model": args.model, "checkpoint": result.checkpoint, "synthetic": job.synthetic, "data": job.source,
            "optimizer_steps": len(result.steps), "world_size": world,
            "final_loss": result.losses[-1] if result.losses else None, "resumed_from": result.resumed_from,
            "skipped_windows": result.skipped_windows, "skipped_micro_batches": result.skipped_micro_batches,
            "accumulate_step": [record.accumulate_step for record in result.steps],
            "grad_norm": [record.grad_norm for record in result.steps] if statistics else None,
            "noise_scale": [record.noise_scale for record in result.steps] if args.noise_scale else None,
            "outliers": result.outliers,
            "samples_consumed": result.steps[-1].samples_consumed if result.steps else None,
            "validation": [{"step": record.step, **record.validation} for record in result.steps
                           if record.validation is not None], "best_checkpoint": result.best_checkpoint}


def _evaluate_trained(args: argparse.Namespace, summary: dict, factory: bool, world: int):
    """The checkpoint `train` saved, evaluated in batches of --eval-batch-size, else of the training micro-batch; a
    failure is one line that names the checkpoint saved, with the summary for --json."""
    from .demo.evaluation import evaluate_checkpoint
    checkpoint = summary["checkpoint"]
    try:
        with door("ms-accum train"):
            return evaluate_checkpoint(checkpoint, args.model, None if factory else args.data,
                                       args.eval_batch_size or args.batch_size // world, arg_name="--model")[0]
    except Exception as err:  # noqa: BLE001  (whatever failed, the training and its checkpoint stand)
        smaller = f" --eval-batch-size {err.samples}" if getattr(err, "samples", None) else ""
        raise CliError(f"{error_line(err, args)} Training finished and saved {checkpoint}: evaluate it with "
                       f"'ms-accum eval --ckpt {checkpoint}{smaller}'.", summary=summary) from err


def _smaller_batch(err, args: argparse.Namespace, flag: str, world: int = 1) -> str:
    """A split that yields no batch (`ms_accum._validation.NoBatchError`): its message, and the flag that asks for
    batches it holds."""
    most = f" of at most {err.samples * world}" if err.samples else " smaller"
    return f"{error_line(err, args)} Pass a {flag}{most}."


def _join_launcher(args: argparse.Namespace):
    """Checks msrun's launch against the arguments, sets the device, and joins msrun's data-parallel group; returns
    the group (`ms_accum.train.distributed.init_data_parallel`), or None without a launcher."""
    launched = _launcher_world_size(args) is not None
    runtime.set_device(args.device)
    if not launched:
        return None
    # First of all: msrun runs this script as the scheduler too, whose init() never returns; nothing may be written
    # before it.
    from .train.distributed import init_data_parallel
    return init_data_parallel()


def _k_text(args: argparse.Namespace):
    """K as the command line gave it: an int, or the schedule's ``samples:K,...``."""
    from .train.schedule import pairs_text
    return pairs_text(args.accumulate_schedule.items()) if args.accumulate_schedule else args.accumulate_steps


def _executor(args: argparse.Namespace, job: _Job, planned, world: int):
    """The executor over `job` with the command line's options, once the plan (if any) fits the network and ranks
    and the cells to recompute are marked."""
    from .train.executor import GradientAccumulation
    from .train.options import GuardOptions, StatisticsOptions, WindowOptions
    from .train.recompute import recompute_cells
    with door("ms-accum train"):  # refused in the command's terms: the user gave the plan and the cells here
        if planned is not None:
            planned.check_fits(job.network, world)
        if args.recompute:
            recompute_cells(job.network, args.recompute, arg_name="--recompute")
    return GradientAccumulation(job.network, job.loss_fn, job.optimizer, structure=args.structure,
                                window=WindowOptions(clip_norm=args.clip_norm),
                                guard=GuardOptions(policy=args.policy, loss_scaler=_loss_scaler(args),
                                                   stop_on_nonfinite=args.stop_on_nonfinite),
                                statistics=StatisticsOptions(norms=args.statistics, noise_scale=args.noise_scale,
                                                             skip_outliers=args.skip_outliers,
                                                             outlier_warmup=args.outlier_warmup),
                                shard_optimizer=args.shard_optimizer)


def _checkpoints(args: argparse.Namespace, job: _Job, world: int, main: bool):
    """Where and how often `train` saves, what it resumes from, and the settings its checkpoints record."""
    from ._validation import check_writable_dir
    from .train.options import Checkpoints
    # Created only now, once every argument was accepted: a refused run leaves no directory behind.
    with door("ms-accum train"):
        ckpt_dir = check_writable_dir(args.ckpt_dir, "--ckpt-dir") if main else args.ckpt_dir
    metadata = {"model": args.model, "accumulate_step": _k_text(args), "batch_size": args.batch_size,
                "seed": args.seed, "world_size": world, **job.settings}
    return Checkpoints(directory=ckpt_dir, name=job.ckpt_name, save_every=args.save_every, keep_last=args.keep_last,
                       metadata=metadata, resume=args.resume, format=args.ckpt_format)


def _train(args: argparse.Namespace, executor, job: _Job, checkpoints, validation: dict, board, label: str,
           quiet: bool):
    """`train_process` over the command line's epochs and K (and `validation`, `_validation`'s), behind a progress
    bar unless `quiet`, each step written for TensorBoard by `board` (`_tensorboard`'s); its result."""
    from .train.options import LogOptions
    from .train.windows import count_windows
    mini_steps = args.accumulate_schedule or args.accumulate_steps
    windows = count_windows(job.dataset.get_dataset_size(), args.epochs, mini_steps, args.batch_size,
                            args.partial_window)
    with _progress(windows, f"train {label}", quiet) as bar:
        def on_step(record):
            bar.update(record.step - bar.n)  # steps count from the start of training, a resumed run's included
            noise = {} if record.noise_scale is None else {"noise_scale": f"{record.noise_scale:.0f}"}
            bar.set_postfix(epoch=record.epoch, K=record.accumulate_step, loss=f"{record.loss:.4f}", **noise,
                            refresh=False)
            if board is not None:
                board(record)
        try:
            return executor.train_process(args.epochs, job.dataset, mini_steps, partial_window=args.partial_window,
                                          checkpoints=checkpoints, log=LogOptions(verbose=False, on_step=on_step),
                                          **validation)
        finally:
            if board is not None:
                board.close()


def _tensorboard(args: argparse.Namespace, job: _Job, main: bool):
    """--tensorboard's writer on rank 0 (`ms_accum.train.tensorboard.TensorBoardLog`), else None; its directory is
    refused before --ckpt-dir is made."""
    if args.tensorboard is None or not main:
        return None
    from .train.tensorboard import TensorBoardLog
    with door("ms-accum train"):
        return TensorBoardLog(args.tensorboard, job.optimizer)


def _validation(args: argparse.Namespace, job: _Job, world: int) -> dict:
    """`train_process`'s validation arguments for --eval-every: this rank's shard of the held-out data, in batches
    of --eval-batch-size (else the micro-batch) over the workers."""
    if args.eval_every is None:
        return {}
    from .train.validation import Validation
    size = (args.eval_batch_size or args.batch_size) // world
    try:
        with door("ms-accum train"):
            held_out = job.held_out(size)
    except NoBatchError as err:
        raise CliError(_smaller_batch(err, args, "--eval-batch-size", world)) from err
    return {"eval_dataset": held_out, "eval_every": Validation(every=args.eval_every, keep_best=args.keep_best)}


def _print_trained(label: str, summary: dict, result, synthetic: bool) -> None:
    """What `train` says when done, without --json."""
    tag = f" [{SYNTHETIC_NOTE}]" if synthetic else ""
    resumed = f" after resuming from {result.resumed_from}" if result.resumed_from else ""
    loss = "" if summary["final_loss"] is None else f", final window loss {summary['final_loss']:.6f}"
    skipped = f", {result.skipped_windows} non-finite window(s) skipped" if result.skipped_windows else ""
    if result.outliers:
        skipped += (f", {len(result.outliers)} outlier micro-batch(es) left out (epoch, batch): "
                    f"{', '.join(map(str, result.outliers))}")
    print(f"Trained {label} on {summary['data']}: {len(result.steps)} optimizer steps{resumed}{loss}{skipped}{tag}")
    print(f"Checkpoint: {result.checkpoint}\nLoss curve: {summary['loss_plot']}")
    for scored in summary["validation"]:
        print(f"Validation at step {scored['step']}: " + ", ".join(f"{name} {value:.4f}" for name, value in
                                                                  scored.items() if name != "step"))
    if summary["best_checkpoint"]:
        print(f"Best network: {summary['best_checkpoint']}")
    predicted = summary["predicted_peak_mib"]
    print(f"Peak memory: {summary['peak_memory_mib']:.0f} MiB" + (
        "" if predicted is None else f" (the plan predicted {predicted:.0f} MiB)"))


def _refuse_with_factory(args: argparse.Namespace, factory: bool, names) -> None:
    """A factory brings its own optimizer and data: the flags that would set them are refused, not ignored."""
    given = [name for name in names if getattr(args, name, None) not in (None, False)]
    if factory and given:
        flag = "--" + given[0].replace("_", "-")
        raise CliError(f"{flag} applies to the built-in models, but --model is the factory '{args.model}', whose "
                       f"optimizer and data are its own (change them in the factory).")


def _apply_plan(args: argparse.Namespace):
    """Fills the model, batch size, K and structure from --plan (refusing flags that contradict it), else from
    DEFAULTS; returns the plan, or None without one."""
    if args.accumulate_schedule is not None and (args.accumulate_steps is not None or args.plan is not None):
        raise CliError("--accumulate-schedule sets K: give it without --accumulate-steps or --plan.")
    if args.plan is None:
        for name, value in DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        return None
    from .train.plan import Plan
    plan = Plan.load(args.plan)
    planned = {"model": plan.model, "batch_size": plan.batch_size * plan.ranks,
               "accumulate_steps": plan.accumulate_step, "structure": plan.structure}
    for name, value in planned.items():
        given = getattr(args, name)
        if given is not None and given != value:
            raise CliError(f"--{name.replace('_', '-')} {given} contradicts the plan {args.plan}, which says {value}.")
        setattr(args, name, value)
    return plan


def _loss_scaler(args: argparse.Namespace):
    from mindspore import amp
    if args.loss_scale == "static":
        return amp.StaticLossScaler(args.loss_scale_value)
    if args.loss_scale == "dynamic":  # MindSpore's usual settings: halve on overflow, double after 1000 clean steps
        return amp.DynamicLossScaler(args.loss_scale_value, scale_factor=2, scale_window=1000)
    return None


def _optimizer_settings(args: argparse.Namespace) -> dict:
    """The model's documented optimizer settings, overridden by the command line's."""
    from .demo.models import OPTIMIZER_DEFAULTS
    return {**OPTIMIZER_DEFAULTS[args.model], **{k: getattr(args, k) for k in ("optimizer", "lr", "momentum")
                                                if getattr(args, k) is not None}}


def _accuracy_line(evaluation, synthetic: bool) -> str:
    return str(evaluation) + (f" [{SYNTHETIC_NOTE}]" if synthetic else "")


def run_eval(args: argparse.Namespace) -> dict:
    runtime.set_device(args.device)
    from .demo.data import is_synthetic
    from .demo.evaluation import checkpoint_data_dir, evaluate_checkpoint
    from .tools.factory import is_factory
    _refuse_with_factory(args, args.model is not None and is_factory(args.model), ("data", "num_samples"))
    try:
        with door("ms-accum eval"), _during(f"evaluating {args.ckpt}"):
            evaluation, metadata = evaluate_checkpoint(args.ckpt, args.model, args.data, args.eval_batch_size,
                                                       args.num_samples, arg_name="--model")
    except NoBatchError as err:
        raise CliError(_smaller_batch(err, args, "--eval-batch-size")) from err
    model = args.model or metadata["model"]
    synthetic = not is_factory(model) and is_synthetic(checkpoint_data_dir(metadata, args.data, args.ckpt))
    if not args.json:
        k = metadata.get("accumulate_step", metadata.get("accumulate_steps", "?"))  # 0.2's files: accumulate_steps
        print(f"{args.ckpt} ({model}, trained {metadata.get('step', '?')} optimizer steps with K={k})")
        print(_accuracy_line(evaluation, synthetic))
    return {"checkpoint": args.ckpt, "model": model, "synthetic": synthetic, **evaluation.as_dict()}


def run_verify(args: argparse.Namespace) -> dict:
    """One update from K accumulated micro-batches against one on their K*B concatenation, from the same start."""
    runtime.set_device(args.device)
    import mindspore as ms
    from .tools.factory import is_factory, load_model
    from .tools.verify import verify_equivalence
    factory = is_factory(args.model)
    _refuse_with_factory(args, factory, ("optimizer", "lr", "momentum", "data", "download", "synthetic_fallback"))
    ms.set_seed(args.seed)
    large = args.accumulate_steps * args.batch_size
    if factory:
        with door("ms-accum verify"), _during(f"reading sample({large}) of the factory '{args.model}'"):
            user = load_model(args.model)
            batch = user.batch(large)
        network, loss_fn, optimizer = user.network, user.loss_fn, user.optimizer
        optimizer_name, synthetic, source = type(optimizer).__name__, False, f"{large} samples of its sample()"
    else:
        network, loss_fn, optimizer, optimizer_name, synthetic, source, batch = _verify_on_mnist(args, large)
    with door("ms-accum verify"), _during(f"verifying {args.model}"):
        report = verify_equivalence(network, loss_fn, optimizer, batch, args.accumulate_steps, rtol=args.rtol,
                                    atol=args.atol)
    summary = {"model": args.model, "accumulate_step": args.accumulate_steps, "batch_size": args.batch_size,
               "optimizer": optimizer_name, "synthetic": synthetic, "passed": report.passed,
               "max_abs_diff": report.max_abs_diff, "max_rel_diff": report.max_rel_diff,
               "rtol": args.rtol, "atol": args.atol, "moved_between_updates": report.moved_between_updates,
               "per_parameter": {name: {"max_abs_diff": a, "max_rel_diff": r}
                                 for name, (a, r) in report.per_parameter.items()},
               "causes": [asdict(cause) for cause in report.causes], "inference_mode": report.inference_mode}
    if not args.json:
        print(f"{args.model}, {optimizer_name}, K={args.accumulate_steps} x B={args.batch_size} against one batch of "
              f"{large}, {source}")
        width = max(len(name) for name in report.per_parameter)
        print(f"  {'parameter':<{width}}  {'max abs diff':>12}  {'max rel diff':>12}")
        for name, (abs_diff, rel_diff) in report.per_parameter.items():
            print(f"  {name:<{width}}  {abs_diff:>12.3e}  {rel_diff:>12.3e}")
        print(report)
    return summary


def _verify_on_mnist(args: argparse.Namespace, large: int) -> tuple:
    """A built-in model with the command line's optimizer, and the first K*B training images (all of them, or the
    command is refused): (network, loss, optimizer, its name, synthetic, where the batch is from, the batch)."""
    from mindspore import nn
    from .demo.data import dataset_for
    from .demo.models import build_model, make_optimizer
    data_dir, synthetic = find_data(args)
    settings = _optimizer_settings(args)
    network = build_model(args.model)
    try:
        with door("ms-accum verify"), _during(f"reading the MNIST training images in {os.path.abspath(data_dir)}"):
            dataset = dataset_for(args.model, data_dir, large, usage="train", shuffle=False, num_samples=large,
                                  drop_remainder=True)
            batch = tuple(next(dataset.create_tuple_iterator(output_numpy=True)))
    except NoBatchError as err:
        raise CliError(f"For 'ms-accum verify', --accumulate-steps {args.accumulate_steps} x --batch-size "
                       f"{args.batch_size} needs {large} training images, but {os.path.abspath(data_dir)} holds "
                       f"{err.samples}.") from err
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer, optimizer_name = make_optimizer(settings, network.trainable_params()), settings["optimizer"]
    source = f"the first images of {os.path.abspath(data_dir)}" + (f" [{SYNTHETIC_NOTE}]" if synthetic else "")
    return network, loss_fn, optimizer, optimizer_name, synthetic, source, batch


def run_plan(args: argparse.Namespace) -> dict:
    """Plans in fresh processes, prints the plan and writes it with --output."""
    from .tools.planner import plan
    log = None if args.quiet or args.json else (lambda line: print(f"ms-accum plan: {line}", file=sys.stderr,
                                                                   flush=True))
    with door("ms-accum plan"), _during(f"planning {args.model}"):
        result = plan(args.model, args.global_batch, args.memory, ranks=args.ranks, device=args.device, log=log,
                      output=args.output)
    if not args.json:
        print(result)
        if args.output:
            print(f"Written to {args.output}: train with 'ms-accum train --plan {args.output}'.")
    return result.to_dict()


def error_line(err: BaseException, args: argparse.Namespace) -> str:
    """`err` as the one line the command prints, in its terms (`in_flags`): an argument refused is named after the
    command the user ran; the tool's own errors say what they say; anything else is its type and first paragraph,
    with the error a MindSpore data pipeline wraps, and what the command was doing when it happened (`_during`)."""
    from .train.checkpoint import CheckpointError, CheckpointWriteError
    from .train.records import NonFiniteError
    from .demo.data import DataError
    command = f"ms-accum {args.command}"
    if isinstance(err, CheckpointWriteError) and getattr(err, "newest", None):  # a state to resume from: --resume
        return (f"For '{command}', {err.unwritten} The newest complete training state is "
                f"'{os.path.basename(err.newest)}': the same command with --resume continues from it.")
    if isinstance(err, ArgumentError):
        return f"For '{command}', " + in_flags(first_paragraph(err.detail), args, arguments=True)
    if isinstance(err, (CliError, CheckpointError, DataError)):
        return in_flags(first_paragraph(str(err)), args)
    if isinstance(err, NonFiniteError) and err.window:
        return f"{err.window}; stopped, as --stop-on-nonfinite asks."
    during = getattr(err, "ms_accum_during", None)
    return describe_exception(err) + (f" (while {during})" if during else "")


# What the command line sets, by the library's names for it: the library's messages name its arguments (`'name'`,
# `name=value`, `mini_steps x batch_size`), which a command's error names by their flags (`in_flags`).
FLAGS = {"mini_steps": "--accumulate-steps", "accumulate_step": "--accumulate-steps", "batch_size": "--batch-size",
         "partial_window": "--partial-window", "data_seed": "--seed", "seed": "--seed", "save_every": "--save-every",
         "keep_last": "--keep-last", "resume": "--resume", "noise_scale": "--noise-scale", "epoch": "--epochs",
         "statistics": "--statistics", "skip_outliers": "--skip-outliers", "outlier_warmup": "--outlier-warmup",
         "stop_on_nonfinite": "--stop-on-nonfinite", "clip_norm": "--clip-norm", "policy": "--policy",
         "structure": "--structure", "recompute": "--recompute", "ckpt_dir": "--ckpt-dir", "model": "--model",
         "num_samples": "--num-samples", "global_batch": "--global-batch", "ranks": "--ranks", "memory": "--memory",
         "output": "--output", "rtol": "--rtol", "atol": "--atol", "logdir": "--tensorboard",
         "shard_optimizer": "--shard-optimizer"}
# What a factory returned, as the library's messages name it (its own arguments' names).
FACTORY_PARTS = {"network": "network", "loss_fn": "loss_fn", "optimizer": "optimizer", "train_dataset": "'train' data"}


def in_flags(text: str, args: argparse.Namespace, arguments: bool = False) -> str:
    """A library's message in the terms of the command line `args` ran: its arguments named by their flags (K and
    the micro-batch of a training state as --accumulate-steps and the global --batch-size), a factory's parts as the
    factory's, and no library entry point named. `arguments`: the message is about arguments (an `ArgumentError`), so
    every quoted name is one; elsewhere only names no file or model is called (``mini_steps``, not ``model``)."""
    flags = {**FLAGS, **({"batch_size": "--eval-batch-size"} if args.command == "eval" else {})}

    def layout(match):  # a training state's K x micro-batch x ranks: --batch-size is the global micro-batch
        k, batch, ranks = (int(group) for group in match.groups())
        workers = f" over {ranks} workers" if ranks > 1 else ""
        return f"--accumulate-steps {k} x --batch-size {batch * ranks}{workers}"

    text = re.sub(r"For '[A-Za-z_][\w.]*', ", "", text)  # a library entry point's name (the command's own stays)
    text = re.sub(r"mini_steps=(\d+) x batch_size=(\d+) x (\d+) rank\(s\)", layout, text)
    text = text.replace(" or Plan.save", "")
    model = getattr(args, "model", None) or ""
    if ":" in model:
        for name, part in FACTORY_PARTS.items():
            text = text.replace(f"the argument '{name}'", f"the {part} of the factory '{model}'")
    every = "|".join(sorted(flags, key=len, reverse=True))
    identifiers = "|".join(sorted((name for name in flags if "_" in name), key=len, reverse=True))
    text = re.sub(r"must be (None|False) with ", "must not be given with ", text)
    text = re.sub(rf"(?<![\w'/.:-])({every})=(?:'([^']*)'|([\w.]+))", lambda m: _flag_value(flags[m[1]], m[2], m[3]),
                  text)
    text = re.sub(rf"'({every if arguments else identifiers})'", lambda m: f"'{flags[m[1]]}'", text)
    # K by the executor's own name, said bare ("no mini_steps keeps it"); the others are quoted or given a value.
    return re.sub(r"(?<![\w'/.:(-])mini_steps(?![\w/])", flags["mini_steps"], text)


def _flag_value(flag: str, quoted: Optional[str], bare: Optional[str]) -> str:
    """``name=value`` of a message as the command line gives it: ``--flag value``, ``--flag`` (True), ``no --flag``."""
    if bare in ("True", "False", "None"):
        return flag if bare == "True" else f"no {flag}"
    return f"{flag} {bare if quoted is None else quoted}"


@contextlib.contextmanager
def _during(what: str):
    """Marks an error that is not the tool's own with what the command was doing (`error_line` says it)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001  (only marked, and raised again)
        if not hasattr(err, "ms_accum_during"):
            with contextlib.suppress(AttributeError, TypeError):
                err.ms_accum_during = what
        raise


def _warning_printer(args: argparse.Namespace):
    """`warnings.showwarning` for a command: a warning is one line in its terms, ``ms-accum train: warning: ...``."""
    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001  (warnings' signature)
        print(f"ms-accum {args.command}: warning: {in_flags(first_paragraph(str(message)), args)}", file=sys.stderr)
    return show


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `ms-accum` console script; returns the exit status. Whatever fails, the command ends with
    one line on stderr (`error_line`), never a traceback."""
    args = build_parser().parse_args(argv)
    # MindSpore's log: critical only, so an error stays one line (a graph that fails to compile also logs it as an
    # ERROR, with its C++ stack); set GLOG_v to see more.
    os.environ.setdefault("GLOG_v", "4")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_printer(args)
            summary = {"train": run_train, "eval": run_eval, "verify": run_verify,
                       "plan": run_plan}[args.command](args)
    except KeyboardInterrupt:
        print(f"ms-accum {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (every failure is one line)
        done = getattr(err, "summary", None)
        if args.json and done is not None:  # what the command did before it failed: the checkpoint `train` saved
            print(json.dumps(done))
        print(f"ms-accum {args.command}: error: {error_line(err, args)}", file=sys.stderr)
        return 1
    if args.json and summary is not None:
        print(json.dumps(summary))
    return 1 if summary is not None and summary.get("passed") is False else 0


if __name__ == "__main__":
    sys.exit(main())

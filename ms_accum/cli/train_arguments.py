"""`ms-accum train`'s arguments: the window's options, the checkpoints, the schedule and the launcher."""
from __future__ import annotations

import argparse

from .._choices import CHECKPOINT_FORMATS, LR_RULES, OUTLIER_WARMUP, PARTIAL_WINDOWS, POLICIES, STRUCTURES
from .arguments import DEFAULTS, accumulate_schedule, add_data_arguments, add_fallback_arguments, \
    add_training_arguments, k_bounds, non_negative_int, positive_float, positive_int


def add_parser(sub) -> None:
    train = sub.add_parser("train", help="train with gradient accumulation, save a checkpoint, evaluate it")
    add_training_arguments(train, "micro-batch size; each update sees K*B samples", planned=True)
    train.add_argument("--epochs", type=positive_int, default=1, metavar="E", sets=("epoch",))
    train.add_argument("--structure", choices=STRUCTURES,
                       help=f"how micro-batches run (default {DEFAULTS['structure']}: three_graphs, the least memory; "
                            f"window and fused are faster and keep more activations alive)")
    _add_window_arguments(train)
    train.add_argument("--num-samples", type=positive_int, metavar="N", help="train on the first N images only")
    add_data_arguments(train)
    add_fallback_arguments(train)
    _add_checkpoint_arguments(train)
    train.add_argument("--accumulate-schedule", type=accumulate_schedule, metavar="SAMPLES:K,...",
                       help="K as a schedule of the global samples consumed, e.g. 0:2,4096:4,16384:8 (a batch "
                            "ramp-up; instead of --accumulate-step)")
    train.add_argument("--adaptive-k", type=k_bounds, metavar="MIN:MAX", sets=("k_min", "k_max"),
                       help="choose K from the measured gradient noise scale, between MIN and MAX, as training goes "
                            "(instead of --accumulate-step; turns on --noise-scale; docs/adaptive-k.md)")
    train.add_argument("--adaptive-fraction", type=positive_float, default=1.0, metavar="F", sets=("fraction",),
                       help="with --adaptive-k: aim the global batch at F times the noise scale (default 1)")
    train.add_argument("--lr-rule", choices=LR_RULES, default="none",
                       help="with --adaptive-k: how the learning rate follows the batch, from the rate for MIN "
                            "(default none; linear for SGD and Momentum, sqrt for Adam)")
    train.add_argument("--plan", metavar="FILE",
                       help="take --batch-size, --accumulate-step and --structure from a plan that 'ms-accum plan "
                            "--output FILE' wrote for this model")
    train.add_argument("--distributed", action="store_true",
                       help="require data parallelism over msrun's workers (automatic under msrun); --batch-size "
                            "is then the global micro-batch, split evenly over the workers")


def add_update_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that change what a window's update is, which `train` trains with and `verify` verifies."""
    parser.add_argument("--clip-norm", type=positive_float, help="clip each window's gradient to this global norm")
    parser.add_argument("--policy", choices=POLICIES, default="skip_window",
                        help="a non-finite loss or gradient skips its window (default) or only its micro-batch")
    parser.add_argument("--loss-scale", choices=("none", "static", "dynamic"), default="none",
                        help="MindSpore loss scaling, checked and updated once per window (default none)")
    parser.add_argument("--loss-scale-value", type=positive_float, default=2.0 ** 16, metavar="S",
                        help="the (initial) loss scale (default 65536)")
    parser.add_argument("--shard-optimizer", action="store_true",
                        help="under msrun, each worker keeps and steps the optimizer state of its own part of the "
                             "parameters (less memory per worker, the same updates; docs/data-parallel.md)")


def loss_scaler(args: argparse.Namespace):
    """MindSpore's loss scaler that --loss-scale and --loss-scale-value ask for, or None."""
    from mindspore import amp
    if args.loss_scale == "static":
        return amp.StaticLossScaler(args.loss_scale_value)
    if args.loss_scale == "dynamic":  # MindSpore's usual settings: halve on overflow, double after 1000 clean steps
        return amp.DynamicLossScaler(args.loss_scale_value, scale_factor=2, scale_window=1000)
    return None


def _add_window_arguments(train: argparse.ArgumentParser) -> None:
    """How each window becomes an update: clipping, statistics and outliers, non-finite windows, loss scaling,
    recomputation, an epoch's last window."""
    add_update_arguments(train)
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
    train.add_argument("--stop-on-nonfinite", action="store_true", help="stop at the first non-finite window")
    train.add_argument("--recompute", nargs="+", metavar="CELL", help="sub-cells to recompute in the backward "
                                                                      "pass, e.g. conv1 conv2 (saves memory)")
    train.add_argument("--partial-window", choices=PARTIAL_WINDOWS, default="apply",
                       help="what to do with an epoch's last, incomplete window (default apply)")


def _add_checkpoint_arguments(train: argparse.ArgumentParser) -> None:
    """Where `train` saves, how often, what it resumes from, and whether it evaluates the result."""
    train.add_argument("--ckpt-dir", default="ckpt", metavar="DIR", sets=("directory",),
                       help="where the checkpoint goes (default ckpt)")
    train.add_argument("--save-every", type=positive_int, metavar="N",
                       help="save the whole training state every N optimizer steps, to resume from")
    train.add_argument("--keep-last", type=positive_int, default=2, metavar="N",
                       help="keep only the newest N training states (default 2)")
    train.add_argument("--ckpt-format", choices=CHECKPOINT_FORMATS, default="ckpt", sets=("format",),
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
    train.add_argument("--tensorboard", metavar="DIR", sets=("logdir",),
                       help="write each step's loss, learning rate, K, gradient norm, noise scale and validation "
                            "for TensorBoard into DIR (needs pip install 'ms_accum[tensorboard]')")

"""`ms-accum verify`: the executor's windows of K micro-batches, with the options `train` takes, against as many steps
on one batch of K*B, parameter by parameter; under msrun, the data-parallel window on every rank."""
from __future__ import annotations

import argparse
import os
from dataclasses import asdict

from .. import runtime
from .._choices import PARTIAL_WINDOWS, STRUCTURES
from .._validation import ArgumentValueError, NoBatchError, door
from .arguments import add_data_arguments, add_fallback_arguments, add_training_arguments, positive_float, \
    positive_int, refuse_with_factory
from .errors import CliWords, during
from .mnist import SYNTHETIC_NOTE, find_data, optimizer_settings
from .train_arguments import add_update_arguments, loss_scaler


def add_parser(sub) -> None:
    verify = sub.add_parser("verify", help="check that windows of K accumulated micro-batches give the updates of "
                                           "as many steps on one K*B batch, parameter by parameter (exit 1 if not)")
    add_training_arguments(verify, "micro-batch size; the large batch is the first K*B training images, or K*B "
                                    "samples from a factory's sample()")
    verify.add_argument("--rtol", type=positive_float, default=1e-5, help="relative tolerance (default 1e-5)")
    verify.add_argument("--atol", type=positive_float, default=1e-6, help="absolute tolerance (default 1e-6)")
    verify.add_argument("--windows", type=positive_int, default=3, metavar="N",
                        help="windows compared with as many large-batch steps, each on the same batch (default 3): "
                             "from the second on a window starts from a cleared buffer and an updated optimizer; "
                             "a built-in model's learning rate (--lr) halves at every step, so a rate that moves is "
                             "checked too (a factory's optimizer is used as it is)")
    verify.add_argument("--structure", choices=STRUCTURES + ("all",), default="auto",
                        help="the executor's structure to verify, as 'train --structure' takes it (default auto: the "
                             "one train runs), or all: each structure, one verdict each")
    add_update_arguments(verify)
    verify.add_argument("--partial-window", choices=PARTIAL_WINDOWS, default="apply",
                        help="also compare an epoch's last, partial window of K-1 micro-batches, as train applies it "
                             "(default apply)")
    add_data_arguments(verify)
    add_fallback_arguments(verify)


def run(args: argparse.Namespace) -> dict:
    """--windows updates from K accumulated micro-batches each against as many on their K*B concatenation, from the
    same start."""
    parallel = _join(args)
    import mindspore as ms
    from ..tools.factory import is_factory, load_model
    from ..tools.verify import verify_equivalence
    factory = is_factory(args.model)
    refuse_with_factory(args, factory, ("optimizer", "lr", "momentum", "data", "download", "synthetic_fallback"))
    ms.set_seed(args.seed)
    large = args.accumulate_step * args.batch_size
    if factory:
        with door("ms-accum verify"), during(f"reading sample({large}) of the factory '{args.model}'"):
            user = load_model(args.model)
            batch = user.batch(large)
        network, loss_fn, optimizer = user.network, user.loss_fn, user.optimizer
        optimizer_name, synthetic, source = type(optimizer).__name__, False, f"{large} samples of its sample()"
        rates, rates_said = None, "its optimizer's learning rate"
    else:
        network, loss_fn, optimizer, optimizer_name, synthetic, source, batch, rates = _verify_on_mnist(args, large)
        rates_said = "learning rate " + ", ".join(f"{rate:g}" for rate in rates)
    from ..train.options import GuardOptions, WindowOptions
    with door("ms-accum verify"), during(f"verifying {args.model}"):
        report = verify_equivalence(network, loss_fn, optimizer, batch, args.accumulate_step, rtol=args.rtol,
                                    atol=args.atol, windows=args.windows, structure=args.structure,
                                    window=WindowOptions(clip_norm=args.clip_norm),
                                    guard=GuardOptions(policy=args.policy, loss_scaler=loss_scaler(args)),
                                    shard_optimizer=args.shard_optimizer, partial_window=args.partial_window)
    if not args.json:
        plural = "s" if args.windows != 1 else ""
        ranks = "" if parallel is None else f", each rank its share of every micro-batch"
        _print(report, f"{args.model}, {optimizer_name}, {args.windows} window{plural} of K={args.accumulate_step} x "
                       f"B={args.batch_size} against {args.windows} step{plural} on one batch of {large} "
                       f"({rates_said}), {source}{ranks}", CliWords(args))
    return {"model": args.model, "accumulate_step": args.accumulate_step, "batch_size": args.batch_size,
            "optimizer": optimizer_name, "learning_rates": rates, "synthetic": synthetic,
            "clip_norm": args.clip_norm, "loss_scale": args.loss_scale,
            "loss_scale_value": None if args.loss_scale == "none" else args.loss_scale_value, "policy": args.policy,
            "shard_optimizer": args.shard_optimizer, **_verdict(report),
            "verdicts": {name: _verdict(each) for name, each in (report.by_structure or
                                                                  {report.structure: report}).items()},
            "refused": {name: refusal.render(CliWords(args)) for name, refusal in report.refused.items()}}


def _verdict(report) -> dict:
    """One structure's verdict, or the whole report's, as --json gives it."""
    return {"structure": report.structure, "passed": report.passed, "verdict": str(report).splitlines()[0],
            "ranks": report.ranks, "reference": report.reference, "decided_by": report.decided_by,
            "windows": report.windows, "partial_window": report.partial_window,
            "first_failed_window": report.first_failed_window, "skipped": report.skipped,
            "max_abs_diff": report.max_abs_diff, "max_rel_diff": report.max_rel_diff,
            "per_window": [{"max_abs_diff": a, "max_rel_diff": r} for a, r in report.per_window],
            "rtol": report.rtol, "atol": report.atol, "moved_between_updates": report.moved_between_updates,
            "per_parameter": {name: {"max_abs_diff": a, "max_rel_diff": r}
                              for name, (a, r) in report.per_parameter.items()},
            "causes": [asdict(cause) for cause in report.causes], "inference_mode": report.inference_mode}


def _join(args: argparse.Namespace):
    """The device set and, under msrun, msrun's data-parallel group joined first of all (msrun runs the command as
    the scheduler too, whose init() never returns); None without a launcher."""
    from ..train.distributed import distributed_launch, init_data_parallel
    runtime.set_device(args.device)
    return None if distributed_launch() is None else init_data_parallel()


def _print(report, header: str, words) -> None:
    """The header, each parameter's largest differences over the windows (over the structures), and the report."""
    print(header)
    reports = list(report.by_structure.values()) or [report]
    per_parameter = {name: tuple(max(each.per_parameter[name][i] for each in reports) for i in (0, 1))
                     for name in reports[0].per_parameter}
    width = max(len(name) for name in per_parameter)
    print(f"  {'parameter':<{width}}  {'max abs diff':>12}  {'max rel diff':>12}")
    for name, (abs_diff, rel_diff) in per_parameter.items():
        print(f"  {name:<{width}}  {abs_diff:>12.3e}  {rel_diff:>12.3e}")
    print(report.text(words))  # a structure's refusal in the command's flags


def _verify_on_mnist(args: argparse.Namespace, large: int) -> tuple:
    """A built-in model with the command line's optimizer, its learning rate halved at every step, and the first K*B
    training images (all of them, or the command is refused): (network, loss, optimizer, its name, synthetic, where
    the batch is from, the batch, the learning rate of each step)."""
    from mindspore import nn
    from ..demo.data import dataset_for
    from ..demo.models import build_model, make_optimizer
    data_dir, synthetic = find_data(args)
    settings = optimizer_settings(args)
    network = build_model(args.model)
    try:
        with door("ms-accum verify"), during(f"reading the MNIST training images in {os.path.abspath(data_dir)}"):
            dataset = dataset_for(args.model, data_dir, large, usage="train", shuffle=False, num_samples=large,
                                  drop_remainder=True)
            batch = tuple(next(dataset.create_tuple_iterator(output_numpy=True)))
    except NoBatchError as err:
        raise ArgumentValueError("{accumulate_step=} x {batch_size=} needs {large} training images, but {data} holds "
                                 "{samples}.", accumulate_step=args.accumulate_step, batch_size=args.batch_size,
                                 large=large, data=os.path.abspath(data_dir),
                                 samples=err.samples).named("ms-accum verify") from err
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    # A rate that moves at every step (MindSpore reads a list's rate at the optimizer's global_step): a window that
    # stepped the optimizer more or less than once, or a restored step counter, would read another rate.
    rates = [settings["lr"] * 0.5 ** step for step in range(args.windows)]
    optimizer = make_optimizer({**settings, "lr": rates}, network.trainable_params())
    source = f"the first images of {os.path.abspath(data_dir)}" + (f" [{SYNTHETIC_NOTE}]" if synthetic else "")
    return network, loss_fn, optimizer, settings["optimizer"], synthetic, source, batch, rates

"""`ms-accum verify`: windows of K accumulated micro-batches against as many steps on one batch of K*B, parameter by
parameter."""
from __future__ import annotations

import argparse
import os
from dataclasses import asdict

from .. import runtime
from .._validation import ArgumentValueError, NoBatchError, door
from .arguments import add_data_arguments, add_fallback_arguments, add_training_arguments, positive_float, \
    positive_int, refuse_with_factory
from .errors import during
from .mnist import SYNTHETIC_NOTE, find_data, optimizer_settings


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
    add_data_arguments(verify)
    add_fallback_arguments(verify)


def run(args: argparse.Namespace) -> dict:
    """--windows updates from K accumulated micro-batches each against as many on their K*B concatenation, from the
    same start."""
    runtime.set_device(args.device)
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
    with door("ms-accum verify"), during(f"verifying {args.model}"):
        report = verify_equivalence(network, loss_fn, optimizer, batch, args.accumulate_step, rtol=args.rtol,
                                    atol=args.atol, windows=args.windows)
    if not args.json:
        plural = "s" if args.windows != 1 else ""
        _print(report, f"{args.model}, {optimizer_name}, {args.windows} window{plural} of K={args.accumulate_step} x "
                       f"B={args.batch_size} against {args.windows} step{plural} on one batch of {large} "
                       f"({rates_said}), {source}")
    return {"model": args.model, "accumulate_step": args.accumulate_step, "batch_size": args.batch_size,
            "optimizer": optimizer_name, "learning_rates": rates, "synthetic": synthetic, "passed": report.passed,
            "windows": report.windows, "first_failed_window": report.first_failed_window,
            "max_abs_diff": report.max_abs_diff, "max_rel_diff": report.max_rel_diff,
            "per_window": [{"max_abs_diff": a, "max_rel_diff": r} for a, r in report.per_window],
            "rtol": args.rtol, "atol": args.atol, "moved_between_updates": report.moved_between_updates,
            "per_parameter": {name: {"max_abs_diff": a, "max_rel_diff": r}
                              for name, (a, r) in report.per_parameter.items()},
            "causes": [asdict(cause) for cause in report.causes], "inference_mode": report.inference_mode}


def _print(report, header: str) -> None:
    """The header, each parameter's largest differences over the windows, and the report."""
    print(header)
    width = max(len(name) for name in report.per_parameter)
    print(f"  {'parameter':<{width}}  {'max abs diff':>12}  {'max rel diff':>12}")
    for name, (abs_diff, rel_diff) in report.per_parameter.items():
        print(f"  {name:<{width}}  {abs_diff:>12.3e}  {rel_diff:>12.3e}")
    print(report)


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

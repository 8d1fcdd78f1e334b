"""`ms-accum verify`: K accumulated micro-batches against one batch of K*B, parameter by parameter."""
from __future__ import annotations

import argparse
import os
from dataclasses import asdict

from .. import runtime
from .._validation import NoBatchError, door
from .arguments import add_data_arguments, add_fallback_arguments, add_training_arguments, positive_float, \
    refuse_with_factory
from .errors import CliError, during
from .mnist import SYNTHETIC_NOTE, find_data, optimizer_settings

def add_parser(sub) -> None:
    verify = sub.add_parser("verify", help="check that K accumulated micro-batches give the update of one K*B "
                                           "batch, parameter by parameter (exit 1 if not)")
    add_training_arguments(verify, "micro-batch size; the large batch is the first K*B training images, or K*B "
                                    "samples from a factory's sample()")
    verify.add_argument("--rtol", type=positive_float, default=1e-5, help="relative tolerance (default 1e-5)")
    verify.add_argument("--atol", type=positive_float, default=1e-6, help="absolute tolerance (default 1e-6)")
    add_data_arguments(verify)
    add_fallback_arguments(verify)


def run(args: argparse.Namespace) -> dict:
    """One update from K accumulated micro-batches against one on their K*B concatenation, from the same start."""
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
    else:
        network, loss_fn, optimizer, optimizer_name, synthetic, source, batch = _verify_on_mnist(args, large)
    with door("ms-accum verify"), during(f"verifying {args.model}"):
        report = verify_equivalence(network, loss_fn, optimizer, batch, args.accumulate_step, rtol=args.rtol,
                                    atol=args.atol)
    summary = {"model": args.model, "accumulate_step": args.accumulate_step, "batch_size": args.batch_size,
               "optimizer": optimizer_name, "synthetic": synthetic, "passed": report.passed,
               "max_abs_diff": report.max_abs_diff, "max_rel_diff": report.max_rel_diff,
               "rtol": args.rtol, "atol": args.atol, "moved_between_updates": report.moved_between_updates,
               "per_parameter": {name: {"max_abs_diff": a, "max_rel_diff": r}
                                 for name, (a, r) in report.per_parameter.items()},
               "causes": [asdict(cause) for cause in report.causes], "inference_mode": report.inference_mode}
    if not args.json:
        print(f"{args.model}, {optimizer_name}, K={args.accumulate_step} x B={args.batch_size} against one batch of "
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
        raise CliError(f"For 'ms-accum verify', --accumulate-step {args.accumulate_step} x --batch-size "
                       f"{args.batch_size} needs {large} training images, but {os.path.abspath(data_dir)} holds "
                       f"{err.samples}.") from err
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer, optimizer_name = make_optimizer(settings, network.trainable_params()), settings["optimizer"]
    source = f"the first images of {os.path.abspath(data_dir)}" + (f" [{SYNTHETIC_NOTE}]" if synthetic else "")
    return network, loss_fn, optimizer, optimizer_name, synthetic, source, batch

"""What `train` trains, and where: the launcher's ranks, the plan, a built-in model on MNIST or a factory's own."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from .. import runtime
from .._validation import Argument, ArgumentValueError, Message, NoBatchError, Setting, door
from .arguments import DEFAULTS
from .errors import CliError, smaller_batch
from .mnist import find_data, optimizer_settings

@dataclass
class Job:
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


def join_launcher(args: argparse.Namespace):
    """Checks msrun's launch against the arguments, sets the device, and joins msrun's data-parallel group; returns
    the group (`ms_accum.train.distributed.init_data_parallel`), or None without a launcher.

    Every check gives the same answer in every process msrun started, the scheduler included, so a bad command line
    stops them all (a scheduler that stops alone leaves the workers waiting for it)."""
    from ..train.distributed import distributed_launch, init_data_parallel
    world = distributed_launch()
    if world is not None and args.batch_size % world:
        raise ArgumentValueError("{@batch_size:subject} (the global micro-batch) must be divisible by the world size "
                                 "{world}, but got {batch_size}.", world=world,
                                 batch_size=args.batch_size).named("ms-accum train")
    runtime.set_device(args.device)
    # First of all: msrun runs this script as the scheduler too, whose init() never returns; nothing may be written
    # before it. --distributed without a launcher is refused there.
    return None if world is None and not args.distributed else init_data_parallel()


def demo_job(args: argparse.Namespace, parallel, world: int) -> Job:
    """LeNet5 or the MLP on MNIST (found, downloaded or generated), with the optimizer of the command line."""
    from mindspore import nn
    from ..demo.data import dataset_for
    from ..demo.evaluation import recorded_data_dir
    from ..demo.models import build_model, make_optimizer
    data_dir, synthetic = find_data(args, None if parallel is None else parallel.rank)
    settings = optimizer_settings(args)
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
        given = Message(" of {num_samples=}", num_samples=args.num_samples) if args.num_samples else ""
        raise ArgumentValueError("the {samples} training image(s){given}{per} in {data} hold no micro-batch of "
                                 "{micro}: pass a {@batch_size:plain} of at most {most}.", samples=err.samples,
                                 given=given, per=f" per worker ({world})" if world > 1 else "",
                                 data=os.path.abspath(data_dir), micro=args.batch_size // world,
                                 most=err.samples * world).named("ms-accum train") from err
    return Job(network=network, loss_fn=nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                optimizer=make_optimizer(settings, network.trainable_params()), dataset=dataset, ckpt_name=args.model,
                source=os.path.abspath(data_dir), synthetic=synthetic,
                reads=f"the MNIST training images in {os.path.abspath(data_dir)}",
                settings={**settings, "data_dir": recorded_data_dir(data_dir, args.ckpt_dir), "synthetic": synthetic},
                held_out=lambda size: dataset_for(args.model, data_dir, size, usage="test", **shards))


def factory_job(args: argparse.Namespace, parallel, world: int) -> Job:
    """Your factory's network, loss and optimizer (as it built them) on its own training data, this rank's shard."""
    from ..tools.factory import load_model
    call = (args.batch_size // world, "train", 0 if parallel is None else parallel.rank, world)
    try:
        with door("ms-accum train"):
            user = load_model(args.model)
            dataset = user.data(*call)
    except NoBatchError as err:
        raise smaller_batch(err, args, "batch_size", world) from err
    return Job(network=user.network, loss_fn=user.loss_fn, optimizer=user.optimizer, dataset=dataset,
                ckpt_name="".join(c if c.isalnum() else "_" for c in args.model), source=f"the data of {args.model}",
                synthetic=False, settings={"optimizer": type(user.optimizer).__name__},
                reads=f"dataset{call} of the factory '{args.model}'",
                held_out=lambda size: user.data(size, "eval", call[2], world))


def apply_plan(args: argparse.Namespace):
    """Fills the model, batch size, K and structure from --plan (refusing flags that contradict it), else from
    DEFAULTS; returns the plan, or None without one."""
    for name in ("accumulate_schedule", "adaptive_k"):
        others = [other for other in ("accumulate_step", "plan", "accumulate_schedule")
                  if getattr(args, other) is not None and other != name]
        if getattr(args, name) is not None and others:
            raise CliError("{flag:plain} sets K: give it without {others}.", flag=Argument(name),
                           others=Message(" or ".join(f"{{@{other}:plain}}" for other in others)))
    if args.adaptive_k is None:
        for name, given in (("lr_rule", args.lr_rule != "none"), ("adaptive_fraction", args.adaptive_fraction != 1.0)):
            if given:
                raise CliError("{flag:plain} needs {@adaptive_k:plain}: it says how K follows the noise scale.",
                               flag=Argument(name))
    if args.plan is None:
        for name, value in DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        return None
    from ..train.plan import Plan
    plan = Plan.load(args.plan)
    planned = {"model": plan.model, "batch_size": plan.batch_size * plan.ranks,
               "accumulate_step": plan.accumulate_step, "structure": plan.structure}
    for name, value in planned.items():
        given = getattr(args, name)
        if given is not None and given != value:
            raise CliError("{given} contradicts the plan {plan}, which says {value}.", given=Setting(name, given),
                           plan=args.plan, value=value)
        setattr(args, name, value)
    return plan

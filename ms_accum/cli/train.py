"""`ms-accum train`: trains with gradient accumulation, saves, plots and evaluates (`run`)."""
from __future__ import annotations

import argparse
import os
from typing import Optional

from .._validation import Message, NoBatchError, door
from .arguments import refuse_with_factory
from .errors import CliError, during, error_line, smaller_batch
from .job import Job, apply_plan, demo_job, factory_job, join_launcher
from .mnist import SYNTHETIC_NOTE, accuracy_line
from .plot import save_loss_plot
from .train_arguments import loss_scaler


def run(args: argparse.Namespace) -> Optional[dict]:
    """Trains, saves, plots and evaluates; returns the summary, or None on a data-parallel rank other than 0."""
    from ..tools.factory import is_factory
    planned = apply_plan(args)
    args.noise_scale = args.noise_scale or args.adaptive_k is not None  # what AdaptiveK decides from
    if args.keep_best and args.eval_every is None:
        raise CliError("{keep_best=} keeps the best of the scores {@eval_every:plain} N asks for: give both.",
                       keep_best=args.keep_best)
    factory = is_factory(args.model)
    refuse_with_factory(args, factory, ("optimizer", "lr", "momentum", "data", "num_samples", "download",
                                         "synthetic_fallback"))
    parallel = join_launcher(args)
    world = 1 if parallel is None else parallel.group_size
    main = parallel is None or parallel.is_main
    import mindspore as ms
    from ..tools.planner import PeakMemory
    from ..train.distributed import decided_together
    memory = PeakMemory()  # as the planner's trials count it, so a plan's prediction and a run compare
    ms.set_seed(args.seed)
    with during(f"reading the data of {args.model}"):
        job = (factory_job if factory else demo_job)(args, parallel, world)
    validation = _validation(args, job, world)
    executor = _executor(args, job, planned, world)
    with door("ms-accum train"):  # rank 0 alone writes it, yet no rank waits for a rank 0 that refused
        board = decided_together(lambda: _tensorboard(args, job, main), parallel, "the TensorBoard directory")
    from ..train.options import Checkpoints
    # The settings the checkpoints record; the directory is checked, and made, by `train_process`, every rank deciding
    # together.
    metadata = {"model": args.model, "accumulate_step": _k_text(args), "batch_size": args.batch_size,
                "seed": args.seed, "world_size": world, **job.settings}
    checkpoints = Checkpoints(directory=args.ckpt_dir, name=job.ckpt_name, save_every=args.save_every,
                              keep_last=args.keep_last, metadata=metadata, resume=args.resume, format=args.ckpt_format)
    label = f"{args.model}, K={_k_text(args)} x B={args.batch_size}" + (
        f" ({SYNTHETIC_NOTE})" if job.synthetic else "") + ("" if parallel is None else f", {world} workers")
    with during(f"training on {job.reads}"):
        result = _train(args, executor, job, checkpoints, validation, board, label, args.quiet or not main)
    if not main:
        return None
    summary = _summary(args, job, result, executor.statistics, world)
    summary.update(peak_memory_mib=memory.mib(),
                   predicted_peak_mib=None if planned is None else planned.predicted_peak_mib)
    summary["loss_plot"] = plot = os.path.join(checkpoints.directory, f"{job.ckpt_name}_loss.png")
    with during(f"writing the loss curve {plot}"):
        save_loss_plot(result.losses, plot, label, summary["accumulate_step"], summary["noise_scale"],
                       [(i, record.validation["loss"]) for i, record in enumerate(result.steps, 1)
                        if record.validation is not None])
    if not args.json:
        _print_trained(label, summary, result, job.synthetic)
    if not args.no_eval:
        evaluation = _evaluate_trained(args, summary, factory, world)
        summary.update(evaluation.as_dict())
        if not args.json:
            print(accuracy_line(evaluation, job.synthetic))
    return summary


def _summary(args: argparse.Namespace, job: Job, result, statistics: bool, world: int) -> dict:
    """What `train` reports of its run (--json prints it)."""
    return {"model": args.model, "checkpoint": result.checkpoint, "synthetic": job.synthetic, "data": job.source,
            "optimizer_steps": len(result.steps), "world_size": world,
            "final_loss": result.losses[-1] if result.losses else None, "resumed_from": result.resumed_from,
            "skipped_windows": result.skipped_windows, "skipped_micro_batches": result.skipped_micro_batches,
            "accumulate_step": [record.accumulate_step for record in result.steps],
            "grad_norm": [record.grad_norm for record in result.steps] if statistics else None,
            "noise_scale": [record.noise_scale for record in result.steps] if args.noise_scale else None,
            "lr_scale": [record.lr_scale for record in result.steps] if args.adaptive_k else None,
            "outliers": result.outliers,
            "samples_consumed": result.steps[-1].samples_consumed if result.steps else None,
            "validation": [{"step": record.step, **record.validation} for record in result.steps
                           if record.validation is not None], "best_checkpoint": result.best_checkpoint}


def _evaluate_trained(args: argparse.Namespace, summary: dict, factory: bool, world: int):
    """The checkpoint `train` saved, evaluated in batches of --eval-batch-size, else of the training micro-batch; a
    failure is one line that names the checkpoint saved, with the summary for --json."""
    from ..demo.evaluation import evaluate_checkpoint
    checkpoint = summary["checkpoint"]
    try:
        with door("ms-accum train"):
            return evaluate_checkpoint(checkpoint, args.model, None if factory else args.data,
                                       args.eval_batch_size or args.batch_size // world, arg_name="--model")[0]
    except Exception as err:  # noqa: BLE001  (whatever failed, the training and its checkpoint stand)
        samples = getattr(err, "samples", None)
        smaller = Message(" {eval_batch_size=}", eval_batch_size=samples) if samples else ""
        raise CliError("{error} Training finished and saved {checkpoint}: evaluate it with 'ms-accum eval --ckpt "
                       "{checkpoint}{smaller}'.", summary=summary, error=error_line(err, args), checkpoint=checkpoint,
                       smaller=smaller) from err


def _k_text(args: argparse.Namespace):
    """K as the command line gave it: an int, the schedule's ``samples:K,...``, or ``adaptive MIN:MAX``."""
    from ..train.schedule import pairs_text
    if args.adaptive_k is not None:
        return "adaptive {}:{}".format(*args.adaptive_k)
    return pairs_text(args.accumulate_schedule.items()) if args.accumulate_schedule else args.accumulate_step


def _executor(args: argparse.Namespace, job: Job, planned, world: int):
    """The executor over `job` with the command line's options, once the plan (if any) fits the network and ranks
    and the cells to recompute are marked."""
    from ..train.executor import GradientAccumulation
    from ..train.options import GuardOptions, StatisticsOptions, WindowOptions
    from ..train.recompute import recompute_cells
    with door("ms-accum train"):  # refused in the command's terms: the user gave the plan and the cells here
        if planned is not None:
            planned.check_fits(job.network, world)
        if args.recompute:
            recompute_cells(job.network, args.recompute, arg_name="--recompute")
    return GradientAccumulation(job.network, job.loss_fn, job.optimizer, structure=args.structure,
                                window=WindowOptions(clip_norm=args.clip_norm),
                                guard=GuardOptions(policy=args.policy, loss_scaler=loss_scaler(args),
                                                   stop_on_nonfinite=args.stop_on_nonfinite),
                                statistics=StatisticsOptions(norms=args.statistics, noise_scale=args.noise_scale,
                                                             skip_outliers=args.skip_outliers,
                                                             outlier_warmup=args.outlier_warmup),
                                shard_optimizer=args.shard_optimizer)


def _train(args: argparse.Namespace, executor, job: Job, checkpoints, validation: dict, board, label: str, quiet: bool):
    """`train_process` over the command line's epochs and K (and `validation`, `_validation`'s), behind a progress
    bar unless `quiet`, each step written for TensorBoard by `board` (`_tensorboard`'s); its result."""
    from ..train.options import LogOptions
    from ..train.windows import count_windows
    k, batches = args.accumulate_schedule or args.accumulate_step, job.dataset.get_dataset_size()
    if args.adaptive_k is not None:  # `train_process`'s `mini_steps`: K, a schedule, or an `AdaptiveK`
        from ..train.adaptive import AdaptiveK
        with door("ms-accum train"):
            k = AdaptiveK(*args.adaptive_k, fraction=args.adaptive_fraction, lr_rule=args.lr_rule)
    # An adaptive K's steps are known only as they come: its bar counts the samples consumed.
    total, unit = ((batches * args.epochs * args.batch_size, "sample") if args.adaptive_k else
                   (count_windows(batches, args.epochs, k, args.batch_size, args.partial_window), "step"))
    with _progress(total, f"train {label}", quiet, unit) as bar:
        def on_step(record):
            # Counted from the start of training, a resumed run's included.
            bar.update((record.samples_consumed if args.adaptive_k else record.step) - bar.n)
            noise = {} if record.noise_scale is None else {"noise_scale": f"{record.noise_scale:.0f}"}
            bar.set_postfix(epoch=record.epoch, K=record.accumulate_step, loss=f"{record.loss:.4f}", **noise,
                            refresh=False)
            if board is not None:
                board(record)
        try:
            return executor.train_process(args.epochs, job.dataset, k, partial_window=args.partial_window,
                                          checkpoints=checkpoints, log=LogOptions(verbose=False, on_step=on_step),
                                          **validation)
        finally:
            if board is not None:
                board.close()


def _progress(total: int, desc: str, quiet: bool, unit: str = "step"):
    from tqdm import tqdm
    # disable=None: no bar when stderr is not a terminal (CI logs, pipes), where every refresh is a new line.
    return tqdm(total=total, desc=desc, unit=unit, disable=True if quiet else None, leave=False,
                dynamic_ncols=True)


def _tensorboard(args: argparse.Namespace, job: Job, main: bool):
    """--tensorboard's writer on rank 0 (`ms_accum.train.tensorboard.TensorBoardLog`), else None; its directory is
    refused before --ckpt-dir is made, in the command's name (`run`'s door)."""
    if args.tensorboard is None or not main:
        return None
    from ..train.tensorboard import TensorBoardLog
    return TensorBoardLog(args.tensorboard, job.optimizer)


def _validation(args: argparse.Namespace, job: Job, world: int) -> dict:
    """`train_process`'s validation arguments for --eval-every: this rank's shard of the held-out data, in batches
    of --eval-batch-size (else the micro-batch) over the workers."""
    if args.eval_every is None:
        return {}
    from ..train.validation import Validation
    size = (args.eval_batch_size or args.batch_size) // world
    try:
        with door("ms-accum train"):
            held_out = job.held_out(size)
    except NoBatchError as err:
        raise smaller_batch(err, args, "eval_batch_size", world) from err
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


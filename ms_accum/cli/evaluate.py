"""`ms-accum eval`: a checkpoint evaluated on the MNIST test set, or on a factory's evaluation data."""
from __future__ import annotations

import argparse

from .. import runtime
from .._validation import NoBatchError, door
from .arguments import add_data_arguments, add_model_argument, positive_int, refuse_with_factory
from .errors import during, smaller_batch
from .mnist import accuracy_line

def add_parser(sub) -> None:
    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the MNIST test set, or a factory's evaluation "
                                           "data (strict loading)")
    evaluate.add_argument("--ckpt", required=True, metavar="FILE")
    add_model_argument(evaluate, None, "the model recorded in the checkpoint")
    evaluate.add_argument("--eval-batch-size", "--batch-size", type=positive_int, dest="eval_batch_size", metavar="B",
                          sets=("batch_size",),
                          help="the evaluation's batch size (default: the micro-batch the checkpoint was trained with, "
                               "else 256)")
    evaluate.add_argument("--num-samples", type=positive_int, metavar="N", help="evaluate the first N test images")
    add_data_arguments(evaluate)


def run(args: argparse.Namespace) -> dict:
    runtime.set_device(args.device)
    from ..demo.data import is_synthetic
    from ..demo.evaluation import checkpoint_data_dir, evaluate_checkpoint
    from ..tools.factory import is_factory
    refuse_with_factory(args, args.model is not None and is_factory(args.model), ("data", "num_samples"))
    try:
        with door("ms-accum eval"), during(f"evaluating {args.ckpt}"):
            evaluation, metadata = evaluate_checkpoint(args.ckpt, args.model, args.data, args.eval_batch_size,
                                                       args.num_samples, arg_name="--model")
    except NoBatchError as err:
        raise smaller_batch(err, args, "eval_batch_size") from err
    model = args.model or metadata["model"]
    synthetic = not is_factory(model) and is_synthetic(checkpoint_data_dir(metadata, args.data, args.ckpt))
    if not args.json:
        k = metadata.get("accumulate_step", metadata.get("accumulate_steps", "?"))  # 0.2's files: accumulate_steps
        print(f"{args.ckpt} ({model}, trained {metadata.get('step', '?')} optimizer steps with K={k})")
        print(accuracy_line(evaluation, synthetic))
    return {"checkpoint": args.ckpt, "model": model, "synthetic": synthetic, **evaluation.as_dict()}

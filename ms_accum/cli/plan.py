"""`ms-accum plan`: the micro-batch, K and structure for a global batch within a memory budget."""
from __future__ import annotations

import argparse
import sys

from .._choices import DEVICES
from .._validation import door
from .arguments import DEFAULTS, add_model_argument, memory_size, positive_int
from .errors import during

def add_parser(sub) -> None:
    planner = sub.add_parser("plan", help="choose the micro-batch, K and structure for a global batch within a "
                                          "memory budget, from peak memory measured in fresh processes")
    add_model_argument(planner, DEFAULTS["model"], DEFAULTS["model"])
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


def run(args: argparse.Namespace) -> dict:
    """Plans in fresh processes, prints the plan and writes it with --output."""
    from ..tools.planner import plan
    log = None if args.quiet or args.json else (lambda line: print(f"ms-accum plan: {line}", file=sys.stderr,
                                                                   flush=True))
    with door("ms-accum plan"), during(f"planning {args.model}"):
        result = plan(args.model, args.global_batch, args.memory, ranks=args.ranks, device=args.device, log=log,
                      output=args.output)
    if not args.json:
        print(result)
        if args.output:
            print(f"Written to {args.output}: train with 'ms-accum train --plan {args.output}'.")
    return result.to_dict()

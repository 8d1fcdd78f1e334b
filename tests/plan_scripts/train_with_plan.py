"""Trains with a plan as a user does, in this fresh process; the last line is JSON: the Ks of its windows and its peak
memory as the planner counts it (`ms_accum.tools.planner.PeakMemory`).

    python train_with_plan.py PLAN.json CKPT_DIR cli|python    (from the directory the plan's factory is imported from)

``cli``, for a factory with a dataset: ``ms-accum train --plan PLAN.json`` over it, saving a training state every 2 updates and
evaluating the checkpoint after (its summary says its peak). ``python``: `GradientAccumulation.from_plan` over a dataset
of the factory's samples, saving the same.
"""
import contextlib
import io
import json
import sys

import ms_accum  # noqa: F401  (before MindSpore, as users of the CLI get it)
import mindspore.dataset as ds
from ms_accum import GradientAccumulation, Plan
from ms_accum.cli import main
from ms_accum.tools.factory import load_model
from ms_accum.tools.planner import WINDOWS, PeakMemory
from ms_accum.train.options import Checkpoints, QUIET

plan_path, ckpt_dir, way = sys.argv[1:]
plan = Plan.load(plan_path)
ms_accum.set_device(plan.device)  # graph mode, as the command line and the planner's trials run
if way == "cli":
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["train", "--plan", plan_path, "--ckpt-dir", ckpt_dir, "--save-every", "2", "--quiet", "--json"])
    assert status == 0, status  # its error is on stderr
    summary = json.loads(out.getvalue().splitlines()[-1])
    ks, peak = summary["accumulate_step"], summary["peak_memory_mib"]
else:
    memory = PeakMemory()
    user = load_model(plan.model)
    data, label = user.sample(plan.global_batch // plan.ranks * WINDOWS)
    dataset = ds.NumpySlicesDataset({"data": data, "label": label}, shuffle=False).batch(plan.batch_size)
    executor = GradientAccumulation.from_plan(plan, user.network, user.loss_fn, user.optimizer)
    result = executor.train_process(1, dataset, checkpoints=Checkpoints(directory=ckpt_dir, save_every=2), log=QUIET)
    ks, peak = [r.micro_batches for r in result.steps], memory.mib()
print(json.dumps({"accumulate_step": ks, "peak_mib": peak}))

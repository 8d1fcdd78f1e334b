"""Trains the windows of a plan's trial with the executor a user builds from the plan, and prints its peak memory.

    python train_with_plan.py PLAN.json     (from the directory the plan's factory is imported from)

What a user runs: `GradientAccumulation.from_plan` over a dataset of the factory's samples, `train_process` with the
plan's K; the peak measured as the planner measures it (CPU: growth of the peak RSS from before the executor).
"""
import json
import sys

import ms_accum  # noqa: F401  (before MindSpore, as users of the CLI get it)
import mindspore as ms
import mindspore.dataset as ds

from ms_accum import GradientAccumulation, Plan
from ms_accum.tools.factory import load_model
from ms_accum.tools.planner import MIB, WINDOWS, process_status

ms.set_context(mode=ms.GRAPH_MODE)
plan = Plan.load(sys.argv[1])
user = load_model(plan.model)
data, label = user.sample(plan.global_batch // plan.ranks * WINDOWS)
dataset = ds.NumpySlicesDataset({"data": data, "label": label}, shuffle=False).batch(plan.batch_size)
start = process_status("VmRSS")
executor = GradientAccumulation.from_plan(plan, user.network, user.loss_fn, user.optimizer)
result = executor.train_process(1, dataset, ckpt_dir=None, verbose=False)
print(json.dumps({"peak_mib": (process_status("VmHWM") - start) / MIB, "mini_steps": result.steps[0].micro_batches,
                  "structure": executor.structure, "windows": len(result.steps)}))

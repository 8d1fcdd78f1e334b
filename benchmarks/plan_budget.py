"""A plan's budget against what training with it takes, on the command line, each in fresh processes.

``ms-accum plan`` for a parameter-heavy model (tests/plan_scripts/parameter_heavy.py's ``encoder_4x768``: 4 written-out
encoder layers of width 768 at sequence 128, 132 MiB of parameters, AdamW) at a global batch and a budget, then
``ms-accum train --plan`` with it, several times, each saving training states and evaluating after: its summary's
``peak_memory_mib``, counted as the plan's trials count it (docs/verify-and-plan.md#what-a-budget-counts).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, Dict

from .common import REPO

FACTORY_DIR = os.path.join(REPO, "tests", "plan_scripts")  # the factories' module, found from the current directory


def _ms_accum(*args: str) -> dict:
    """``ms-accum ARGS --json`` from the factory's directory; its JSON line."""
    done = subprocess.run([sys.executable, "-c", "import sys; from ms_accum.cli import main; sys.exit(main())", *args,
                           "--json", "--quiet"], cwd=FACTORY_DIR, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"ms-accum {' '.join(args)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def measure(memory: str, global_batch: int, repeats: int, log: Callable[[str], None], model: str) -> Dict:
    """The plan for `model` at `global_batch` within `memory`, and the peaks of `repeats` trainings with it."""
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        plan = _ms_accum("plan", "--model", model, "--global-batch", str(global_batch), "--memory", memory,
                         "--output", plan_path)
        log(f"   plan: K={plan['accumulate_step']} x B={plan['batch_size']} {plan['structure']}, predicted "
            f"{plan['predicted_peak_mib']:.0f} MiB of {plan['budget_mib']:.0f}")
        peaks = []
        for r in range(repeats):
            summary = _ms_accum("train", "--plan", plan_path, "--ckpt-dir", os.path.join(tmp, f"ckpt{r}"),
                                "--save-every", "2")
            peaks.append(summary["peak_memory_mib"])
            log(f"   train {r + 1} of {repeats}: peak {peaks[-1]:.0f} MiB")
    return {"model": model, "memory": memory, "global_batch": global_batch, "plan": plan, "peaks": peaks}


def render(row: Dict) -> str:
    plan, peaks = row["plan"], row["peaks"]
    predicted, budget = plan["predicted_peak_mib"], plan["budget_mib"]
    lines = [f"== plan_budget. {row['model']}, global batch {row['global_batch']}, --memory {row['memory']}: the plan "
             f"and `ms-accum train --plan` in fresh processes (saving states every 2 updates, evaluating after)",
             f"plan       : K={plan['accumulate_step']} x B={plan['batch_size']}, {plan['structure']}, predicted peak "
             f"{predicted:.0f} MiB (budget {budget:.0f} MiB, 10 % kept free)"]
    for peak in peaks:
        lines.append(f"train      : peak {peak:.0f} MiB = {peak / budget:.2f}x the budget, {peak / predicted:.2f}x the "
                     f"prediction")
    return "\n".join(lines)

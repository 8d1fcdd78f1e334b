"""A plan: the micro-batch B, K and the structure that `ms_accum.tools.planner.plan` chose, with what it measured.

It lives with training because the executor takes it (`GradientAccumulation.from_plan`, ``ms-accum train --plan``);
making one is the planner's job.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class Trial:
    """One fresh-process measurement: micro-batch `batch_size`, windows of `accumulate_step`, one `structure`.

    `peak_mib` is None when the trial failed (`error` says why: killed for memory, or what it raised)."""

    batch_size: int
    accumulate_step: int
    structure: str
    peak_mib: Optional[float]
    ms_per_window: Optional[float] = None
    error: Optional[str] = None

    @property
    def accumulate_steps(self) -> int:
        """Deprecated: `accumulate_step` (K has one name in the API); this alias goes in the next release."""
        warnings.warn("'accumulate_steps' is deprecated; use 'accumulate_step'.", DeprecationWarning, stacklevel=2)
        return self.accumulate_step

    def fits(self, budget_mib: float) -> bool:
        return self.peak_mib is not None and self.peak_mib <= budget_mib


@dataclass
class Plan:
    """
    What `plan` chose and everything it measured.

    Attributes:
        model (str): The factory (``package.module:function``) or built-in model planned.
        global_batch (int): Samples per optimizer step, over all ranks.
        ranks (int): Data-parallel ranks; each trains micro-batches of `batch_size`.
        batch_size (int): The micro-batch per rank, B, a divisor of ``global_batch // ranks``.
        accumulate_step (int): K, so that ``K * batch_size * ranks == global_batch``.
        structure (str): The executor's structure (``GradientAccumulation(structure=...)``).
        reduction (str): How the loss is reduced (``"weighted_mean"`` when it returns ``(loss, weight)``).
        predicted_peak_mib (float): The peak the fitted line predicts for `batch_size` with `structure`.
        memory_mib (float, optional): The budget; None when none was given and the device's free memory was used.
        budget_mib (float): The budget planned within: `memory_mib`, or the device's free memory.
        intercept_mib (float), slope_mib (float): The fitted line, peak ≈ intercept + slope * B (memory-first
            structure).
        device (str): Where the trials ran.
        trials (list[Trial]): Every measurement, in the order made.
    """

    model: str
    global_batch: int
    ranks: int
    batch_size: int
    accumulate_step: int
    structure: str
    reduction: str
    predicted_peak_mib: float
    memory_mib: Optional[float]
    budget_mib: float
    intercept_mib: float
    slope_mib: float
    device: str
    trials: List[Trial] = field(default_factory=list)

    @property
    def accumulate_steps(self) -> int:
        """Deprecated: `accumulate_step` (K has one name in the API); this alias goes in the next release."""
        warnings.warn("'accumulate_steps' is deprecated; use 'accumulate_step'.", DeprecationWarning, stacklevel=2)
        return self.accumulate_step

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Plan":
        names = {f.name for f in dataclasses.fields(cls)}
        values = _renamed(values)
        missing = names - set(values)
        if missing:
            raise ValueError(f"For 'Plan', a plan must hold {sorted(names)}, but {sorted(missing)} are missing.")
        trials = [Trial(**_renamed(trial)) for trial in values["trials"]]
        return cls(**{**{k: values[k] for k in names}, "trials": trials})

    def save(self, path: str) -> str:
        """Writes the plan as JSON (what ``ms-accum plan --output`` writes and ``ms-accum train --plan`` reads)."""
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, indent=1)
        return path

    @classmethod
    def load(cls, path: str) -> "Plan":
        """Reads a plan that `save` wrote.

        Raises:
            ValueError: If the file cannot be read or is not a plan.
        """
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.from_dict(json.load(handle))
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise ValueError(f"For 'Plan.load', the file '{path}' is not a plan written by 'ms-accum plan "
                             f"--output' or Plan.save: {err}") from err

    def __str__(self) -> str:
        budget = (f"a budget of {self.memory_mib:.0f} MiB" if self.memory_mib is not None
                  else f"the device's free memory ({self.budget_mib:.0f} MiB)")
        lines = [f"Plan for {self.model}: global batch {self.global_batch} = K={self.accumulate_step} x "
                 f"B={self.batch_size}" + (f" x {self.ranks} ranks" if self.ranks > 1 else "") +
                 f", structure '{self.structure}', predicted peak {self.predicted_peak_mib:.0f} MiB within {budget}",
                 f"  fit: peak = {self.intercept_mib:.1f} MiB + {self.slope_mib:.2f} MiB x B",
                 f"  {'B':>6} {'K':>5}  {'structure':<13}{'peak MiB':>10}{'ms/window':>11}"]
        for trial in self.trials:
            peak = "-" if trial.peak_mib is None else f"{trial.peak_mib:.0f}"
            time_ = "-" if trial.ms_per_window is None else f"{trial.ms_per_window:.0f}"
            mark = "" if trial.error is None else f"  ({trial.error})"
            lines.append(f"  {trial.batch_size:>6} {trial.accumulate_step:>5}  {trial.structure:<13}{peak:>10}"
                         f"{time_:>11}{mark}")
        return "\n".join(lines)


def _renamed(values: dict) -> dict:
    """A plan's fields as ms_accum 0.2 wrote them (``accumulate_steps``) under today's names."""
    if isinstance(values, dict) and "accumulate_steps" in values and "accumulate_step" not in values:
        values = {("accumulate_step" if k == "accumulate_steps" else k): v for k, v in values.items()}
    return values

"""One contract for K: what a run asks of a fixed K, a schedule and `AdaptiveK` alike (`KPolicy`).

Looking ahead and deciding are two methods. Looking ahead (`KPolicy.peek`) is pure, as optax's schedules are pure
functions of the step: the run plans its windows with it before anything trains (the largest K, the last step), a resume
compares schedules with it, `count_windows` counts with it, and none of that can move a decision. Deciding
(`KPolicy.open_window`) is called once per window, when it opens, in order. A schedule decides what it peeks; an
`AdaptiveK` run's `Controller` decides from what the run measured, so its peek answers only as far as no decision lies
between (None beyond: its windows are then counted only as they open). No policy is called: the two have a name each.

`train_process` takes `mini_steps` as an int, a dict or a callable (an `AccumulationSchedule`, its own policy) or an
`AdaptiveK` (settings: `AdaptiveK.for_run` makes a run's policy); the run holds one `KPolicy` and never asks which.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from ..core.statistics import NoiseScale

Described = Dict[str, Union[int, str]]  # what a checkpoint records of K (`KPolicy.describe`)


class KPolicy(ABC):
    """
    K for each window of a run: `peek` looks ahead and changes nothing; `open_window` decides the window that opens now.
    The rest, with defaults for a K that measures nothing, is what the run keeps for a K that does: the estimate it
    decides from, the learning-rate factor, and the state saved with every training state.

    A policy is used by one run at a time (`for_run`). A schedule's `peek` and `open_window` give the same K at the same
    samples, whenever asked.

    Attributes:
        noise (NoiseScale, optional): The noise-scale estimate it decides from, which the run updates after each window
            and saves with its state; None: it decides from no measurement.
        scales_lr (bool): Whether `lr_scale` may differ from 1 (the optimizer's rate must then be one the run can
            scale, `ms_accum.train.lr.RunRate`).
        k_max (int, optional): The largest K it may give; needed when `peek` may say None, for the graph built ahead.

    Examples:
        >>> from ms_accum import AccumulationSchedule, AdaptiveK
        >>> schedule = AccumulationSchedule({0: 2, 4096: 4})
        >>> schedule.peek(4096), schedule.open_window(4096)
        (4, 4)
        >>> k = AdaptiveK(2, 32, min_samples=1024).for_run(16)
        >>> k.peek(512), k.peek(1024), k.decisions
        (2, None, 0)
    """

    noise: Optional["NoiseScale"] = None
    scales_lr: bool = False
    k_max: Optional[int] = None

    def for_run(self, per_batch: int) -> "KPolicy":
        """The policy of one run over global micro-batches of `per_batch` samples: itself, when it keeps no state."""
        return self

    @abstractmethod
    def peek(self, samples: int) -> Optional[int]:
        """K of the window that opens after `samples` global samples consumed, as far as it is known now; None when
        it depends on what the run has yet to measure. Pure: asking changes nothing, however often and wherever."""

    @abstractmethod
    def open_window(self, samples: int) -> int:
        """Decides K of the window that opens now, after `samples` global samples consumed (the run calls it once per
        window, in order, samples increasing), and records the decision."""

    @abstractmethod
    def describe(self, per_batch: int, opened: Optional[Sequence[Tuple[int, int]]] = None) -> Described:
        """What a checkpoint records of K, for global micro-batches of `per_batch` samples: ``accumulate_step`` (the
        fixed K, 0 when it changes), ``global_batches`` (samples consumed: global batch, from where each holds) and
        ``adaptive_k`` (`AdaptiveK.settings`, ``""`` for a schedule). Before the run `opened` is None: the settings
        every training state records, and a resume compares; after it, `opened` gives where the global batch changed
        in the windows opened, for the final checkpoint."""

    def lr_scale(self, k: int) -> float:
        """The factor on the learning rate for a window of `k` that just opened: 1."""
        return 1.0

    def observe(self, window_weight: float, micro_batches: int) -> None:
        """Takes an applied window into what it decides from: its total weight over all ranks, `micro_batches` per
        rank. Nothing here."""

    def state(self) -> Dict[str, float]:
        """What a training state saves to continue the decisions exactly: nothing here."""
        return {}

    def load(self, state: dict) -> None:
        """Restores what `state` saved (keys missing: a fresh start). Nothing here."""

"""What training reports: one `StepRecord` per window closed, a `TrainResult` per run, `NonFiniteError`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass
class StepRecord:
    """One window: where it closed (`step`: windows closed so far, see `Position`), its loss (the sample- or
    token-weighted mean over all ranks' micro-batches), its samples (all ranks'), and whether it was skipped as not
    finite."""

    epoch: int
    step: int
    loss: float
    micro_batches: int
    samples: int
    skipped: bool = False
    loss_scale: float = 1.0
    accumulate_steps: int = 0  # the window's K (its schedule's; a partial window holds fewer micro-batches)
    samples_consumed: int = 0  # global samples read when the window closed (`ms_accum.train.schedule`)
    # With statistics measured (`GradientAccumulation(statistics=True)`), else nan and empty:
    grad_norm: float = float("nan")  # the window's mean gradient's norm (all ranks), unscaled, before clipping
    micro_batch_grad_norms: List[float] = field(default_factory=list)  # this rank's micro-batches' own mean gradients
    noise_scale: Optional[float] = None  # with noise_scale=True: the estimate after this window (`NoiseScale`)
    outliers: List[int] = field(default_factory=list)  # batch indices (in the epoch) left out as outliers


class NonFiniteError(FloatingPointError):
    """Raised with ``stop_on_nonfinite=True`` when a window is not finite; the parameters were left untouched."""


@dataclass
class TrainResult:
    """What `train_process` did: one record per optimizer step, the windows dropped, the checkpoint."""

    steps: List[StepRecord] = field(default_factory=list)
    dropped_windows: int = 0
    checkpoint: Optional[str] = None
    resumed_from: Optional[str] = None
    skipped_windows: int = 0  # not finite, so not applied (over the whole training, resumed runs included)
    skipped_micro_batches: int = 0  # left out: not finite (policy "skip_microbatch") or outliers (skip_outliers)
    outliers: List[Tuple[int, int]] = field(default_factory=list)  # (epoch, batch index in it) of each outlier left out

    @property
    def losses(self) -> List[float]:
        """The loss of each optimizer step, in order."""
        return [record.loss for record in self.steps]

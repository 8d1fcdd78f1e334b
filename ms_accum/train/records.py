"""What training reports: one `StepRecord` per window closed, a `TrainResult` per run, `NonFiniteError`; and how a
window's figures are gathered over the ranks (`WindowFigures`) and logged (`WindowLog`)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor

from .._validation import CallError
from ..deprecation import removed_from


@removed_from("ms_accum.train.StepRecord")  # accumulate_steps, as a keyword and an attribute
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
    accumulate_step: int = 0  # the window's K (its schedule's; a partial window holds fewer micro-batches)
    samples_consumed: int = 0  # global samples read when the window closed (`ms_accum.train.schedule`)
    # With statistics measured (`StatisticsOptions`), else None and empty, as any figure not measured:
    grad_norm: Optional[float] = None  # the window's mean gradient's norm (all ranks), unscaled, before clipping
    micro_batch_grad_norms: List[float] = field(default_factory=list)  # this rank's micro-batches' own mean gradients
    noise_scale: Optional[float] = None  # with noise_scale=True: the estimate after this window (`NoiseScale`)
    lr_scale: float = 1.0  # the factor on the learning rate for this window (`AdaptiveK`'s lr_rule)
    outliers: List[int] = field(default_factory=list)  # batch indices (in the epoch) left out as outliers
    validation: Optional[Dict[str, float]] = None  # with an eval_dataset, when scored after this window (`Validation`)


class NonFiniteError(CallError, FloatingPointError):
    """Raised with ``stop_on_nonfinite=True`` when a window is not finite; the parameters were left untouched. The
    message says which window and why."""


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
    stopped: bool = False  # stopped early: `on_step` returned True (the training state was saved, if it has a place)
    best_checkpoint: Optional[str] = None  # the best network's file, with `Validation(keep_best=...)` and checkpoints

    @property
    def losses(self) -> List[float]:
        """The loss of each optimizer step, in order."""
        return [record.loss for record in self.steps]


def values(x) -> np.ndarray:
    """A graph output (a Tensor) or host numbers, as a float64 array."""
    return np.asarray(x.asnumpy() if isinstance(x, Tensor) else x, np.float64)


class WindowFigures:
    """One window's figures: its micro-batches' (this rank's) and the window's over all ranks, summed by the buffer's
    reducer in one small all-reduce (in data parallel; the values themselves stand-alone).

    Args:
        reduction (Reduction): The buffer's rule, which reads each micro-batch's loss and weight back.
        reducer (Union[LocalSums, AllReduceSums]): The buffer's reducer.
        outputs (list): The micro-batches' graph outputs.
        statistics (list): Each micro-batch's ``(squared gradient norm, left out)``.
        samples (list[int]): Each micro-batch's sample count.
    """

    def __init__(self, reduction, reducer, outputs: list, statistics: list, samples: Sequence[int]) -> None:
        pairs = reduction.loss_weights(outputs, samples)
        self.values, weights = (np.asarray([values(x) for x in column], np.float64) for column in zip(*pairs))
        self.sq_norms, left_out = np.asarray(statistics, np.float64).reshape(-1, 2).T
        self.left_out = left_out > 0  # an outlier (a non-finite micro-batch's figures are nan)
        self.left_out_indices = np.flatnonzero(self.left_out)
        kept = np.isfinite(self.values) & np.isfinite(self.sq_norms) & ~self.left_out
        local = [(self.values[kept] * weights[kept]).sum(), weights[kept].sum(), sum(samples),
                 self.sq_norms[kept].sum(), kept.sum(), (1.0 / weights[kept]).sum()]
        total, self.weight, samples_all, sq_norm_sum, micro, reciprocals = reducer.total(
            Tensor(np.asarray(local, np.float32))).asnumpy().astype(np.float64)
        self.loss = float(total / self.weight) if self.weight > 0 else np.nan  # the weighted mean over all ranks
        self.samples = int(samples_all)
        self.kept = micro  # micro-batches kept, over all ranks
        # For the noise scale: the kept micro-batches' mean squared norm and their weights' harmonic mean.
        self.micro_sq_norm = sq_norm_sum / micro if micro > 0 else np.nan
        self.micro_weight = micro / reciprocals if micro > 0 else np.nan

    def has_two_batch_sizes(self) -> bool:
        """Whether the micro-batch and the window differ in size, as the noise scale's two estimates need."""
        return self.kept > 0 and self.micro_weight < self.weight

    def micro_batch_norms(self) -> List[float]:
        return [float(n) for n in np.sqrt(self.sq_norms)]


class WindowLog:
    """What the executor says about each window: its log line, the outliers left out, a skipped window (a warning,
    a log line under a loss scaler, or `NonFiniteError`), and the user's `on_step`."""

    def __init__(self, log_every: int, verbose: bool, on_step: Optional[Callable[[StepRecord], None]],
                 stop_on_nonfinite: bool, scaled: bool) -> None:
        self.log_every, self.verbose, self.on_step = log_every, verbose, on_step
        self.stop_on_nonfinite, self.scaled = stop_on_nonfinite, scaled

    def window(self, record: StepRecord, figures: WindowFigures, result: TrainResult) -> bool:
        """Says what the window did; returns whether `on_step` asked the run to stop (it returned True)."""
        epoch, step = record.epoch, record.step
        if self.verbose:
            for batch, i in zip(record.outliers, figures.left_out_indices):
                print(f"epoch: {epoch} batch: {batch} left out as an outlier (loss {figures.values[i]:.6g}, gradient "
                      f"norm {np.sqrt(figures.sq_norms[i]):.6g})", flush=True)
        if record.skipped:
            why = ("every micro-batch of the window was left out as an outlier" if figures.left_out.all() else
                   "the window's gradient or loss is not finite")
            what = (f"epoch {epoch} step {step}: {why}, so it was skipped (parameters unchanged; "
                    f"{result.skipped_windows} window(s) skipped so far)")
            if self.stop_on_nonfinite:
                raise NonFiniteError("{what}; stopping, as {stop_on_nonfinite=} asks.", what=what,
                                     stop_on_nonfinite=True)
            if self.scaled:  # overflow is routine with a loss scaler: a log line, not a warning
                if self.verbose:
                    print(f"{what}; loss scale now {record.loss_scale:g}", flush=True)
            else:
                warnings.warn(what, RuntimeWarning, stacklevel=3)
        if self.verbose and step % self.log_every == 0:
            print(f"epoch: {epoch} step: {step} loss is {record.loss:.6f}", flush=True)
        return self.on_step is not None and self.on_step(record) is True

"""What is in the window: each micro-batch's gradient norm, measured in the graph, and the gradient noise scale.

Accumulation sees each micro-batch's gradient on its own before summing it. With statistics on
(``AccumulationBuffer(statistics=True)``, ``GradientAccumulation(statistics=True)``), every micro-batch's graph also
returns the squared norm of the micro-batch's own mean gradient, unscaled and unweighted (the buffer receives it times
the backward pass's sensitivity, weight x loss scale, which is divided out), and the window's check writes the squared
norm of the window's mean gradient before clipping. A norm, not a copy: no buffer is added. With statistics off (the
default) nothing is computed and every Cell's output is as before.

`NoiseScale` turns both into McCandlish et al.'s simple noise scale B_simple = tr(Σ) / |G|² (docs/statistics.md).
"""
from __future__ import annotations

import math
from typing import Optional

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from . import _ops
from .._validation import check_positive_float, check_positive_int

UNMEASURED = (0.0, 0.0)  # host side, a micro-batch's [squared norm, left out] with statistics off: kept, not measured
OUTLIER_BETA = 0.99  # the running statistics of `OutlierFilter` forget with this decay once past 100 micro-batches
MIN_OUTLIER_WARMUP = 8  # micro-batches taken in before `OutlierFilter` judges any, whatever its warm-up


@ms.jit_class
class NoStatistics:
    """Statistics off: nothing is computed, the Cells' outputs are unchanged."""

    def micro_batch(self, loss, grads, weight, sens, grads_norm):
        """What a micro-batch adds to the window, `(loss, grads, weight, statistics)`, from its loss and its gradients
        `grads` (which carry `sens`; `grads_norm`, `_ops.DenseGradsNorm` or `_ops.SparseGradsNorm`, sums their
        squares): everything, and no statistics."""
        return loss, grads, weight, None

    def output(self, out, stats):
        """The Cell's output: the network's output alone."""
        return out

    def split(self, output):
        """Host side: a Cell's output as `(the network's output, statistics)`; None: nothing measured."""
        return output, None

    def collect(self, collected, at, stats):
        """`TrainWindowCell`'s running record of its micro-batches' statistics: nothing."""
        return collected

    def window(self, grads):
        """Notes the window's mean gradient before clipping: `(grads, its squared norm)`; here nothing is measured
        (None)."""
        return grads, None

    def parameters(self) -> list:
        """Scratch Parameters, rewritten every window and never saved."""
        return []

    def state(self) -> list:
        """Parameters that are training state, saved and resumed with the buffer."""
        return []


@ms.jit_class
class Statistics(NoStatistics):
    """Statistics on: a micro-batch's ``[squared gradient norm, left out (0 or 1)]`` is returned with its output, the
    window's squared norm is written to `window_sq_norm` (read by the host after the window's check).

    Args:
        prefix (str): Name prefix of the Parameter. Default: ``"accumulate"``.
    """

    def __init__(self, prefix: str = "accumulate") -> None:
        self.window_sq_norm = Parameter(Tensor(0.0, ms.float32), name=f"{prefix}.window_sq_norm", requires_grad=False)

    def micro_batch(self, loss, grads, weight, sens, grads_norm):
        sq, grads = self._sq_norm(grads, sens, grads_norm)
        return loss, grads, weight, ops.stack([sq, ops.zeros((), ms.float32)])

    def _sq_norm(self, grads, sens, grads_norm):
        """`(the micro-batch's squared norm, grads)`: each gradient handed on after its own sum of squares, so the
        buffer adds it as soon as it is measured and does not wait for the whole norm."""
        sens = ops.cast(sens, ms.float32)
        sq, grads = grads_norm.measure(grads)
        # One factor: for a constant sensitivity it is a compile-time constant, and the norm costs one Mul.
        return sq * (1.0 / (sens * sens)), grads

    def output(self, out, stats):
        return out, stats

    def split(self, output):
        return output

    def collect(self, collected, at, stats):
        return ops.tensor_scatter_update(collected, at, ops.reshape(stats, (1, 2)))

    def window(self, grads):
        sq_norm = _ops.squared_norm(grads)
        ops.assign(self.window_sq_norm, sq_norm)
        return grads, sq_norm

    def parameters(self) -> list:
        return [self.window_sq_norm]


@ms.jit_class
class OutlierFilter(Statistics):
    """
    Statistics, and a micro-batch whose loss or gradient norm lies beyond `z` standard deviations of the running mean
    of recent micro-batches is left out of its window as ``policy="skip_microbatch"`` leaves out a non-finite one: its
    gradient and weight add nothing (so the window's divisor is corrected), it is counted in `skipped`, and its
    statistics say so.

    The running mean and variance are exponentially weighted (`OUTLIER_BETA`): a plain mean over the first
    micro-batches, then one that forgets (weight ``max(1 / n, 1 - β)`` for the n-th), updated by every finite
    micro-batch, an outlier clipped to the threshold. No micro-batch is judged before `warmup` (at least
    `MIN_OUTLIER_WARMUP`) have been taken in. They are Parameters of the training state, so a resumed run decides as
    the uninterrupted one. In data parallel each rank judges its own micro-batches; the window's sums are all-reduced,
    so the ranks stay identical.

    Args:
        z (float): The threshold in standard deviations.
        warmup (int): Micro-batches taken in before any is judged.
        skipped (Parameter): The counter of micro-batches left out (the guard's).
        prefix (str): Name prefix of the Parameters. Default: ``"accumulate"``.
    """

    def __init__(self, z: float, warmup: int, skipped, prefix: str = "accumulate") -> None:
        super().__init__(prefix)
        self.z = z
        # A variance of a few micro-batches is no basis to judge: near 0, it would leave out nearly every later one.
        self.warmup = max(warmup, MIN_OUTLIER_WARMUP)
        self.skipped = skipped
        self.seen = Parameter(Tensor(0.0, ms.float32), name=f"{prefix}.outlier_seen", requires_grad=False)
        self.mean = Parameter(Tensor([0.0, 0.0], ms.float32), name=f"{prefix}.outlier_mean", requires_grad=False)
        self.var = Parameter(Tensor([0.0, 0.0], ms.float32), name=f"{prefix}.outlier_var", requires_grad=False)

    def micro_batch(self, loss, grads, weight, sens, grads_norm):
        sq, grads = self._sq_norm(grads, sens, grads_norm)
        value = ops.stack([ops.cast(loss, ms.float32), ops.sqrt(sq)])  # [loss, gradient norm]
        deviation = value - self.mean
        judged = self.seen >= self.warmup
        bound = self.z * ops.sqrt(self.var)
        outlier = ops.logical_and(judged, (ops.abs(deviation) > bound).any())
        keep = ops.logical_not(outlier)
        # Every finite micro-batch updates the statistics, an outlier only as far as the threshold (winsorized): a
        # spike barely moves them, and a lasting shift of the loss is followed instead of locking every later
        # micro-batch out.
        take = ops.isfinite(value).all()
        deviation = ops.select(judged, ops.clip_by_value(deviation, -bound, bound), deviation)
        rate = ops.maximum(1.0 / (self.seen + 1.0), 1.0 - OUTLIER_BETA)
        mean = self.mean + rate * deviation
        var = (1.0 - rate) * (self.var + rate * deviation * deviation)
        # Both read before either is written: read after the mean's write, the variance was copied (a TensorMove
        # kernel per read; docs/mindspore.md, Assign's return value).
        mean, var = ops.select(take, mean, self.mean), ops.select(take, var, self.var)
        ops.assign(self.mean, mean)
        ops.assign(self.var, var)
        ops.assign_add(self.seen, ops.cast(take, ms.float32))
        ops.assign_add(self.skipped, ops.cast(outlier, ms.int32))
        left_out = ops.cast(outlier, ms.float32)
        # Left out whole: it weighs nothing, so the buffer adds none of its gradient, and its loss, an infinite one
        # too, is no concern of the guard's.
        loss = ops.select(keep, loss, ops.zeros_like(loss))
        return loss, grads, weight * ops.cast(keep, ms.float32), ops.stack([sq, left_out])

    def state(self) -> list:
        return [self.seen, self.mean, self.var]


def check_outliers(skip_outliers, outlier_warmup) -> None:
    """Refuses a threshold that is not a positive number, or a warm-up that is not a non-negative int."""
    check_positive_float(skip_outliers, "skip_outliers", allow_none=True)
    check_positive_int(outlier_warmup, "outlier_warmup", minimum=0)


class NoiseScale:
    r"""
    The gradient noise scale of McCandlish et al. (2018), B_simple = tr(Σ) / |G|², from the norms accumulation
    measures for free: the micro-batches' (batch B_small) and the window's (B_big).

    Per window, with :math:`|G_{small}|^2` the mean of the micro-batches' squared norms and :math:`|G_{big}|^2` the
    window's,

    .. math::
        |G|^2 \approx \frac{B_{big}|G_{big}|^2 - B_{small}|G_{small}|^2}{B_{big} - B_{small}}, \qquad
        tr(\Sigma) \approx \frac{|G_{small}|^2 - |G_{big}|^2}{1/B_{small} - 1/B_{big}},

    each smoothed by a bias-corrected exponential moving average (β = 0.99, as gpt-neox), and the scale is their
    ratio. B_small is the harmonic mean of the micro-batches' weights (samples, or tokens under ``"weighted_mean"``):
    :math:`E|g_b|^2 = |G|^2 + tr(\Sigma)/b`, so the mean of norms at unequal sizes is that at their harmonic mean.
    B_big is the window's total weight over all ranks.

    Args:
        beta (float): The moving averages' decay. Default: ``0.99``.

    Attributes:
        windows (int): Windows taken into the averages.
        value (float, optional): The current estimate, None before the first window.
    """

    def __init__(self, beta: float = 0.99) -> None:
        self.beta = beta
        self.windows = 0
        self.g2 = 0.0  # the moving averages, not yet bias-corrected
        self.trace = 0.0

    def update(self, micro_sq_norm_mean: float, b_small: float, window_sq_norm: float, b_big: float) -> Optional[float]:
        """Takes one window: the mean of its micro-batches' squared norms at `b_small`, its own at `b_big`; returns the
        estimate (None while |G|² is not positive)."""
        g2 = (b_big * window_sq_norm - b_small * micro_sq_norm_mean) / (b_big - b_small)
        trace = (micro_sq_norm_mean - window_sq_norm) / (1.0 / b_small - 1.0 / b_big)
        self.windows += 1
        self.g2 = self.beta * self.g2 + (1.0 - self.beta) * g2
        self.trace = self.beta * self.trace + (1.0 - self.beta) * trace
        return self.value

    @property
    def value(self) -> Optional[float]:
        if self.windows == 0:
            return None
        correction = 1.0 - self.beta ** self.windows  # the same for both averages: it cancels in the ratio
        g2, trace = self.g2 / correction, self.trace / correction
        return trace / g2 if g2 > 0 and math.isfinite(g2) else None

    def state(self) -> dict:
        """What a training state saves, to resume the averages exactly."""
        return {"noise_windows": self.windows, "noise_g2": self.g2, "noise_trace": self.trace}

    def load(self, state: dict) -> None:
        """Restores what `state` saved (keys missing: a fresh start)."""
        self.windows = int(state.get("noise_windows", 0))
        self.g2 = float(state.get("noise_g2", 0.0))
        self.trace = float(state.get("noise_trace", 0.0))

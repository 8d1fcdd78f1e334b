"""``"cached"``: gradient caching, for a loss that couples the samples of a batch (docs/cached.md)."""
from __future__ import annotations

from typing import List

from mindspore import nn

from ...graphs.cached import TrainCachedWindowCell, check_cached_options, check_loss_signature, check_same_masks
from ..._validation import ArgumentValueError
from ..options import GuardOptions, StatisticsOptions
from .base import Closer, MicroBatches, Parts, Structure, WindowResult, noting_sizes


class Cached(Structure):
    """One `TrainCachedWindowCell.accumulate_window` per window: pass 1 over the micro-batches, the window's loss and
    its output gradient, pass 2 into the buffer; then the closer's check and its step or clear, chosen on the host.
    Every micro-batch reports the window's one loss, so the logged loss (the "sum" rule's sample-weighted mean of them)
    is that loss. Its one Cell takes windows of any size."""

    @classmethod
    def refuse(cls, network: nn.Cell, loss_fn: nn.Cell, reduction: str, guard: GuardOptions,
               statistics: StatisticsOptions) -> str:
        if loss_fn is None:
            raise ArgumentValueError("{@loss_fn:subject} must be the loss of the whole window's outputs with "
                                     "{structure=}, but got None: gradient caching runs the loss apart from the "
                                     "network.", structure='cached')
        check_loss_signature(loss_fn)
        reduction = check_cached_options(reduction, guard.policy, statistics.norms, statistics.noise_scale,
                                         statistics.skip_outliers)
        check_same_masks(network)
        return reduction

    def __init__(self, parts: Parts, closer: Closer) -> None:
        super().__init__(parts, closer)
        self.cell = TrainCachedWindowCell(parts.network, parts.loss_fn, parts.optimizer, parts.clip_norm,
                                          buffer=parts.buffer, dropout=parts.dropout).set_train()

    def run(self, window: MicroBatches, size: int) -> WindowResult:
        samples: List[int] = []
        micro_batches = list(noting_sizes(window, samples))
        loss = self.cell.accumulate_window(micro_batches)
        return self.result([loss] * len(micro_batches), samples, self.closer.close())


STRUCTURE = Cached

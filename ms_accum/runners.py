"""How each executor structure trains one window: one runner per structure, one method, `train_window`.

Every runner works on the executor's `AccumulationBuffer`; a window that its structure cannot take whole (an epoch's
partial window, or micro-batches of unequal shapes for `TrainWindowCell`) goes through the tutorial's three graphs on
the same buffer, with the same arithmetic.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn

from .buffer import AccumulationBuffer

Window = Sequence[Sequence[Tensor]]  # the window's micro-batches, each the tuple of inputs the network takes


class ThreeGraphs:
    """``"three_graphs"``: `TrainForwardBackward` per micro-batch, then `TrainOptim` and `TrainClear`."""

    def __init__(self, buffer: AccumulationBuffer, forward_backward: nn.Cell, optim: nn.Cell, clear: nn.Cell) -> None:
        self.skipped_windows = buffer.guard.skipped_windows
        self.forward_backward, self.optim, self.clear = forward_backward, optim, clear

    def train_window(self, window: Window) -> Tuple[List, bool]:
        """Trains `window` and closes it: `(losses of its micro-batches, whether the optimizer was applied)`.

        Every Cell answers "applied" the same way, through the guard's count of skipped windows.
        """
        skipped = int(self.skipped_windows.asnumpy())
        losses = self.run(window)
        return losses, int(self.skipped_windows.asnumpy()) == skipped

    def run(self, window: Window) -> List:
        losses = [self.forward_backward(*inputs) for inputs in window]
        self.optim()
        self.clear()
        return losses


class Fused(ThreeGraphs):
    """``"fused"``: one `TrainAccumulationCell` call per micro-batch; it closes the window after the K-th."""

    def __init__(self, buffer: AccumulationBuffer, forward_backward: nn.Cell, optim: nn.Cell, clear: nn.Cell,
                 cell: nn.Cell) -> None:
        super().__init__(buffer, forward_backward, optim, clear)
        self.cell = cell

    def run(self, window: Window) -> List:
        if len(window) < self.cell.accumulate_step:
            return super().run(window)
        return [self.cell(*inputs) for inputs in window]


class Stacked(Fused):
    """``"window"``: the K micro-batches stacked into one `TrainWindowCell` call."""

    def run(self, window: Window) -> List:
        shapes = {tuple(tuple(x.shape) for x in inputs) for inputs in window}
        if len(window) < self.cell.accumulate_step or len(shapes) > 1:
            return ThreeGraphs.run(self, window)
        stacked = [Tensor(np.stack([inputs[i].asnumpy() for inputs in window])) for i in range(len(window[0]))]
        return list(self.cell(*stacked).asnumpy())

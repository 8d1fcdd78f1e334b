"""``"three_graphs"``, the default: the tutorial's three graphs, with the window's choice made on the host."""
from __future__ import annotations

from typing import List

from ...graphs.cells import TrainForwardBackward
from .base import Closer, MicroBatches, Parts, Structure, WindowResult, noting_sizes


class ThreeGraphs(Structure):
    """`TrainForwardBackward` runs each micro-batch; the closer then checks the window and launches the step or the
    clear. As many launches per window as the tutorial's `TrainOptim` and `TrainClear`, the least memory of the
    structures (docs/structures.md)."""

    def __init__(self, parts: Parts, closer: Closer) -> None:
        super().__init__(parts, closer)
        self.forward_backward = TrainForwardBackward(parts.net_with_loss, parts.optimizer, parts.buffer).set_train()
        self.forward_backward.loss_arg = parts.loss_arg

    def run(self, window: MicroBatches, size: int) -> WindowResult:
        samples: List[int] = []
        outputs = [self.forward_backward(*inputs) for inputs in noting_sizes(window, samples)]
        return self.result(outputs, samples, self.closer.close())


STRUCTURE = ThreeGraphs

"""``"fused"``: one graph call per micro-batch, the K-th also checking the window (in data parallel the closer checks
it); the host steps or clears."""
from __future__ import annotations

from typing import Dict, List, Optional

from ...graphs.cells import HostSteppedAccumulationCell
from .base import Closer, MicroBatches, Parts, Structure, WindowResult, noting_sizes


class Fused(Structure):
    """One `HostSteppedAccumulationCell` call per micro-batch; the K-th also checks the window, and the host launches
    the step or the clear on its verdict. In data parallel the Cell does not check (`Structure.checks_in_graph`, its
    `checks`): the closer reduces the buffer in buckets, then checks. K is a graph constant of the Cell: `prepare`
    builds one for the largest K of the run, and a shorter window (an epoch's partial one, a smaller K of a schedule)
    runs through it too, only accumulating, and is closed by the host: a second graph of the network would keep
    activation memory of its own (docs/mindspore.md, each graph's memory)."""

    cell_class = HostSteppedAccumulationCell
    can_check = True

    def __init__(self, parts: Parts, closer: Closer) -> None:
        super().__init__(parts, closer)
        self.cells: Dict[int, HostSteppedAccumulationCell] = {}  # K -> its Cell, kept across runs
        self.cell: Optional[HostSteppedAccumulationCell] = None  # the current run's

    def prepare(self, largest: int) -> None:
        if largest not in self.cells:
            parts = self.parts
            cell = self.cell_class(parts.net_with_loss, parts.optimizer, largest, parts.clip_norm, buffer=parts.buffer,
                                   checks=self.checks_in_graph)
            cell.loss_arg = parts.loss_arg
            self.cells[largest] = cell.set_train()
        self.cell = self.cells[largest]

    def run(self, window: MicroBatches, size: int) -> WindowResult:
        samples: List[int] = []
        outputs, verdicts = zip(*[self.cell(*inputs) for inputs in noting_sizes(window, samples)])
        if self.checks_in_graph and size == self.cell.accumulate_step:  # the K-th call checked the window
            return self.result(outputs, samples, self.closer.follow(verdicts[-1]))
        return self.result(outputs, samples, self.closer.close())


STRUCTURE = Fused

"""``"window"``: a whole window in one graph call; the host steps or clears."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from ...core.statistics import UNMEASURED
from ...graphs.window import HostSteppedWindowCell
from ..records import values
from .base import Closer, MicroBatches, Parts, WindowResult
from .fused import Fused
from .three_graphs import ThreeGraphs


class Window(Fused):
    """The window's micro-batches stacked into one `HostSteppedWindowCell` call, which trains them in a graph-mode loop
    and returns the window's verdict (in data parallel the closer reduces and checks instead, `checks_in_graph`);
    the host then launches the step or the clear. A shorter window is stacked to the
    Cell's K with copies of its last micro-batch, which the Cell does not train (`set_micro_batches`); a window of
    micro-batches of unequal shapes, which cannot be stacked, runs through the three graphs on the same buffer."""

    cell_class = HostSteppedWindowCell

    def __init__(self, parts: Parts, closer: Closer) -> None:
        super().__init__(parts, closer)
        self.unstackable = ThreeGraphs(parts, closer)

    def run(self, window: MicroBatches, size: int) -> WindowResult:
        window = list(window)
        if len({tuple(tuple(x.shape) for x in inputs) for inputs in window}) > 1:
            return self.unstackable.run(window, size)
        padded = window + [window[-1]] * (self.cell.accumulate_step - size)
        stacked = [Tensor(np.stack([inputs[i].asnumpy() for inputs in padded])) for i in range(len(window[0]))]
        self.cell.set_micro_batches(size)
        out, verdict = self.cell(*stacked)
        applied = self.closer.follow(verdict) if self.checks_in_graph else self.closer.close()
        out, norms = self.split(out)
        statistics = [UNMEASURED] * size if norms is None else [values(row) for row in norms.asnumpy()[:size]]
        return WindowResult(self.parts.buffer.reduction.unstack(out)[:size], statistics,
                            [inputs[0].shape[0] for inputs in window], applied)


STRUCTURE = Window

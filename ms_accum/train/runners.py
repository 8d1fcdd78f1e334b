"""Runners: how each structure trains one window on the executor's buffer.

A window's micro-batches arrive lazily and run as they come, so reading the next batch overlaps the graphs still
running. Every window, a partial one too, goes through the structure's own Cell (a second graph of the network would
keep activation memory of its own: docs/mindspore.md, each graph's memory); only a window of unequal micro-batches,
which ``"window"`` cannot stack, goes through the three graphs on the buffer.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn

from ..core.buffer import AccumulationBuffer
from ..core.statistics import UNMEASURED
from .records import values


MicroBatches = Iterable[Sequence[Tensor]]  # one window's micro-batches, each the tuple of inputs the network takes


class ThreeGraphsRunner:
    """``"three_graphs"``: the tutorial's graphs with the window's choice made on the host. `TrainForwardBackward` runs
    each micro-batch; the buffer's `check` graph then makes the window ready in place (reduce, divide, clip) and
    returns the guard's verdict, which the host reads to launch the buffer's `step` or, for a window that is not
    finite, `TrainClear`. As many launches per window as the tutorial's `TrainOptim` and `TrainClear`, and no graph
    with a tensor `if` (docs/structures.md)."""

    def __init__(self, buffer: AccumulationBuffer, forward_backward: nn.Cell, check: nn.Cell, step: nn.Cell,
                 clear: nn.Cell) -> None:
        self.forward_backward, self.check, self.step, self.clear = forward_backward, check, step, clear
        self.reduction = buffer.reduction
        self.split = buffer.statistics.split
        self.skipped = int(buffer.guard.skipped_windows.asnumpy())  # so far: a runner answers from its creation on

    def train_window(self, window: MicroBatches, size: int) -> Tuple[List, List[float], List[int], bool]:
        """Trains the `size` micro-batches of `window` and closes it.

        Returns `(their outputs, their statistics (squared gradient norm, left out; `UNMEASURED` with statistics off),
        their sample counts, whether the optimizer was applied)`.
        """
        samples = []
        outputs, applied = self.run(_noting_sizes(window, samples), size)
        self.skipped += int(not applied)
        outputs = [self.split(output) for output in outputs]
        return ([out for out, _ in outputs], [UNMEASURED if stat is None else values(stat) for _, stat in outputs],
                samples, applied)

    def run(self, window: MicroBatches, size: int) -> Tuple[List, bool]:
        """The outputs of the `size` micro-batches of `window`, and whether the window was applied."""
        outputs = [self.forward_backward(*inputs) for inputs in window]
        return outputs, self.close()

    def close(self) -> bool:
        """Closes the window the buffer holds: `check`, then `step` or `clear` as the verdict says; returns whether the
        optimizer stepped."""
        return self.follow(self.check())

    def follow(self, verdict: Tensor) -> bool:
        """Launches `step` if the window's `verdict` (the buffer's check) lets it be applied, else `clear`; returns
        whether the optimizer stepped."""
        applied = bool(verdict.asnumpy())  # the executor waits for each window's results anyway
        (self.step if applied else self.clear)()
        return applied


class FusedRunner(ThreeGraphsRunner):
    """``"fused"``: one `HostSteppedAccumulationCell` call per micro-batch; the K-th also checks the window, and the
    host launches `step` or `clear` on its verdict. A shorter window (an epoch's partial one) runs through the same
    Cell, which then only accumulates, and is closed by the host as the three graphs close theirs: a second graph of
    the network, `TrainForwardBackward`, would keep activation memory of its own (docs/mindspore.md, each graph's
    memory)."""

    def __init__(self, buffer: AccumulationBuffer, forward_backward: nn.Cell, check: nn.Cell, step: nn.Cell,
                 clear: nn.Cell, cell: nn.Cell) -> None:
        super().__init__(buffer, forward_backward, check, step, clear)
        self.cell = cell

    def run(self, window: MicroBatches, size: int) -> Tuple[List, bool]:
        outputs, verdicts = zip(*[self.cell(*inputs) for inputs in window])  # `HostSteppedAccumulationCell`s
        if size < self.cell.accumulate_step:
            return list(outputs), self.close()
        return list(outputs), self.follow(verdicts[-1])  # the K-th call checked the window


class WindowRunner(FusedRunner):
    """``"window"``: the window's micro-batches stacked into one `HostSteppedWindowCell` call, which returns the
    window's verdict; the host then launches `step` or `clear`, as the three graphs do. A shorter window is stacked to
    the Cell's K with copies of its last micro-batch, which the Cell does not train (`set_micro_batches`); a window of
    unequal micro-batches, which cannot be stacked, runs through the three graphs."""

    def run(self, window: MicroBatches, size: int) -> Tuple[List, bool]:
        window = list(window)
        if len({tuple(tuple(x.shape) for x in inputs) for inputs in window}) > 1:
            return ThreeGraphsRunner.run(self, window, size)
        padded = window + [window[-1]] * (self.cell.accumulate_step - size)
        stacked = [Tensor(np.stack([inputs[i].asnumpy() for inputs in padded])) for i in range(len(window[0]))]
        self.cell.set_micro_batches(size)
        out, verdict = self.cell(*stacked)
        applied = self.follow(verdict)
        out, norms = self.split(out)
        outputs = self.reduction.unstack(out)[:size]
        # Per micro-batch, as the other Cells return them: with its statistics when they were measured.
        return outputs if norms is None else list(zip(outputs, norms.asnumpy()[:size])), applied


class CachedRunner(ThreeGraphsRunner):
    """``"cached"``: gradient caching, one `TrainCachedWindowCell.train_window` per window (pass 1 over the
    micro-batches, the window's loss and its output gradient, pass 2 into the buffer, then the window's check and
    step or clear, chosen on the host as the three graphs choose). Every micro-batch reports the window's one loss,
    so the logged loss (the "sum" rule's sample-weighted mean of them) is that loss."""

    def __init__(self, buffer: AccumulationBuffer, cell: nn.Cell) -> None:
        super().__init__(buffer, None, cell.check, cell.step, cell.clear)
        self.cell = cell

    def run(self, window: MicroBatches, size: int) -> Tuple[List, bool]:
        micro_batches = list(window)
        loss, applied = self.cell.train_window(micro_batches)
        return [loss] * len(micro_batches), applied


def _noting_sizes(window: MicroBatches, samples: List[int]) -> MicroBatches:
    for inputs in window:
        samples.append(inputs[0].shape[0])
        yield inputs

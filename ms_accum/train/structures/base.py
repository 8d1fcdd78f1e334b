"""What every structure shares: the parts it trains (`Parts`), how a window is closed (`Closer`), what a window trained
returns (`WindowResult`), and the protocol a structure implements (`Structure`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence

from mindspore import Tensor, nn

from ...core.buffer import AccumulationBuffer
from ...core.dropout import DropoutStreams
from ...core.parallel import InPlaceAllReduce, in_buckets
from ...core.statistics import UNMEASURED
from ...graphs.cells import TrainClear, TrainingState, _CheckWindow, _StepWindow
from ..options import GuardOptions, StatisticsOptions
from ..records import values

MicroBatches = Iterable[Sequence[Tensor]]  # one window's micro-batches, each the tuple of a batch's columns


@dataclass(frozen=True)
class Parts:
    """What the executor built from the user's arguments, all checked at its door: every structure trains these.

    `net_with_loss` takes a micro-batch's columns and returns its loss (`WithLossCell` for two columns); `buffer` is
    the one window state every structure and the checkpoints share."""

    network: nn.Cell
    loss_fn: nn.Cell
    net_with_loss: nn.Cell
    optimizer: nn.Optimizer
    buffer: AccumulationBuffer
    clip_norm: Optional[float]
    dropout: DropoutStreams  # the network's dropout state, kept beside it (`ms_accum.core.dropout`)
    loss_arg: str = "loss_fn"  # the argument that gave the loss, which a loss that does not fit is said to be


@dataclass(frozen=True)
class WindowResult:
    """One window trained and closed, as every structure's `run` returns it, one entry per micro-batch trained.

    Attributes:
        outputs (list): Each micro-batch's network output: its loss (under ``"weighted_mean"``, `(loss, weight)`).
        statistics (list): Each micro-batch's ``(squared gradient norm, left out)`` as float64 values; `UNMEASURED`
            with statistics off.
        samples (list[int]): Each micro-batch's sample count.
        applied (bool): Whether the optimizer stepped (False: the window was skipped as not finite).
    """

    outputs: List
    statistics: List
    samples: List[int]
    applied: bool


class Closer:
    """Closes the window the buffer holds: the `check` graph makes it ready in place (reduced over the ranks, divided,
    unscaled, clipped) and returns the guard's verdict; the host reads it and launches the `step` graph or, for a window
    that is not finite, `TrainClear`. No graph with a tensor `if` (docs/mindspore.md, a tensor `if` costs a wait).

    In data parallel the buffer is first all-reduced in buckets of a few MiB, each in its own launch, so one bucket's
    reduced copies are alive at a time (`ms_accum.core.parallel.CountSums`); a structure's graph then leaves the check
    to the closer (`Structure.checks_in_graph`). How the optimizer steps is the closer's alone (`step_cell`, `apply`),
    and so is what a training-state file holds (`training_state`): `ms_accum.train.sharding.ShardedCloser` steps each
    rank's part."""

    def __init__(self, parts: Parts) -> None:
        self.buffer = parts.buffer
        self.reduce = InPlaceAllReduce() if parts.buffer.reduced_on_host else None
        # Nothing to reduce from the host in one process, or when the graphs reduce the buffer themselves.
        self.buffer_buckets = in_buckets(parts.buffer.grad_sum) if self.reduce is not None else []
        self.check = _CheckWindow(parts.buffer, parts.clip_norm).set_train()
        self.step = self.step_cell(parts).set_train()
        self.clear = TrainClear(parts.buffer).set_train()

    def step_cell(self, parts: Parts) -> nn.Cell:
        """The graph that steps the optimizer on the window `check` accepted, and closes it."""
        return _StepWindow(parts.optimizer, parts.buffer)

    def training_state(self, parts: Parts) -> nn.Cell:
        """Every Parameter the training owns, which training-state files save and load (`TrainingState`)."""
        return TrainingState(parts.net_with_loss, parts.optimizer, parts.buffer, parts.dropout)

    def close(self) -> bool:
        """The buffer reduced (in data parallel), `check`, then `step` or `clear`; returns whether the optimizer
        stepped."""
        self.all_reduce(self.buffer_buckets)
        return self.follow(self.check())

    def all_reduce(self, buckets) -> None:
        """Each bucket's tensors summed over the ranks in place, a launch per bucket, in the same order on every
        rank."""
        for bucket in buckets:
            self.reduce(*bucket)

    def follow(self, verdict: Tensor) -> bool:
        """`apply` if the window's `verdict` (the buffer's check) lets it be applied, else `clear`."""
        applied = bool(verdict.asnumpy())  # the one value the window needs at once: which graph runs next
        if applied:
            self.apply()
        else:
            self.clear()
        return applied

    def apply(self) -> None:
        """Steps the optimizer on the checked window and closes it."""
        self.step()


class Structure:
    """How the executor runs one window's micro-batches on its buffer (docs/structures.md).

    A structure is one module of `ms_accum.train.structures` named as the structure, whose `STRUCTURE` is a subclass:
    it owns its Cells (built in `__init__` or, for those whose K is a graph constant, in `prepare`), its refusals
    (`refuse`, before the buffer is built) and its loop (`run`). The executor looks it up by name and knows nothing
    else of it.

    Args:
        parts (Parts): What it trains.
        closer (Closer): How it closes a window.
    """

    can_check = False  # whether its graph can check a window itself (True: "fused", "window")

    def __init__(self, parts: Parts, closer: Closer) -> None:
        self.parts, self.closer = parts, closer
        self.split = parts.buffer.statistics.split
        # Where a window is checked, decided here once and given to the Cells: in the structure's graph when it can,
        # unless the host reduces the buffer first (data parallel: the closer reduces it in buckets, then checks).
        self.checks_in_graph = self.can_check and not parts.buffer.reduced_on_host

    @classmethod
    def refuse(cls, network: nn.Cell, loss_fn: nn.Cell, reduction: str, guard: GuardOptions,
               statistics: StatisticsOptions) -> str:
        """Refuses, before anything is built, the options the structure cannot make exact; returns the buffer's
        reduction (the user's, unless the structure needs its own)."""
        return reduction

    def prepare(self, largest: int) -> None:
        """Builds what the run needs for windows of up to `largest` micro-batches (before any window trains)."""

    def reset(self) -> None:
        """Empties the buffer's window before a run, if one is open (its counters say: a closed window is zeros). The
        clear's graph, compiled only then, would otherwise keep memory of its own (docs/mindspore.md, each graph's
        memory)."""
        if self.parts.buffer.micro_batch_count.asnumpy() or self.parts.buffer.num_samples.asnumpy():
            self.closer.clear()

    def run(self, window: MicroBatches, size: int) -> WindowResult:
        """Trains the `size` micro-batches of `window` and closes it."""
        raise NotImplementedError

    def result(self, outputs: Sequence, samples: List[int], applied: bool) -> WindowResult:
        """The window's result from its Cells' `outputs` (each with its statistics when they are measured)."""
        outputs = [self.split(output) for output in outputs]
        return WindowResult([out for out, _ in outputs],
                            [UNMEASURED if stat is None else values(stat) for _, stat in outputs], samples, applied)


def noting_sizes(window: MicroBatches, samples: List[int]) -> Iterator[Sequence[Tensor]]:
    """The micro-batches of `window`, each one's sample count appended to `samples` as it is read (lazily: the host
    reads the next batch while the device runs)."""
    for inputs in window:
        samples.append(inputs[0].shape[0])
        yield inputs

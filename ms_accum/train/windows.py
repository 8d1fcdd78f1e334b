"""Windows: which batches of which epoch form each window, and its K, the same in a fresh run and a resumed one.

A window's K is decided when it opens, from the global samples consumed before it (`KPolicy.open_window`); planned
ahead, it is only looked at (`KPolicy.peek`). An epoch's last window may be partial. Nothing here trains: the executor
consumes the windows.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple

from mindspore.dataset import Dataset

from .._validation import door
from .kpolicy import KPolicy
from .schedule import AccumulationSchedule, ScheduleLike


@dataclass
class Position:
    """Where a run is: enough, with the dataset's seed, to continue it exactly (saved in training states).

    A step is a window closed, whether the optimizer applied it or the guard skipped it as not finite: what
    `StepRecord.step`, `save_every` and the files' ``{step:09d}`` count. A dropped partial window is no step."""

    epoch: int = 1
    batch: int = 0  # batches of `epoch` already read
    step: int = 0  # windows closed
    dropped_windows: int = 0


@door("count_windows")
def count_windows(num_batches: int, epochs: int, accumulate_step: ScheduleLike, per_batch: int,
                  partial_window: str = "apply") -> int:
    """The optimizer steps of `epochs` epochs of `num_batches` batches of `per_batch` global samples, K following
    `accumulate_step` (an int or a schedule, `ms_accum.train.schedule`), as `train_process` trains them: a partial
    last window of an epoch counts when it is applied (``partial_window="apply"``), not when it is dropped."""
    schedule = AccumulationSchedule(accumulate_step, arg_name="accumulate_step")
    return sum(size == k or partial_window == "apply"
               for k, size, _ in _planned_windows(epochs, num_batches, schedule, per_batch, Position()))


def _epoch_windows(epoch: int, start: int, num_batches: int, k_at: Callable[[int], Optional[int]],
                   per_batch: int) -> Iterator[Tuple[Optional[int], int, int]]:
    """`(K, size, samples consumed when it opens)` of the windows of `epoch` from its batch `start` on, K from `k_at`
    at each opening; the last may be partial (size < K). A K of None (not known ahead) ends them: ``(None, 0, ...)``."""
    while start < num_batches:
        opened_at = _samples_read(epoch, start, num_batches, per_batch)
        k = k_at(opened_at)
        if k is None:
            yield None, 0, opened_at
            return
        size = min(k, num_batches - start)
        yield k, size, opened_at
        start += size


def _samples_read(epoch: int, batch: int, num_batches: int, per_batch: int) -> int:
    """Global samples consumed once `batch` batches of `epoch` are read (`ms_accum.train.schedule`: every batch of every
    rank counts, `per_batch` samples over all ranks)."""
    return ((epoch - 1) * num_batches + batch) * per_batch


def _skipped(epoch: int, num_batches: int, position: Position) -> int:
    """Batches of `epoch` that a run resumed at `position` has trained already (all of an earlier epoch's)."""
    return num_batches if epoch < position.epoch else position.batch if epoch == position.epoch else 0


def _planned_windows(epochs: int, num_batches: int, policy: KPolicy, per_batch: int,
                     position: Position) -> Optional[List[Tuple[int, int, int]]]:
    """`(K, size, samples consumed when it opens)` of every window a run opens from `position` on, as `_windows` opens
    them, without reading data or deciding anything (`KPolicy.peek` at each: a callable schedule is evaluated there);
    None if some window's K is not known ahead."""
    planned = []
    for epoch in range(1, epochs + 1):
        for k, size, opened_at in _epoch_windows(epoch, _skipped(epoch, num_batches, position), num_batches,
                                                 policy.peek, per_batch):
            if k is None:
                return None
            planned.append((k, size, opened_at))
    return planned


def _windows(dataset: Dataset, epochs: int, num_batches: int, policy: KPolicy, per_batch: int,
             position: Position) -> Iterator[Tuple[int, int, Iterator, int]]:
    """`(K, size, micro-batches, samples consumed when it opens)` of each window, epoch by epoch (an epoch's last may
    be partial: size < K), from `position` on. K is decided when the window opens (`KPolicy.open_window`), as the
    caller asks for it: after the caller trained the window before.

    The micro-batches are read lazily: consume them before asking for the next window. `position.epoch` and
    `position.batch` follow the batches read. Batches before the position (a resumed run) are read but not yielded,
    so the data order stays that of the uninterrupted run."""
    iterator = dataset.create_tuple_iterator(num_epochs=epochs)
    resumed_at = Position(**vars(position))
    for epoch in range(1, epochs + 1):
        skip = _skipped(epoch, num_batches, resumed_at)
        position.epoch, position.batch = epoch, 0
        batches = _EpochBatches(iterator, position)
        for _ in itertools.islice(batches, skip):
            pass
        for k, size, opened_at in _epoch_windows(epoch, skip, num_batches, policy.open_window, per_batch):
            yield k, size, batches.window(size), opened_at
        for _ in batches:  # the end of the epoch, so the next one starts
            pass


class _EpochBatches:
    """One epoch's batches from the dataset's iterator, counted in `position.batch` as they are used.

    A window's micro-batches end by reading the next window's first batch ahead: the host reads it while the device
    still runs the graphs just launched, instead of after the window's verdict, when the device has nothing queued
    (docs/structures.md, why the default decides on the host)."""

    def __init__(self, iterator, position: Position) -> None:
        self.iterator, self.position = iterator, position
        self.ahead = None  # the batch read ahead, if any
        self.done = False  # the epoch's batches are all read

    def __iter__(self) -> "_EpochBatches":
        return self

    def __next__(self):
        self._read()
        if self.ahead is None:
            raise StopIteration
        batch, self.ahead = self.ahead, None
        self.position.batch += 1
        return batch

    def _read(self) -> None:
        """Reads the next batch ahead, unless one is read already or the epoch's batches are all read."""
        if self.ahead is None and not self.done:
            self.ahead = next(self.iterator, None)
            self.done = self.ahead is None

    def window(self, size: int) -> Iterator:
        """The next `size` batches; once they are used, the batch after them is read ahead."""
        yield from itertools.islice(self, size)
        self._read()

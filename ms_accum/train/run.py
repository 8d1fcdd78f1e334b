"""One call of `GradientAccumulation.train_process`: its arguments checked, its windows, where it is in the data, what
it records and logs, and the files it saves."""
from __future__ import annotations

import math
import os
import warnings
from typing import Iterator, Optional, Tuple, Union

import numpy as np
from mindspore import nn
from mindspore.dataset import (BatchDataset, BucketBatchByLengthDataset, Dataset, GeneratorDataset, PaddedBatchDataset,
                               config as ds_config)

from .._choices import PARTIAL_WINDOWS
from .._mindspore import listed_rates
from .._validation import (ArgumentValueError, ArgumentWarning, Message, check_isinstance, check_positive_int,
                           check_value_in, check_writable_dir)
from ..core.columns import check_columns
from ..core.parallel import DataParallelInfo
from ..core.statistics import NoiseScale
from .distributed import check_same_on_all_ranks, decided_together, gather_ints
from .fingerprint import built_with
from .adaptive import AdaptiveK
from .kpolicy import KPolicy
from .lr import RunRate
from .options import Checkpoints, GuardOptions, LogOptions, StatisticsOptions
from .records import StepRecord, TrainResult, WindowFigures, WindowLog
from .resume import Position, StateCheckpoints
from .schedule import AccumulationSchedule
from .structures import Parts, WindowResult
from .validation import Evaluator, Validation
from .windows import _planned_windows, _samples_read, _windows


class Run:
    """One run over `dataset` of what the executor trains, every argument checked before anything compiles; it holds
    the run's own state: its position, records, noise-scale estimate and best score.

    `start` resumes, if asked, and returns the windows; for each, `open` and `close` (or `drop`) keep the position,
    the records, the log and the training-state files; `finish` saves the final checkpoint.

    Args:
        parts (Parts): What the executor trains (the network, its loss, the optimizer, the buffer).
        state (nn.Cell): The training state its files hold (`Closer.training_state`).
        parallel (DataParallelInfo): This rank and the number of ranks; None stand-alone.
        guard (GuardOptions): The executor's, for a window that is not finite.
        statistics (StatisticsOptions): The executor's, for what is measured (the noise scale is the run's own).
        epoch, dataset, partial_window, checkpoints, log, validation: `train_process`'s arguments.
        schedule (Union[AccumulationSchedule, AdaptiveK]): K, `train_process`'s `mini_steps`; the run holds its
            `KPolicy` (`for_run`: a schedule itself, an `AdaptiveK` a `Controller` of its own noise-scale estimate).
    """

    def __init__(self, parts: Parts, state: nn.Cell, parallel: Optional[DataParallelInfo], guard: GuardOptions,
                 statistics: StatisticsOptions, epoch: int, dataset: Dataset,
                 schedule: Union[AccumulationSchedule, AdaptiveK],
                 partial_window: str, checkpoints: Optional[Checkpoints], log: LogOptions,
                 validation: Optional[Tuple[Dataset, Validation]] = None) -> None:
        self.parts, self.state, self.parallel, self.guard = parts, state, parallel, guard
        self.buffer = parts.buffer
        self.measured = statistics.measured  # whether the gradient norms are measured
        self.writes = parallel is None or parallel.is_main  # rank 0 alone prints and saves
        # A rate that K would scale but cannot is refused first, before `_check` makes the checkpoints' directory.
        self.rate = RunRate(parts.optimizer, schedule.scales_lr)
        self.epoch, self.dataset = epoch, dataset
        self.partial_window, self.checkpoints = partial_window, checkpoints
        self.num_batches = self._check(checkpoints)
        # Global samples in one micro-batch of every rank; the ranks' micro-batches may differ in size.
        self.per_batch = (dataset.get_batch_size() if parallel is None else sum(gather_ints(dataset.get_batch_size())))
        # Every window's K, looked ahead at (`peek`) and decided (`open_window`) through one contract.
        self.k: KPolicy = schedule.for_run(self.per_batch)
        # The run's own estimate (`ms_accum.core.statistics`), continued by its resumed runs (`start`): the one K
        # decides from, smoothed as it says, if it decides from one.
        self.noise_scale = (self.k.noise if self.k.noise is not None else
                            NoiseScale() if statistics.noise_scale else None)
        self.settings = settings = {
            **self.k.describe(self.per_batch), "partial_window": partial_window, "num_batches": self.num_batches,
            "data_seed": ds_config.get_seed(), "rank_batch_size": dataset.get_batch_size(),
            "world_size": 1 if parallel is None else parallel.group_size, "global_micro_batch": self.per_batch,
            **built_with(parts.optimizer, parts.network, dataset)}
        if settings["accumulate_step"] > self.num_batches:  # a fixed K (0 when K changes) above an epoch's batches
            done = {"apply": "applied", "drop": "dropped"}[partial_window]
            warnings.warn(ArgumentWarning("{@mini_steps} ({k}) is larger than an epoch's {batches} batches: every "
                                          "window is partial and is {done} at the end of the epoch.",
                                          k=settings["accumulate_step"], batches=self.num_batches, done=done),
                          stacklevel=4)  # Run, train_process, its door, the user
        given = checkpoints or Checkpoints()
        self.states = StateCheckpoints(state, None if checkpoints is None else os.fspath(given.directory),
                                       given.name, settings, given.metadata, given.save_every, given.keep_last,
                                       self.writes, self.k, given.format)
        self.verbose = log.verbose and self.writes
        self.log = WindowLog(log.every, self.verbose, log.on_step, guard.stop_on_nonfinite,
                             guard.loss_scaler is not None)
        self.position, self.result, self.largest, self.lr_scale = Position(), TrainResult(), 1, 1.0
        self.eval_dataset, self.evaluator = (None, None) if validation is None else (
            validation[0], Evaluator(parts.network, parts.loss_fn, validation[1]))

    def _check(self, checkpoints: Optional[Checkpoints]) -> int:
        """The arguments that only a run can check; returns the epoch's batch count."""
        check_positive_int(self.epoch, "epoch")
        check_isinstance(self.dataset, "train_dataset", Dataset)
        check_value_in(self.partial_window, "partial_window", PARTIAL_WINDOWS)
        _check_batched(self.dataset)
        check_columns(self.state.network, self.dataset.get_col_names())
        num_batches = self.dataset.get_dataset_size()
        if self.parallel is not None:
            # Every window closes with a collective: a rank with fewer batches would leave the others waiting.
            check_same_on_all_ranks(num_batches, "the number of batches of 'train_dataset'")
        if num_batches <= 0:
            raise ArgumentValueError("{@train_dataset:subject} must not be empty, but it has no batches.")
        if checkpoints is not None:  # rank 0 writes, yet every rank decides alike before any waits for it
            decided_together(lambda: check_writable_dir(checkpoints.directory, "directory"), self.parallel,
                             "the checkpoint directory")
        return num_batches

    def start(self) -> Iterator[Tuple[int, int, Iterator, int]]:
        """Resumes (if asked) and works out every window's K before anything trains (a callable's bad value fails
        here); returns the windows, `(K, size, micro-batches, samples consumed when it opens)`."""
        resume = None if self.checkpoints is None else self.checkpoints.resume
        self.position, resumed_from = decided_together(lambda: self.states.resume(resume, self.epoch), self.parallel,
                                                       "the training state to resume from")
        if self.noise_scale is not None:
            self.noise_scale.load(self.states.resumed)
        self.k.load(self.states.resumed)
        if self.evaluator is not None:  # the best score so far, continued by resumed runs
            self.evaluator.best = float(self.states.resumed.get("best_score", math.nan))
            if not math.isnan(self.evaluator.best) and os.path.isfile(self._path("-best")):
                self.result.best_checkpoint = self._path("-best")
        self.states.extra = self._extra
        if self.parallel is not None and resume not in (None, False):
            check_same_on_all_ranks(self.position.step, "the optimizer step resumed from")
        planned = _planned_windows(self.epoch, self.num_batches, self.k, self.per_batch, self.position)
        if planned is None:  # some K is known only when its window opens: the run's last window is the last batch's
            self.largest, self.last_step = self.k.k_max, None
        else:
            self.largest = max((k for k, _, _ in planned), default=1)
            # The run's last step, scored before `on_step` sees it: every window from here on but the dropped ones.
            self.last_step = self.position.step + sum(size == k or self.partial_window == "apply"
                                                      for k, size, _ in planned)
            self._check_rates(self.last_step - self.position.step)
        if self.noise_scale is not None and self.parallel is None and self.largest == 1:
            given = self.settings["accumulate_step"] or "a schedule that is 1 in every window of this run"
            raise ArgumentValueError("{@mini_steps:subject} must be at least 2 in some window with {noise_scale=} on "
                                     "one rank: the noise scale compares the micro-batch's gradient with the "
                                     "window's, and with one micro-batch per window they are one batch size, but got "
                                     "{given}.", given=given, noise_scale=True)
        guard = self.buffer.guard
        self.result = TrainResult(dropped_windows=self.position.dropped_windows, resumed_from=resumed_from,
                                  skipped_windows=int(guard.skipped_windows.asnumpy()),
                                  skipped_micro_batches=int(guard.skipped_micro_batches.asnumpy()))
        return _windows(self.dataset, self.epoch, self.num_batches, self.k, self.per_batch, self.position)

    def _check_rates(self, steps: int) -> None:
        """Refuses a list of learning rates, one per optimizer step, shorter than the steps this run will take
        (MindSpore would fail inside its graph when the list runs out, after training began)."""
        rates = listed_rates(self.parts.optimizer)
        taken = int(self.parts.optimizer.global_step.asnumpy().item())  # by an earlier run, or the state resumed
        if rates is not None and rates < taken + steps:
            already = Message(" after the {taken} it has taken", taken=taken) if taken else ""
            raise ArgumentValueError("{@optimizer:subject} has a list of {rates} learning rates, one per optimizer "
                                     "step, but this run takes {steps} optimizer steps{already}: give at least "
                                     "{needed} rates, or fewer {@epoch}.", rates=rates, steps=steps, already=already,
                                     needed=taken + steps)

    def drop(self, window: Iterator) -> None:
        """A partial window dropped: read, not trained, so the data order stays the same."""
        for _ in window:
            pass
        self.position.dropped_windows += 1
        self.result.dropped_windows += 1

    def open(self, opened_at: int, k: int) -> None:
        """A window of K opens after `opened_at` global samples."""
        self.states.window_opened(opened_at, k)
        # The factor AdaptiveK's rule puts on the rate, 1 otherwise; recorded when the window closes.
        self.lr_scale = self.k.lr_scale(k)
        self.rate.set(opened_at, self.lr_scale)

    def close(self, k: int, trained: WindowResult) -> bool:
        """A window of K `trained`: its record made, scored when due, logged and kept; its training state saved when
        due. Returns whether the run stops here (`on_step` returned True: early stopping)."""
        self.position.step += 1
        record, figures = self._record(trained, k)
        # Whether the window is the run's last (when K is not known ahead, as with AdaptiveK: the last batch read; a
        # partial window dropped after it leaves it unscored until `finish`).
        last = (self.position.step == self.last_step if self.last_step is not None else
                self.position.epoch == self.epoch and self.position.batch == self.num_batches)
        if self.evaluator is not None and self.evaluator.due(self.position.step, last):
            self._score(record)
        stop = bool(self.log.window(record, figures, self.result))
        self.states.window_closed(self.position, stopping=stop)
        self.result.stopped = stop
        return stop

    def _score(self, record: StepRecord) -> None:
        """The validation scores after `record`'s window, in it; the best network saved when it improved."""
        record.validation = self.evaluator.score(self.eval_dataset, self.buffer.reducer)
        if self.verbose:
            scores = " ".join(f"{name} {value:.6f}" for name, value in record.validation.items())
            print(f"epoch: {record.epoch} step: {record.step} validation {scores}", flush=True)
        if self.evaluator.improved(record.validation) and self.checkpoints is not None and self.writes:
            self.result.best_checkpoint = self._path("-best")
            self.states.save(self.parts.network, self._path("-best"), {"step": record.step, **record.validation})

    def _path(self, suffix: str = "") -> str:
        """The file of the run's checkpoint name and format, `suffix` after the name ("-best": the best network)."""
        given = self.checkpoints
        return os.path.join(os.fspath(given.directory), f"{given.name}{suffix}.{given.format}")

    def _extra(self) -> dict:
        """More of the run's state, saved with every training-state file."""
        extra = {} if self.noise_scale is None else self.noise_scale.state()
        extra.update(self.k.state())
        if self.evaluator is not None and not math.isnan(self.evaluator.best):
            extra["best_score"] = self.evaluator.best
        return extra

    def finish(self, network: nn.Cell) -> TrainResult:
        """The last window scored if it was not (a run stopped by `on_step`), the final checkpoint (the network alone)
        saved, if any; the run's result."""
        last = self.result.steps[-1] if self.result.steps else None
        if self.evaluator is not None and last is not None and last.validation is None:
            self._score(last)
        if self.checkpoints is not None and self.writes:
            described = self.k.describe(self.per_batch, self.states.history)
            meta = {"epoch": self.epoch, "step": self.position.step, "accumulate_step": described["accumulate_step"],
                    "global_batches": described["global_batches"], **(self.checkpoints.metadata or {})}
            if described["adaptive_k"]:  # the settings K was decided by
                meta["adaptive_k"] = described["adaptive_k"]
            self.result.checkpoint = self.states.save(network, self._path(), meta)
        return self.result

    def _record(self, trained: WindowResult, k: int):
        """The window's `StepRecord`, added to the result, and the figures it was made of."""
        position, result, buffer, applied = self.position, self.result, self.buffer, trained.applied
        window = WindowFigures(buffer.reduction, buffer.reducer, trained.outputs, trained.statistics, trained.samples)
        result.skipped_windows += int(not applied)
        if buffer.leaves_out:  # read back only what can change: the window's verdict was the one value it needed
            result.skipped_micro_batches = int(buffer.guard.skipped_micro_batches.asnumpy())
        window_sq_norm = float(buffer.statistics.window_sq_norm.asnumpy()) if self.measured else np.nan
        noise = None
        if self.noise_scale is not None and applied and window.has_two_batch_sizes():
            noise = self.noise_scale.update(window.micro_sq_norm, window.micro_weight, window_sq_norm, window.weight)
            self.k.observe(window.weight, len(trained.outputs))
        outliers = [position.batch - len(trained.outputs) + int(i) for i in window.left_out_indices]
        loss_scale = 1.0 if self.guard.loss_scaler is None else float(buffer.guard.loss_scale.asnumpy())  # as updated
        record = StepRecord(
            epoch=position.epoch, step=position.step, loss=window.loss, micro_batches=len(trained.outputs),
            samples=window.samples, skipped=not applied, loss_scale=loss_scale, accumulate_step=k,
            samples_consumed=_samples_read(position.epoch, position.batch, self.num_batches, self.per_batch),
            grad_norm=float(np.sqrt(window_sq_norm)) if self.measured else None,
            micro_batch_grad_norms=window.micro_batch_norms() if self.measured else [], noise_scale=noise,
            outliers=outliers, lr_scale=self.lr_scale)
        result.steps.append(record)
        result.outliers += [(position.epoch, batch) for batch in outliers]
        return record, window


# MindSpore's batching operations: a pipeline without one yields single samples, which no network takes as a batch.
_BATCHING = (BatchDataset, PaddedBatchDataset, BucketBatchByLengthDataset)


def _check_batched(dataset: Dataset) -> None:
    """Refuses, where the run first looks at it, a dataset of single samples: no batching operation in its pipeline,
    read from a source that slices samples (a `GeneratorDataset` of the user's may yield whole batches itself)."""
    nodes, batched, sliced = [dataset], False, False
    while nodes:
        node = nodes.pop()
        batched = batched or isinstance(node, _BATCHING)
        sliced = sliced or (not node.children and type(node) is not GeneratorDataset)
        nodes.extend(node.children)
    if sliced and not batched:
        raise ArgumentValueError("{@train_dataset:subject} must yield micro-batches, but it yields single samples: "
                                 "batch it with {batch}, B the micro-batch size.", batch="train_dataset.batch(B)")

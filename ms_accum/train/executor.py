"""GradientAccumulation: the training executor of MindSpore's Cell-graph tutorial, exact, lean and resumable."""
from __future__ import annotations

import os
import warnings
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
from mindspore import nn
from mindspore.dataset import Dataset, config as ds_config

from .._validation import (check_callable, check_isinstance, check_positive_float, check_positive_int,
                          check_value_in, check_writable_dir)
from .._choices import AUTO_STRUCTURE, OUTLIER_WARMUP, PARTIAL_WINDOWS, STRUCTURES
from ..core.buffer import AccumulationBuffer, check_buffer_dtype
from ..graphs.cells import (HostSteppedAccumulationCell, TrainClear, TrainForwardBackward, TrainingState, _CheckWindow,
                            _StepWindow)
from ..core.guard import LossScaler, check_policy_fits, sparse_gradient_cell
from ..core.losses import window_reduction
from .lr import SamplesLR
from ..core.parallel import data_parallel_info
from .distributed import check_same_on_all_ranks, gather_ints
from .plan import Plan
from .recompute import recompute_cells
from .records import StepRecord, TrainResult, WindowFigures, WindowLog
from .resume import Position, StateCheckpoints
from .runners import CachedRunner, FusedRunner, ThreeGraphsRunner, WindowRunner
from .windows import _planned_windows, _samples_read, _windows
from .schedule import AccumulationSchedule, ScheduleLike
from ..core.statistics import NoiseScale, check_outliers
from ..runtime import check_cpu_kernels
from ..graphs.window import HostSteppedWindowCell
from ..graphs.cached import TrainCachedWindowCell, check_cached_options, check_loss_signature, check_same_masks


class GradientAccumulation:
    r"""
    Trains `network` with gradient accumulation: one optimizer step per window of `mini_steps` micro-batches.

    The executor of MindSpore's Cell-graph tutorial, with its signature, but each update equals one step on the
    concatenated window (the tutorial's steps are K times too large). The structure is chosen once; every structure
    trains on one `AccumulationBuffer`, so a window that ``"window"`` cannot stack (unequal micro-batches) runs through
    the three graphs on that state.
    Its optimizer steps are counted in windows closed, applied or skipped as not finite (`StepRecord.step`,
    `save_every`, the training-state files).

    Data parallel (MindSpore's ``ParallelMode.DATA_PARALLEL``, e.g. after `ms_accum.init_data_parallel`
    under `msrun`) is detected when the executor is built: each window is all-reduced once, so an update equals one
    step on the global batch. Give every rank its own shard with the same number of batches; rank 0 prints and saves.

    Args:
        network (nn.Cell): The network, returning logits.
        loss_fn (nn.Cell): The loss, reducing the batch to a scalar: a mean (e.g.
            `nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")`) or a sum.
        optimizer (nn.Optimizer): The optimizer over `network`'s parameters.
        clip_norm (float, optional): Clip each window's gradient to this global norm. Default: ``None``.
        reduction (str, optional): How the window combines its micro-batches (see `AccumulationBuffer`): ``"mean"``
            (sample-weighted), ``"sum"`` (the plain sum), or ``"weighted_mean"``: `loss_fn` returns ``(loss, weight)``,
            e.g. `TokenCrossEntropy`'s mean over real tokens and their count, and the window is the mean over all its
            tokens. Default: ``None``, what `loss_fn` says it computes: ``"sum"`` for a MindSpore loss built with
            ``reduction="sum"`` (the window's update is then one step on the concatenated batch with that summing
            loss), else ``"mean"``.
        structure (str): How micro-batches run. ``"three_graphs"``: the tutorial's `TrainForwardBackward` per
            micro-batch, then the window's check and its step (or clear) chosen on the host, least memory;
            ``"fused"``: one call per micro-batch (`HostSteppedAccumulationCell`, then the step on the host),
            faster, more memory; ``"window"``: a whole window in one graph call (`HostSteppedWindowCell`, then the
            step on the host), fastest, most memory of the three. ``"auto"`` (default) chooses by memory first:
            ``"three_graphs"``. ``"cached"``: gradient caching (`TrainCachedWindowCell`, docs/cached.md) for a
            loss that couples the samples of a batch (contrastive): `network` maps a micro-batch to its outputs and
            ``loss_fn(outputs, labels)`` runs once per window on all of them; the update equals one step on the
            concatenated batch. It takes reduction ``"mean"`` or ``"sum"`` (both: the window's loss as `loss_fn`
            computes it), ``policy="skip_window"``, no statistics or outlier skipping.
        policy (str): A window whose gradient or loss is not finite is never applied. ``"skip_window"``
            (default) skips the whole window; ``"skip_microbatch"`` leaves out the bad micro-batches and takes the
            mean over the rest (see `ms_accum.core.guard`). Skips are counted, and warned about without a loss scaler.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler
            (mixed precision): the backward passes are scaled, each window is unscaled and checked once, and a
            dynamic scale is adjusted once per window. Overflowing windows are skipped and logged. Default: ``None``.
        stop_on_nonfinite (bool): Raise `NonFiniteError` at the first skipped window instead of going on.
            Default: ``False``.
        recompute (Sequence[str], optional): Paths of sub-cells of `network` (``network.cells_and_names()``) whose
            forward pass is recomputed in the backward pass instead of keeping their activations
            (`ms_accum.train.recompute.recompute_cells`), for networks where even one micro-batch does not fit.
            Gradients are unchanged. Default: ``None``.
        buffer_dtype (mindspore.dtype, optional): The accumulation buffer's dtype. Default: ``None``, float32 for
            float16 and bfloat16 parameters, else theirs.
        statistics (bool): Measure each micro-batch's and each window's gradient norm in the graph
            (`ms_accum.core.statistics`), in `StepRecord.grad_norm` and `StepRecord.micro_batch_grad_norms`. A norm, not
            a copy, but a few more kernels per micro-batch (docs/statistics.md). Default: ``False``; on whenever
            `noise_scale` or `skip_outliers` is set.
        noise_scale (bool): Estimate the gradient noise scale B_simple from the micro-batches' and the windows'
            gradient norms (`ms_accum.core.statistics.NoiseScale`), in `StepRecord.noise_scale`. Default: ``False``.
        skip_outliers (float, optional): Leave out of its window a micro-batch whose loss or gradient norm lies beyond
            this many standard deviations of the running statistics of recent micro-batches (a loss spike), as
            ``policy="skip_microbatch"`` leaves out a non-finite one: the divisor corrected, counted in
            `TrainResult.skipped_micro_batches`, its epoch and batch index in `TrainResult.outliers`
            (`ms_accum.core.statistics.OutlierFilter`). Default: ``None``, none left out.
        outlier_warmup (int): Micro-batches taken into the running statistics before any is judged (at least 8).
            Default: ``100``.

    Raises:
        TypeError: If `network` or `loss_fn` is not a Cell, or `optimizer` is not an `nn.Optimizer`, or
            `loss_scaler` is not a MindSpore loss scaler.
        ValueError: If `clip_norm` is not positive, or `reduction`, `structure` or `policy` is unknown, or
            `optimizer` updates a Parameter that is not `network`'s, or `loss_fn` does not reduce to a scalar
            (``reduction="none"``), or `loss_fn` sums and `reduction` asks for a mean, or MindSpore's parallel mode is
            neither stand-alone nor data parallel.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import GradientAccumulation
        >>> from ms_accum.demo.models import LeNet5
        >>> net = LeNet5()
        >>> loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        >>> model = GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
        >>> # result = model.train_process(3, train_dataset, mini_steps=4)
    """

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer,
                 clip_norm: Optional[float] = None, reduction: Optional[str] = None, structure: str = "auto",
                 policy: str = "skip_window", loss_scaler: Optional[LossScaler] = None,
                 stop_on_nonfinite: bool = False, recompute: Optional[Sequence[str]] = None,
                 buffer_dtype=None, statistics: bool = False, noise_scale: bool = False,
                 skip_outliers: Optional[float] = None, outlier_warmup: int = OUTLIER_WARMUP) -> None:
        name = "GradientAccumulation"
        check_cpu_kernels(name)
        self._network = check_isinstance(network, "network", nn.Cell, name)
        check_isinstance(loss_fn, "loss_fn", nn.Cell, name)
        self._optimizer = check_isinstance(optimizer, "optimizer", nn.Optimizer, name)
        _check_optimizer_updates(network, optimizer, name)
        reduction = window_reduction(loss_fn, reduction, name)
        self._clip_norm = check_positive_float(clip_norm, "clip_norm", name, allow_none=True)
        check_buffer_dtype(buffer_dtype, "buffer_dtype", name)
        self._structure = check_value_in(structure, "structure", STRUCTURES, name)
        if self._structure == "cached":  # refused before anything compiles: what gradient caching cannot make exact
            check_loss_signature(loss_fn, name)
            reduction = check_cached_options(reduction, policy, statistics, noise_scale, skip_outliers, name)
            check_same_masks(network, name)
        self._stop_on_nonfinite = check_isinstance(stop_on_nonfinite, "stop_on_nonfinite", bool, name)
        if check_isinstance(noise_scale, "noise_scale", bool, name) and reduction == "sum":
            raise ValueError(f"For '{name}', the argument 'noise_scale' needs the window's mean (reduction 'mean' or "
                             f"'weighted_mean'), but got reduction 'sum'.")
        self.noise_scale = NoiseScale() if noise_scale else None  # the estimator, `ms_accum.core.statistics`
        check_outliers(skip_outliers, outlier_warmup, name)
        self.statistics = (check_isinstance(statistics, "statistics", bool, name) or noise_scale
                           or skip_outliers is not None)  # whether the gradient norms are measured
        self._parallel = data_parallel_info(name)  # None when stand-alone
        self._writes = self._parallel is None or self._parallel.is_main  # rank 0 alone prints and saves
        if recompute is not None:
            recompute_cells(network, recompute, name, "recompute")
        self._net_with_loss = nn.WithLossCell(network, loss_fn)
        self._scaled = loss_scaler is not None
        self.buffer = AccumulationBuffer(optimizer.parameters, policy=policy, loss_scaler=loss_scaler,
                                         reduction=reduction, dtype=buffer_dtype, statistics=self.statistics,
                                         skip_outliers=skip_outliers, outlier_warmup=outlier_warmup, cls_name=name)
        # Refused in this class's name, before the Cells it builds on the buffer would refuse it in theirs.
        check_policy_fits(sparse_gradient_cell(network), self.buffer.guard.policy, name, self.buffer.leaves_out)
        self._clear = TrainClear(self.buffer).set_train()
        self._graphs = (self._named(TrainForwardBackward(self._net_with_loss, optimizer, self.buffer).set_train()),
                        _CheckWindow(self.buffer, clip_norm).set_train(),
                        _StepWindow(optimizer, self.buffer).set_train(), self._clear)
        self._state = TrainingState(self._net_with_loss, optimizer, self.buffer)
        self._cells = {}  # K -> the fused or window Cell; K is a graph constant of theirs
        self._cached = None  # the "cached" structure's TrainCachedWindowCell, which takes windows of any K
        self.plan = None  # the Plan it was built from (`from_plan`), if any
        rate = getattr(optimizer, "learning_rate", None)
        self._samples_lr = rate if isinstance(rate, SamplesLR) else None  # updated when each window opens
        if self._structure == "cached":
            # Its loss sees whole windows: its Cell checks the first micro-batch eagerly (`train_window`), before
            # anything compiles.
            cached = TrainCachedWindowCell(network, loss_fn, optimizer, clip_norm, buffer=self.buffer).set_train()
            cached.caller = name
            self._cached = cached

    @classmethod
    def from_plan(cls, plan, network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer,
                  **options) -> "GradientAccumulation":
        """
        The executor that `plan` (`ms_accum.plan`) chose: its structure and reduction; `train_process` then takes the
        plan's K when `mini_steps` is not given, and refuses a dataset whose micro-batches are not the plan's.

        Args:
            plan (Plan): What `ms_accum.plan` returned (or `Plan.load` read).
            network (nn.Cell), loss_fn (nn.Cell), optimizer (nn.Optimizer): As the plan's factory built them.
            options: Any other argument of `GradientAccumulation` (`clip_norm`, `policy`, ...).

        Raises:
            TypeError: If `plan` is not a `Plan`.
            ValueError: If `options` set the structure or the reduction, which the plan chose, or the plan was made
                for another number of ranks or another network (`Plan.check_fits`).
        """
        check_isinstance(plan, "plan", Plan, "GradientAccumulation.from_plan")
        for arg_name in ("structure", "reduction"):
            if arg_name in options:
                raise ValueError(f"For 'GradientAccumulation.from_plan', the argument '{arg_name}' comes from the "
                                 f"plan ('{getattr(plan, arg_name)}'), but it was also given: "
                                 f"'{options[arg_name]}'.")
        executor = cls(network, loss_fn, optimizer, structure=plan.structure, reduction=plan.reduction, **options)
        world = 1 if executor._parallel is None else executor._parallel.group_size
        executor.plan = plan.check_fits(network, world, "GradientAccumulation.from_plan")
        return executor

    @property
    def structure(self) -> str:
        """The structure that trains every window (``"auto"`` resolved), chosen once when the executor is built."""
        return AUTO_STRUCTURE if self._structure == "auto" else self._structure

    def runner(self, mini_steps: int, largest: Optional[int] = None) -> ThreeGraphsRunner:
        """The runner of the executor's structure (`ThreeGraphsRunner`, `FusedRunner`, `WindowRunner` or
        `CachedRunner`, whose one `TrainCachedWindowCell` takes windows of any size) for windows of `mini_steps`
        micro-batches.

        Its Cells (``forward_backward``, ``check``, ``step``, ``clear``, and ``cell`` for ``"fused"`` and ``"window"``,
        whose K is a graph constant, built once per K, or per `largest`, and kept) all share `buffer`; `train_window`
        trains one window and says whether it was applied. `largest`, the largest K a run will use (`train_process`
        gives it), gives ``"fused"`` and ``"window"`` one Cell for all of them, built for it, which a window of fewer
        micro-batches runs through too: each Cell is a graph with activation memory of its own
        (docs/mindspore.md, each graph's memory).
        """
        if self.structure == "three_graphs":
            return ThreeGraphsRunner(self.buffer, *self._graphs)
        if self.structure == "cached":
            return CachedRunner(self.buffer, self._cached)
        cls, runner = (HostSteppedWindowCell, WindowRunner) if self.structure == "window" else (
            HostSteppedAccumulationCell, FusedRunner)
        steps = mini_steps if largest is None else max(mini_steps, largest)
        if steps not in self._cells:
            self._cells[steps] = self._named(cls(self._net_with_loss, self._optimizer, steps, self._clip_norm,
                                                 buffer=self.buffer).set_train())
        return runner(self.buffer, *self._graphs, self._cells[steps])

    def train_process(self, epoch: int, train_dataset: Dataset, mini_steps: Optional[ScheduleLike] = None, *,
                      partial_window: str = "apply", ckpt_dir: Optional[str] = "ckpt",
                      ckpt_name: str = "gradient_accumulation", log_every: int = 1, verbose: bool = True,
                      on_step: Optional[Callable[[StepRecord], None]] = None,
                      metadata: Optional[dict] = None, save_every: Optional[int] = None,
                      keep_last: Optional[int] = None, resume: Union[bool, str, None] = None) -> TrainResult:
        """
        Trains for `epoch` epochs over `train_dataset`, stepping the optimizer every `mini_steps` batches.

        An epoch whose batch count is not a multiple of `mini_steps` ends with a partial window: it is applied
        (``partial_window="apply"``, the mean over the samples it holds) or dropped (``"drop"``). Micro-batches
        of unequal size are weighted by their sample counts.

        With `save_every`, the whole training state (parameters, optimizer state, the accumulation buffer and
        counters, and the position in the data) is saved every `save_every` optimizer steps to
        ``{ckpt_dir}/{ckpt_name}-{step:09d}.ckpt``. `resume` continues from such a file: a run killed at any
        point, even mid-window, and resumed ends with the parameters of the uninterrupted run, bit for bit,
        provided the dataset yields the same batches in the same order (same files, same
        `mindspore.dataset.config.set_seed`). Batches before the saved position are read again but not computed.

        Args:
            epoch (int): Number of epochs.
            train_dataset (Dataset): Yields (data, label) micro-batches.
            mini_steps (Union[int, dict, Callable], optional): Micro-batches per optimizer step, K: an int, or a
                schedule of the global samples consumed (`ms_accum.train.schedule`): a dict ``{samples: K}`` from 0
                (e.g.
                `ms_accum.rampup`) or a callable ``K(samples)``. Each window's K is decided when it opens, so a
                window never changes K midway and a resumed run recomputes it; a callable is evaluated at every
                window's opening before anything trains. Default: ``None``, the plan's K for an executor built by
                `from_plan` (required otherwise).
            partial_window (str): ``"apply"`` (default) or ``"drop"``.
            ckpt_dir (str, optional): Where checkpoints are saved; ``None`` saves nothing. Default: ``"ckpt"``.
            ckpt_name (str): File name of the final checkpoint (the network only), without ``.ckpt``; also the
                prefix of the training-state files. Default: ``"gradient_accumulation"``. In data parallel only
                rank 0 saves.
            log_every (int): Print every this many optimizer steps when `verbose`. Default: ``1``.
            verbose (bool): Print ``epoch: E step: S loss is L`` lines, L the window's loss over all ranks (printed
                by rank 0 alone in data parallel). Default: ``True``.
            on_step (Callable, optional): Called with each `StepRecord` (progress bars, custom logging).
            metadata (dict, optional): Extra values stored in the checkpoints (ints, floats, strings).
            save_every (int, optional): Save the training state every this many optimizer steps. Default:
                ``None``, only the final checkpoint.
            keep_last (int, optional): Keep only the newest `keep_last` training-state files. Default: ``None``,
                keep all.
            resume (Union[bool, str], optional): ``True`` resumes from the newest readable training-state file in
                `ckpt_dir` (and starts afresh if there is none); a path resumes from that file. Default: ``None``.

        Returns:
            TrainResult, the optimizer steps run (after the resumed position) with their losses, the dropped
            windows, the final checkpoint's path and the file resumed from.

        Raises:
            TypeError: If an argument has the wrong type, or `train_dataset` is None.
            ValueError: If `epoch` or `mini_steps` is not positive, the dataset is empty or does not yield the two
                columns (data, label) that `network` and `loss_fn` take, `partial_window` is
                unknown, `ckpt_dir` is not a writable directory, or `save_every` / `resume` is given without
                `ckpt_dir`; in data parallel, if the ranks' datasets have different numbers of batches (the ranks
                would wait for each other forever).
            CheckpointError: If the file to resume from cannot be read, does not fit the training state, was written
                by a newer ms_accum, or would not continue the same training: another `partial_window` or dataset
                seed, or another global batch per update or samples per epoch (`mini_steps`, the micro-batch size and
                the number of ranks may change if both stay); or if a checkpoint cannot be written (no space left, any
                `OSError`): the message names the file, its directory, the cause and the newest complete training
                state to resume from, and no earlier file is changed.
        """
        name = "GradientAccumulation.train_process"
        schedule = AccumulationSchedule(self._planned(mini_steps, train_dataset, name), name, "mini_steps")
        num_batches = self._check_run(epoch, train_dataset, schedule, partial_window, ckpt_dir, log_every, on_step,
                                      save_every, keep_last, resume, name)
        world = 1 if self._parallel is None else self._parallel.group_size
        # Global samples in one micro-batch of every rank; the ranks' micro-batches may differ in size.
        per_batch = (train_dataset.get_batch_size() if self._parallel is None else
                     sum(gather_ints(train_dataset.get_batch_size())))
        run = {"mini_steps": schedule.fixed or 0, "global_batches": schedule.global_batches(per_batch),
               "partial_window": partial_window, "num_batches": num_batches, "data_seed": ds_config.get_seed(),
               "rank_batch_size": train_dataset.get_batch_size(), "world_size": world,
               "global_micro_batch": per_batch}
        states = StateCheckpoints(self._state, ckpt_dir, ckpt_name, run, metadata, save_every, keep_last,
                                  self._writes, schedule)
        self._clear()  # start from an empty window whatever happened before
        position, resumed_from = states.resume(resume, epoch)
        if self.noise_scale is not None:  # a run's own estimate, continued by its resumed runs
            self.noise_scale = NoiseScale()
            self.noise_scale.load(states.resumed)
            states.extra = self.noise_scale.state
        if self._parallel is not None and resume not in (None, False):
            check_same_on_all_ranks(position.step, "the optimizer step resumed from", name)
        # Every window's K, worked out before anything trains (a callable's bad value fails here); the fused and window
        # Cells are built once, for the largest, and take the shorter windows too.
        largest = max((k for k, _, _ in _planned_windows(epoch, num_batches, schedule, per_batch, position)),
                      default=1)
        if self.noise_scale is not None and self._parallel is None and largest == 1:
            given = schedule.fixed or "a schedule that is 1 in every window of this run"
            raise ValueError(f"For '{name}', the argument 'mini_steps' must be at least 2 in some window with "
                             f"noise_scale=True on one rank: the noise scale compares the micro-batch's gradient with "
                             f"the window's, and with one micro-batch per window they are one batch size, but got "
                             f"{given}.")
        runner = self.runner(largest)
        log = WindowLog(log_every, verbose and self._writes, on_step, self._stop_on_nonfinite, self._scaled)
        result = TrainResult(dropped_windows=position.dropped_windows, resumed_from=resumed_from,
                             skipped_windows=runner.skipped)
        windows = _windows(train_dataset, epoch, num_batches, schedule, per_batch, position)
        for k, size, window, opened_at in windows:
            if size < k and partial_window == "drop":
                for _ in window:  # read, not trained: the data order stays the same
                    pass
                position.dropped_windows += 1
                result.dropped_windows += 1
                continue
            states.window_opened(opened_at, k)
            if self._samples_lr is not None:
                self._samples_lr.update(opened_at)
            losses, norms, samples, applied = runner.train_window(window, size)
            position.step += 1
            record, figures = self._record(result, position, losses, norms, samples, applied, k,
                                           _samples_read(position.epoch, position.batch, num_batches, per_batch))
            log.window(record, figures, result)
            states.window_closed(position)
        if ckpt_dir is not None and self._writes:
            meta = {"epoch": epoch, "step": position.step, "mini_steps": schedule.fixed or 0,
                    "global_batches": run["global_batches"], **(metadata or {})}
            result.checkpoint = states.save(self._network, os.path.join(ckpt_dir, f"{ckpt_name}.ckpt"), meta)
        return result

    def _planned(self, mini_steps: Optional[ScheduleLike], train_dataset: Dataset, name: str) -> ScheduleLike:
        """`mini_steps`, or the plan's K; a plan also fixes the micro-batch."""
        if self.plan is None:
            if mini_steps is None:
                raise TypeError(f"For '{name}', the argument 'mini_steps' must be a positive int (only an executor "
                                f"built by GradientAccumulation.from_plan takes its plan's), but got None.")
            return mini_steps
        if isinstance(train_dataset, Dataset) and train_dataset.get_batch_size() != self.plan.batch_size:
            raise ValueError(f"For '{name}', the argument 'train_dataset' must yield the plan's micro-batches of "
                             f"{self.plan.batch_size} samples, but its batch size is {train_dataset.get_batch_size()}.")
        return self.plan.accumulate_step if mini_steps is None else mini_steps

    @staticmethod
    def _named(cell: nn.Cell) -> nn.Cell:
        # A micro-batch Cell refuses a loss whose output does not fit the reduction when its first call fails to
        # compile; built by the executor, it names the executor and its argument.
        cell.caller, cell.loss_arg = "GradientAccumulation", "loss_fn"
        return cell

    def _check_run(self, epoch, train_dataset, schedule, partial_window, ckpt_dir, log_every, on_step, save_every,
                   keep_last, resume, name: str) -> int:
        """Every argument of `train_process`, checked before anything compiles; returns the epoch's batch count."""
        check_positive_int(epoch, "epoch", name)
        check_isinstance(train_dataset, "train_dataset", Dataset, name)
        check_value_in(partial_window, "partial_window", PARTIAL_WINDOWS, name)
        check_positive_int(log_every, "log_every", name)
        if on_step is not None:
            check_callable(on_step, "on_step", name)
        for arg_name, value in (("save_every", save_every), ("keep_last", keep_last)):
            if value is not None:
                check_positive_int(value, arg_name, name)
        if resume is not None:
            check_isinstance(resume, "resume", (bool, str, os.PathLike), name)
        for arg_name, value in (("save_every", save_every), ("resume", resume)):
            if value not in (None, False) and ckpt_dir is None:
                raise ValueError(f"For '{name}', the argument '{arg_name}' needs 'ckpt_dir', but 'ckpt_dir' is None.")
        if ckpt_dir is not None and self._writes:
            check_writable_dir(ckpt_dir, "ckpt_dir", name)
        columns = train_dataset.get_col_names()
        if len(columns) != 2:
            raise ValueError(f"For '{name}', the argument 'train_dataset' must yield 2 columns, the network's input "
                             f"and the loss's label, but it yields {len(columns)}: {columns}.")
        num_batches = train_dataset.get_dataset_size()
        if self._parallel is not None:
            # Every window closes with a collective: a rank with fewer batches would leave the others waiting.
            check_same_on_all_ranks(num_batches, "the number of batches of 'train_dataset'", name)
        if num_batches <= 0:
            raise ValueError(f"For '{name}', the argument 'train_dataset' must not be empty, but it has no batches.")
        if schedule.fixed is not None and schedule.fixed > num_batches:
            done = {"apply": "applied", "drop": "dropped"}[partial_window]
            warnings.warn(f"For '{name}', 'mini_steps' ({schedule.fixed}) is larger than an epoch's {num_batches} "
                          f"batches: every window is partial and is {done} at the end of the epoch.", stacklevel=3)
        return num_batches

    def _record(self, result: TrainResult, position: Position, losses: list, norms: list, samples: list,
                applied: bool, k: int, consumed: int) -> Tuple[StepRecord, WindowFigures]:
        """The window's `StepRecord`, added to `result`, and the figures it was made of."""
        window = WindowFigures(self.buffer.reduction, self.buffer.reducer, losses, norms, samples)
        guard = self.buffer.guard
        result.skipped_windows += int(not applied)
        result.skipped_micro_batches = int(guard.skipped_micro_batches.asnumpy())
        window_sq_norm = float(self.buffer.statistics.window_sq_norm.asnumpy()) if self.statistics else np.nan
        noise = None
        if self.noise_scale is not None and applied and window.has_two_batch_sizes():
            noise = self.noise_scale.update(window.micro_sq_norm, window.micro_weight, window_sq_norm, window.weight)
        outliers = [position.batch - len(losses) + int(i) for i in window.left_out_indices]
        record = StepRecord(position.epoch, position.step, window.loss, len(losses), window.samples, not applied,
                            float(guard.loss_scale.asnumpy()), k, consumed, float(np.sqrt(window_sq_norm)),
                            window.micro_batch_norms() if self.statistics else [], noise, outliers)
        result.steps.append(record)
        result.outliers += [(position.epoch, batch) for batch in outliers]
        return record, window


def _check_optimizer_updates(network: nn.Cell, optimizer: nn.Optimizer, name: str) -> None:
    # An optimizer over another network's Parameters would train nothing, silently.
    own = {id(p) for p in network.get_parameters()}
    for param in optimizer.parameters:
        if id(param) not in own:
            raise ValueError(f"For '{name}', the argument 'optimizer' must update Parameters of 'network', but "
                             f"'{param.name}' is not one of them (an optimizer built over another network?).")


"""GradientAccumulation: the training executor of MindSpore's Cell-graph tutorial, exact and fast."""
from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence, Union

import numpy as np
from mindspore import Tensor, nn
from mindspore.dataset import Dataset, config as ds_config

from ._validation import (check_callable, check_isinstance, check_positive_float, check_positive_int,
                          check_value_in, check_writable_dir)
from .accumulator import REDUCTIONS
from .guard import LossScaler
from .buffer import AccumulationBuffer
from .checkpoint import CheckpointError, checkpoint_path, find_latest, load_checkpoint, load_into, prune, \
    save_checkpoint
from .cells import TrainAccumulationCell, TrainClear, TrainForwardBackward, TrainOptim, TrainingState
from .window import TrainWindowCell
from .parallel import check_same_on_all_ranks, data_parallel_info
from .recompute import recompute_cells


PARTIAL_WINDOWS = ("apply", "drop")
STRUCTURES = ("auto", "window", "fused", "three_graphs")
# What "auto" runs: the one structure whose peak memory stayed within the goal (1.15x one micro-batch's step plus
# the buffer) at every K measured; the faster ones keep more activations alive (README, "Memory").
AUTO_STRUCTURE = "three_graphs"
STATE_KIND = "training_state"  # metadata "kind" of the files `resume` accepts


@dataclass
class StepRecord:
    """One window: where it closed, its loss (sample-weighted mean), and whether it was skipped as not finite."""

    epoch: int
    step: int
    loss: float
    micro_batches: int
    samples: int
    skipped: bool = False
    loss_scale: float = 1.0


class NonFiniteError(FloatingPointError):
    """Raised with ``stop_on_nonfinite=True`` when a window is not finite; the parameters were left untouched."""


@dataclass
class TrainResult:
    """What `train_process` did: one record per optimizer step, the windows dropped, the checkpoint."""

    steps: List[StepRecord] = field(default_factory=list)
    dropped_windows: int = 0
    checkpoint: Optional[str] = None
    resumed_from: Optional[str] = None
    skipped_windows: int = 0  # not finite, so not applied (over the whole training, resumed runs included)
    skipped_micro_batches: int = 0  # left out by policy "skip_microbatch"

    @property
    def losses(self) -> List[float]:
        """The loss of each optimizer step, in order."""
        return [record.loss for record in self.steps]


@dataclass
class Position:
    """Where a run is: enough, with the dataset's seed, to continue it exactly (saved in training states)."""

    epoch: int = 1
    batch: int = 0  # batches of `epoch` already trained
    step: int = 0  # optimizer steps (windows applied)
    dropped_windows: int = 0


class GradientAccumulation:
    r"""
    Trains `network` with gradient accumulation: one optimizer step per window of `mini_steps` micro-batches.

    The executor of MindSpore's Cell-graph tutorial, with its signature, but each update equals one step on
    the concatenated window (the tutorial sums K mean losses and so steps K times too far). By default each
    micro-batch runs through `TrainForwardBackward`, a graph without control flow, and each window closes with
    `TrainOptim` and `TrainClear`: the structure whose peak memory stays closest to one micro-batch's step (the
    README's "Memory" section has the measurements and what the faster structures cost). Every structure shares
    one `AccumulationBuffer`, so an epoch's partial window, or a window of unequal micro-batches, runs through the
    tutorial's three graphs on the same state.

    Data parallel (MindSpore's ``ParallelMode.DATA_PARALLEL``, e.g. after `ms_accum.parallel.init_data_parallel`
    under `msrun`) is detected when the executor is built: each rank accumulates its shard's micro-batches without
    communicating, and each window is all-reduced once, so an update equals one step on the window's global
    batch. Give every rank its own shard with the same number of batches; only rank 0 prints and saves.

    Args:
        network (nn.Cell): The network, returning logits.
        loss_fn (nn.Cell): The loss, a mean over the batch (e.g. `nn.SoftmaxCrossEntropyWithLogits(sparse=True,
            reduction="mean")`).
        optimizer (nn.Optimizer): The optimizer over `network`'s parameters.
        clip_norm (float, optional): Clip each window's gradient to this global norm. Default: ``None``.
        reduction (str): ``"mean"`` (sample-weighted, the default) or ``"sum"``.
        structure (str): How micro-batches run. ``"three_graphs"``: the tutorial's `TrainForwardBackward` /
            `TrainOptim` / `TrainClear`, least memory; ``"fused"``: one call per micro-batch
            (`TrainAccumulationCell`), faster, more memory; ``"window"``: a whole window in one graph call
            (`TrainWindowCell`), fastest, most memory of the three. ``"auto"`` (default) chooses by memory first:
            ``"three_graphs"``.
        policy (str): A window whose gradient or loss is not finite is never applied. ``"skip_window"``
            (default) skips the whole window; ``"skip_microbatch"`` leaves out the bad micro-batches and takes the
            mean over the rest (see `ms_accum.guard`). Skips are counted, and warned about without a loss scaler.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler
            (mixed precision): the backward passes are scaled, each window is unscaled and checked once, and a
            dynamic scale is adjusted once per window. Overflowing windows are skipped and logged. Default: ``None``.
        stop_on_nonfinite (bool): Raise `NonFiniteError` at the first skipped window instead of going on.
            Default: ``False``.
        recompute (Sequence[str], optional): Paths of sub-cells of `network` (``network.cells_and_names()``) whose
            forward pass is recomputed in the backward pass instead of keeping their activations
            (`ms_accum.recompute.recompute_cells`), for networks where even one micro-batch does not fit.
            Gradients are unchanged. Default: ``None``.

    Raises:
        TypeError: If `network` or `loss_fn` is not a Cell, or `optimizer` is not an `nn.Optimizer`, or
            `loss_scaler` is not a MindSpore loss scaler.
        ValueError: If `clip_norm` is not positive, or `reduction`, `structure` or `policy` is unknown, or
            MindSpore's parallel mode is neither stand-alone nor data parallel.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import GradientAccumulation, LeNet5
        >>> net = LeNet5()
        >>> loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        >>> model = GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
        >>> # result = model.train_process(3, train_dataset, mini_steps=4)
    """

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer,
                 clip_norm: Optional[float] = None, reduction: str = "mean", structure: str = "auto",
                 policy: str = "skip_window", loss_scaler: Optional[LossScaler] = None,
                 stop_on_nonfinite: bool = False, recompute: Optional[Sequence[str]] = None) -> None:
        name = "GradientAccumulation"
        self._network = check_isinstance(network, "network", nn.Cell, name)
        self._loss_fn = check_isinstance(loss_fn, "loss_fn", nn.Cell, name)
        self._optimizer = check_isinstance(optimizer, "optimizer", nn.Optimizer, name)
        self._clip_norm = check_positive_float(clip_norm, "clip_norm", name, allow_none=True)
        self._reduction = check_value_in(reduction, "reduction", REDUCTIONS, name)
        self._structure = check_value_in(structure, "structure", STRUCTURES, name)
        self._stop_on_nonfinite = check_isinstance(stop_on_nonfinite, "stop_on_nonfinite", bool, name)
        self._parallel = data_parallel_info(name)  # None when stand-alone
        if recompute is not None:
            recompute_cells(network, recompute)
        self._net_with_loss = nn.WithLossCell(network, loss_fn)
        self._scaled = loss_scaler is not None
        self.buffer = AccumulationBuffer(optimizer.parameters, "grad_sum", policy, loss_scaler)
        mean = reduction == "mean"
        self._train_forward_backward = TrainForwardBackward(self._net_with_loss, optimizer, self.buffer,
                                                            weight_by_samples=mean).set_train()
        self._train_optim = TrainOptim(optimizer, self.buffer, clip_norm, reduction).set_train()
        self._train_clear = TrainClear(self.buffer).set_train()
        self._state = TrainingState(self._net_with_loss, optimizer, self.buffer)
        self._fused = {}  # mini_steps -> TrainAccumulationCell; K is a graph constant, so one Cell per K

    def structure_for(self, mini_steps: int) -> str:
        """The structure that trains windows of `mini_steps`: what ``structure="auto"`` resolves to."""
        return AUTO_STRUCTURE if self._structure == "auto" else self._structure

    def _micro_step_cell(self, mini_steps: int, structure: Optional[str] = None) -> nn.Cell:
        structure = structure or self.structure_for(mini_steps)  # train_process passes the one it resolved
        if structure == "three_graphs":
            return self._train_forward_backward
        if mini_steps not in self._fused:
            cls = TrainWindowCell if structure == "window" else TrainAccumulationCell
            self._fused[mini_steps] = cls(self._net_with_loss, self._optimizer, mini_steps, self._clip_norm,
                                          self._reduction, buffer=self.buffer).set_train()
        return self._fused[mini_steps]

    def _run_window(self, cell: nn.Cell, window: list) -> list:
        """One full window with `TrainWindowCell`: its micro-batches stacked into one call when of equal shapes."""
        if all(tuple(x.shape) == tuple(y.shape) for inputs in window[1:] for x, y in zip(inputs, window[0])):
            stacked = [Tensor(np.stack([inputs[i].asnumpy() for inputs in window])) for i in range(len(window[0]))]
            return list(cell(*stacked).asnumpy())
        # Micro-batches of different sizes (a dataset batched without drop_remainder): one graph per micro-batch
        # on the same buffer, with the same arithmetic.
        return self._run_partial(window)

    def _run_partial(self, window: list) -> list:
        losses = [self._train_forward_backward(*inputs) for inputs in window]
        self._train_optim()
        self._train_clear()
        return losses

    def train_process(self, epoch: int, train_dataset: Dataset, mini_steps: int = None, *,
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
            mini_steps (int): Micro-batches per optimizer step, K.
            partial_window (str): ``"apply"`` (default) or ``"drop"``.
            ckpt_dir (str, optional): Where checkpoints are saved; ``None`` saves nothing. Default: ``"ckpt"``.
            ckpt_name (str): File name of the final checkpoint (the network only), without ``.ckpt``; also the
                prefix of the training-state files. Default: ``"gradient_accumulation"``. In data parallel only
                rank 0 saves.
            log_every (int): Print every this many optimizer steps when `verbose`. Default: ``1``.
            verbose (bool): Print ``epoch: E step: S loss is L`` lines (rank 0 only in data parallel; the loss
                is then rank 0's share of the window). Default: ``True``.
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
            ValueError: If `epoch` or `mini_steps` is not positive, the dataset is empty, `partial_window` is
                unknown, `ckpt_dir` is not a writable directory, or `save_every` / `resume` is given without
                `ckpt_dir`; in data parallel, if the ranks' datasets have different numbers of batches (the ranks
                would wait for each other forever).
            CheckpointError: If the file to resume from cannot be read, does not fit the training state, or was
                saved with other `mini_steps`, `partial_window`, dataset size or dataset seed.
        """
        name = "GradientAccumulation.train_process"
        epoch = check_positive_int(epoch, "epoch", name)
        mini_steps = check_positive_int(mini_steps, "mini_steps", name)
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
        main = self._parallel is None or self._parallel.is_main
        if ckpt_dir is not None and main:
            ckpt_dir = check_writable_dir(ckpt_dir, "ckpt_dir", name)
        num_batches = train_dataset.get_dataset_size()
        if self._parallel is not None:
            # Every window closes with a collective: a rank with fewer batches would leave the others waiting.
            check_same_on_all_ranks(num_batches, "the number of batches of 'train_dataset'", name)
        if num_batches <= 0:
            raise ValueError(f"For '{name}', the argument 'train_dataset' must not be empty, but it has no batches.")
        if mini_steps > num_batches:
            warnings.warn(f"For '{name}', 'mini_steps' ({mini_steps}) is larger than an epoch's {num_batches} "
                          f"batches: every window is partial and is {partial_window}ed at the end of the epoch.",
                          stacklevel=2)
        run = {"mini_steps": mini_steps, "partial_window": partial_window, "num_batches": num_batches,
               "data_seed": ds_config.get_seed()}

        structure = self.structure_for(mini_steps)
        cell = self._micro_step_cell(mini_steps, structure)
        per_window = structure == "window"  # the cell takes a whole window, stacked
        result = TrainResult()
        self._train_clear()  # start from an empty window whatever happened before
        position = Position()
        if resume not in (None, False):
            path = find_latest(ckpt_dir, ckpt_name) if resume is True else os.fspath(resume)
            if path is not None:
                position = self._load_state(path, run, epoch, name)
                result.resumed_from = path
            if self._parallel is not None:
                check_same_on_all_ranks(position.step, "the optimizer step resumed from", name)
        result.dropped_windows = position.dropped_windows
        result.skipped_windows = int(self.buffer.guard.skipped_windows.asnumpy())  # earlier runs' skips

        def close_window(losses, samples):
            position.step += 1
            self._record(result, position.epoch, position.step, losses, samples, log_every, verbose and main,
                         on_step)
            if save_every is not None and main and position.step % save_every == 0:
                self._save_state(ckpt_dir, ckpt_name, keep_last, position, {**run, **(metadata or {})})

        iterator = train_dataset.create_tuple_iterator(num_epochs=epoch)
        first_epoch, done_batches = position.epoch, position.batch
        for epoch_index in range(1, epoch + 1):
            position.epoch, position.batch = epoch_index, 0
            skip = num_batches if epoch_index < first_epoch else done_batches if epoch_index == first_epoch else 0
            window, window_losses, window_samples = [], [], []
            for inputs in iterator:
                position.batch += 1
                if position.batch <= skip:  # trained before the run was resumed: read to keep the data order
                    continue
                window_samples.append(inputs[0].shape[0])
                if per_window:
                    window.append(inputs)
                else:
                    window_losses.append(cell(*inputs))
                if len(window_samples) < mini_steps:
                    continue
                if per_window:
                    window_losses = self._run_window(cell, window)
                elif structure == "three_graphs":
                    self._train_optim()
                    self._train_clear()
                close_window(window_losses, window_samples)
                window, window_losses, window_samples = [], [], []
            if window_samples:  # the epoch's last window is partial
                if partial_window == "apply":
                    if per_window:
                        window_losses = self._run_partial(window)
                    else:
                        self._train_optim()
                        self._train_clear()
                    close_window(window_losses, window_samples)
                else:
                    self._train_clear()
                    result.dropped_windows += 1
                    position.dropped_windows += 1
        if ckpt_dir is not None and main:
            meta = {"epoch": epoch, "step": position.step, "mini_steps": mini_steps, **(metadata or {})}
            result.checkpoint = save_checkpoint(self._network, os.path.join(ckpt_dir, f"{ckpt_name}.ckpt"), meta)
        return result

    def _save_state(self, ckpt_dir: str, ckpt_name: str, keep_last: Optional[int], position: "Position",
                    metadata: dict) -> None:
        # Saved only when a window has just closed, so the buffer holds zeros; it is saved anyway, so the file
        # is the whole state whatever the structure, and loading it never leaves a stale buffer behind.
        meta = {**metadata, "kind": STATE_KIND, **asdict(position)}
        save_checkpoint(self._state, checkpoint_path(ckpt_dir, ckpt_name, position.step), meta)
        if keep_last is not None:
            prune(ckpt_dir, ckpt_name, keep_last)

    def _load_state(self, path: str, run: dict, epoch: int, name: str) -> "Position":
        contents = load_checkpoint(path)
        meta = contents[1]
        if meta.get("kind") != STATE_KIND:
            raise CheckpointError(f"Checkpoint '{path}' holds no training state to resume from (it was not saved "
                                  f"with 'save_every').")
        for key, value in run.items():
            if meta.get(key) != value:
                raise CheckpointError(f"Checkpoint '{path}' was saved with {key}={meta.get(key)!r}, but this run has "
                                      f"{key}={value!r}: resuming would not continue the same training.")
        if meta["epoch"] > epoch:
            raise CheckpointError(f"Checkpoint '{path}' is at epoch {meta['epoch']}, beyond this run's {epoch} "
                                  f"epochs.")
        load_into(self._state, path, strict=True, contents=contents)
        return Position(**{key: int(meta[key]) for key in Position.__dataclass_fields__})

    def _record(self, result: TrainResult, epoch: int, step: int, losses: list, samples: list, log_every: int,
                verbose: bool, on_step) -> None:
        weights = np.asarray(samples, np.float64)
        values = np.asarray([float(loss.asnumpy()) if isinstance(loss, Tensor) else float(loss) for loss in losses],
                            np.float64)
        finite = np.isfinite(values)  # a left-out micro-batch's loss would make the window's nan
        loss = float((values[finite] * weights[finite]).sum() / weights[finite].sum()) if finite.any() else np.nan
        guard = self.buffer.guard
        skipped_windows = int(guard.skipped_windows.asnumpy())
        skipped = skipped_windows > result.skipped_windows
        result.skipped_windows = skipped_windows
        result.skipped_micro_batches = int(guard.skipped_micro_batches.asnumpy())
        record = StepRecord(epoch, step, loss, len(losses), int(weights.sum()), skipped,
                            float(guard.loss_scale.asnumpy()))
        result.steps.append(record)
        if skipped:
            what = (f"epoch {epoch} step {step}: the window's gradient or loss is not finite, so it was skipped "
                    f"(parameters unchanged; {skipped_windows} window(s) skipped so far)")
            if self._stop_on_nonfinite:
                raise NonFiniteError(f"For 'GradientAccumulation.train_process', {what}; stopping, as "
                                     f"'stop_on_nonfinite' is True.")
            if self._scaled:  # overflow is routine with a loss scaler: a log line, not a warning
                if verbose:
                    print(f"{what}; loss scale now {record.loss_scale:g}", flush=True)
            else:
                warnings.warn(what, RuntimeWarning, stacklevel=3)
        if verbose and step % log_every == 0:
            print(f"epoch: {epoch} step: {step} loss is {record.loss:.6f}", flush=True)
        if on_step is not None:
            on_step(record)

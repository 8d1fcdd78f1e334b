"""GradientAccumulation: the training executor of MindSpore's Cell-graph tutorial, exact, lean and resumable."""
from __future__ import annotations

import warnings
from typing import Callable, List, Optional, Tuple, Union

from mindspore import Parameter, nn
from mindspore.dataset import Dataset

from .._choices import AUTO_STRUCTURE, STRUCTURES
from .._validation import (Argument, ArgumentTypeError, ArgumentValueError, ArgumentWarning, check_isinstance,
                           check_value_in, door, wrong_type)
from ..core.buffer import AccumulationBuffer
from ..core.columns import with_loss
from ..core.dropout import dropout_streams, warn_uncovered
from ..core.losses import window_reduction
from ..core.parallel import DataParallelInfo, data_parallel_info
from ..deprecation import deprecated as warn_deprecated
from ..runtime import check_cpu_kernels
from .options import (Checkpoints, GuardOptions, LogOptions, StatisticsOptions, WindowOptions, with_deprecated)
from .adaptive import AdaptiveK, check_adaptive
from .plan import Plan
from .recompute import recompute_cells
from .records import TrainResult
from .run import Run
from .schedule import AccumulationSchedule, ScheduleLike
from .sharding import RankPart, ShardedCloser, check_shardable, rank_part
from .validation import Validation
from .structures import Closer, Parts, Structure, structure_class


class GradientAccumulation:
    r"""
    Trains `network` with gradient accumulation: one optimizer step per window of `mini_steps` micro-batches.

    The executor of MindSpore's Cell-graph tutorial, with its signature, but each update equals one step on the
    concatenated window (the tutorial's steps are K times too large). The structure is chosen once; every structure
    trains on one `AccumulationBuffer`, so a window that ``"window"`` cannot stack (unequal micro-batches) runs through
    the three graphs on that state. Its optimizer steps are counted in windows closed, applied or skipped as not finite
    (`StepRecord.step`, `save_every`, the training-state files).

    Data parallel (msrun's processes joined by `ms_accum.init_data_parallel`, no parallel context needed) is
    detected when the executor is built: each window is all-reduced once, so an update equals one
    step on the global batch. Give every rank its own shard with the same number of batches; rank 0 prints and saves.

    Args:
        network (nn.Cell): The network: it takes a batch's first columns, in order.
        loss_fn (nn.Cell): The loss, ``loss_fn(network output, *labels)`` over the batch's last columns (as many as
            its `construct` requires after the output; one for MindSpore's losses), reducing the batch to a scalar: a
            mean (e.g. `nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")`) or a sum. ``None``: the
            network computes its own loss from all the columns (as MindFormers' and HF-style models do).
        optimizer (nn.Optimizer): The optimizer over `network`'s parameters.
        structure (str): How micro-batches run (docs/structures.md). ``"three_graphs"``: the tutorial's
            `TrainForwardBackward` per micro-batch, then the window's check and its step (or clear) chosen on the host,
            least memory; ``"fused"``: one call per micro-batch, faster, more memory; ``"window"``: a whole window in
            one graph call, fastest, most memory of the three. ``"auto"`` (default) chooses by memory:
            ``"three_graphs"``. ``"cached"``: gradient caching (docs/cached.md) for a loss that couples the samples of
            a batch (contrastive): `network` maps a micro-batch to its outputs and ``loss_fn(outputs, labels)`` runs
            once per window on all of them.
        window (WindowOptions, optional): How a window becomes one update: its reduction, its clipping, its buffer's
            dtype. Default: ``WindowOptions()``, the mean the loss says it computes, no clipping.
        guard (GuardOptions, optional): What a window that is not finite does: its policy, a loss scaler, whether to
            stop. Default: ``GuardOptions()``, skip the window, go on.
        statistics (StatisticsOptions, optional): Gradient norms, noise scale and outliers measured in the graph
            (docs/statistics.md). Default: ``StatisticsOptions()``, none.
        shard_optimizer (Union[bool, Callable[[list[Parameter]], nn.Optimizer]]): In data parallel, each rank keeps
            the optimizer state of its own part of the parameters (whole parameters, balanced by size) and steps that
            part; the updated parameters are then gathered, so every rank holds the same network and each update is
            the unsharded one (`ms_accum.train.sharding`, docs/data-parallel.md). Training-state files are the same
            as unsharded ones. ``True``: ms_accum builds each rank's optimizer, for `nn.Momentum`, `nn.SGD`,
            `nn.Adam` and `nn.AdamWeightDecay` (`ms_accum.train.sharding.REBUILT`). Another optimizer whose state is
            per parameter: a factory ``params -> optimizer`` that builds your optimizer's class over the list of
            Parameters it is given (a rank's, in your optimizer's order), with each one's settings as in
            `optimizer`. In one process it changes nothing, and says so. Default: ``False``.
        deprecated: The keywords of 0.3 (`clip_norm`, `reduction`, `policy`, `loss_scaler`, `statistics=True`, ...,
            `ms_accum.deprecation.EXECUTOR_KEYWORDS`), with a `DeprecationWarning`, until 2.0.0; ``recompute=[...]``
            is `ms_accum.recompute_cells`.

    Raises:
        TypeError: If `network` or `loss_fn` is not a Cell, or `optimizer` is not an `nn.Optimizer`, or
            `loss_scaler` is not a MindSpore loss scaler.
        ValueError: If `clip_norm` is not positive, or `reduction`, `structure` or `policy` is unknown, or
            `optimizer` updates a Parameter that is not `network`'s, or `loss_fn` does not reduce to a scalar
            (``reduction="none"``), or `loss_fn` sums and `reduction` asks for a mean, or MindSpore's parallel mode is
            neither stand-alone nor data parallel, or `shard_optimizer` is True in data parallel with an optimizer
            ms_accum does not rebuild (`ms_accum.train.sharding.REBUILT`), or its factory builds an optimizer that
            does not hold the same state as `optimizer`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import Parameter, nn
        >>> from ms_accum import GradientAccumulation
        >>> from ms_accum.demo.models import LeNet5
        >>> net = LeNet5()
        >>> loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        >>> model = GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
        >>> # result = model.train_process(3, train_dataset, mini_steps=4)
    """

    @door("GradientAccumulation")
    def __init__(self, network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer, *,
                 structure: str = "auto", window: Optional[WindowOptions] = None, guard: Optional[GuardOptions] = None,
                 statistics: Optional[StatisticsOptions] = None,
                 shard_optimizer: Union[bool, Callable[[List[Parameter]], nn.Optimizer]] = False, **deprecated) -> None:
        check_cpu_kernels()
        recompute = deprecated.pop("recompute", None)
        if statistics is not None and not isinstance(statistics, StatisticsOptions):  # 0.3's statistics=True
            statistics, deprecated["statistics"] = None, check_isinstance(statistics, "statistics", bool)
        options = with_deprecated({"window": window or WindowOptions(), "guard": guard or GuardOptions(),
                                   "statistics": statistics or StatisticsOptions()}, deprecated,
                                  ("window", "guard", "statistics"))
        window, self.guard, measure = (check_isinstance(options[name], name, kind) for name, kind in (
            ("window", WindowOptions), ("guard", GuardOptions), ("statistics", StatisticsOptions)))
        check_isinstance(network, "network", nn.Cell)
        if loss_fn is not None:  # None: the network computes its own loss from all the columns
            check_isinstance(loss_fn, "loss_fn", nn.Cell)
        check_isinstance(optimizer, "optimizer", nn.Optimizer)
        _check_optimizer_updates(network, optimizer)
        # Masks from a seed and a count ms_accum saves, not a kernel's engine; what it cannot reach is named now.
        self.dropout = dropout_streams(network)
        warn_uncovered(network, self.dropout, stacklevel=4)
        kind = structure_class(check_value_in(structure, "structure", STRUCTURES))
        reduction = window_reduction(loss_fn, window.reduction)
        reduction = kind.refuse(network, loss_fn, reduction, self.guard, measure)
        if measure.noise_scale and reduction == "sum":
            raise ArgumentValueError("{@noise_scale:subject} needs the window's mean (reduction 'mean' or "
                                     "'weighted_mean'), but got reduction 'sum'.")
        self.parallel = data_parallel_info()  # None when stand-alone
        # Built before the buffer: the part's state, cloned from the parameters, then comes before the buffer's in
        # memory; built after it, a 2-rank run of the 192 MiB MLP peaked 0.07x the parameters higher (measured,
        # docs/data-parallel.md).
        shard = _sharded(shard_optimizer, self.parallel, optimizer)
        if recompute is not None:
            warn_deprecated("ms_accum.GradientAccumulation(recompute=...)", stacklevel=3)  # this, its door, the user
            recompute_cells(network, recompute, arg_name="recompute")
        self.measure, self.statistics = measure, measure.measured  # and whether the gradient norms are measured
        self.buffer = AccumulationBuffer(optimizer.parameters, policy=self.guard.policy,
                                         loss_scaler=self.guard.loss_scaler, reduction=reduction,
                                         dtype=window.buffer_dtype, statistics=self.statistics,
                                         skip_outliers=measure.skip_outliers, outlier_warmup=measure.outlier_warmup,
                                         reduce_on_host=True)
        parts = Parts(network, loss_fn, with_loss(network, loss_fn), optimizer, self.buffer, window.clip_norm,
                      self.dropout, "network" if loss_fn is None else "loss_fn")
        closer = Closer(parts) if shard is None else ShardedCloser(parts, shard)
        self._structure: Structure = kind(parts, closer)
        self.parts, self.state = parts, closer.training_state(parts)  # what it trains; what training-state files hold
        self.network, self.loss_fn = network, loss_fn
        self.plan: Optional[Plan] = None  # the Plan it was built from (`from_plan`), if any
        self._structure_name = AUTO_STRUCTURE if structure == "auto" else structure

    @classmethod
    def from_plan(cls, plan: Plan, network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer,
                  **options) -> "GradientAccumulation":
        """
        The executor that `plan` (`ms_accum.plan`) chose: its structure and reduction; `train_process` then takes the
        plan's K when `mini_steps` is not given, and refuses a dataset whose micro-batches are not the plan's.

        Args:
            plan (Plan): What `ms_accum.plan` returned (or `Plan.load` read).
            network (nn.Cell), loss_fn (nn.Cell), optimizer (nn.Optimizer): As the plan's factory built them.
            options: Any other argument of `GradientAccumulation` (`window`, `guard`, ...).

        Raises:
            TypeError: If `plan` is not a `Plan`.
            ValueError: If `options` set the structure or the reduction, which the plan chose, or the plan was made
                for another number of ranks or another network (`Plan.check_fits`).
        """
        with door("GradientAccumulation.from_plan"):
            check_isinstance(plan, "plan", Plan)
            given = {"structure": options.get("structure"), "reduction": options.get("reduction")}
            if options.get("window") is not None and options["window"].reduction is not None:
                given["reduction"] = options["window"].reduction
            for arg_name, value in given.items():
                if value is not None:
                    raise ArgumentValueError("{arg_name:subject} comes from the plan ('{planned}'), but it was "
                                             "also given: '{value}'.", arg_name=Argument(arg_name),
                                             planned=getattr(plan, arg_name), value=value)
        window = options.pop("window", None) or WindowOptions()
        executor = cls(network, loss_fn, optimizer, structure=plan.structure,
                       window=WindowOptions(plan.reduction, window.clip_norm, window.buffer_dtype), **options)
        world = 1 if executor.parallel is None else executor.parallel.group_size
        with door("GradientAccumulation.from_plan"):
            executor.plan = plan.check_fits(network, world)
        return executor

    @property
    def structure(self) -> str:
        """The structure that trains every window (``"auto"`` resolved), chosen once when the executor is built."""
        return self._structure_name

    def runner(self, largest: int) -> Structure:
        """The executor's structure (`ms_accum.train.structures`), ready for windows of up to `largest` micro-batches:
        its `run` trains one window on the executor's buffer and returns its `WindowResult`."""
        self._structure.prepare(largest)
        return self._structure

    @door("GradientAccumulation.train_process")
    def train_process(self, epoch: int, train_dataset: Dataset, mini_steps: Optional[ScheduleLike] = None,
                      partial_window: str = "apply", *, checkpoints: Optional[Checkpoints] = Checkpoints(),
                      log: LogOptions = LogOptions(), eval_dataset: Optional[Dataset] = None,
                      eval_every: Union[int, Validation, None] = None, **deprecated) -> TrainResult:
        """
        Trains for `epoch` epochs over `train_dataset`, stepping the optimizer every `mini_steps` batches.

        An epoch whose batch count is not a multiple of K ends with a partial window, applied as the mean over the
        samples it holds (``partial_window="apply"``) or dropped (``"drop"``); micro-batches of unequal size are
        weighted by their sample counts. A run killed at any point and resumed (`Checkpoints`) ends with the
        parameters of the uninterrupted run, bit for bit, given the same batches in the same order.

        Args:
            epoch (int): Number of epochs.
            train_dataset (Dataset): Yields micro-batches: the network's inputs, then the loss's labels.
            mini_steps (Union[int, dict, Callable, AdaptiveK], optional): K, micro-batches per optimizer step: an
                int, or a schedule of the global samples consumed (`ms_accum.train.schedule`), or K chosen from the
                measured gradient noise scale (`AdaptiveK`), decided when each window opens. Default: ``None``, the
                plan's K for an executor built by `from_plan` (required otherwise).
            partial_window (str): ``"apply"`` (default) or ``"drop"``.
            checkpoints (Checkpoints, optional): Where and how often to save, and what to resume from; ``None``
                saves nothing. Default: ``Checkpoints()``, the final network in ``ckpt/gradient_accumulation.ckpt``.
            log (LogOptions): What it says about each window; an `on_step` that returns True stops the run there
                (early stopping; its training state is saved, so it resumes). Default: ``LogOptions()``.
            eval_dataset (Dataset, optional): Held-out batches, of the training's columns, scored every `eval_every`
                optimizer steps and after the last (`StepRecord.validation`). Default: ``None``.
            eval_every (Union[int, Validation], optional): The steps between scores, or a `Validation` with its
                metrics and the best checkpoint to keep. Default: ``None``, the last step only.
            deprecated: The keywords of 0.3 (`ckpt_dir`, `ckpt_name`, `save_every`, `keep_last`, `metadata`, `resume`,
                `log_every`, `verbose`, `on_step`), with a `DeprecationWarning`, until 2.0.0.

        Returns:
            TrainResult, one `StepRecord` per optimizer step run, the dropped and skipped windows, the final
            checkpoint's path and the file resumed from.

        Raises:
            TypeError: If an argument has the wrong type.
            ValueError: If `epoch` or `mini_steps` is not positive, or `mini_steps` is an `AdaptiveK` the executor
                cannot measure the noise scale for (`ms_accum.train.adaptive.check_adaptive`), the dataset is empty,
                `partial_window` is unknown, the checkpoints' directory is not writable; in data parallel, if the ranks'
                datasets have different numbers of batches.
            CheckpointError: If the file to resume from cannot be read or would not continue the same training, or a
                checkpoint cannot be written (docs/resume.md).
        """
        options = with_deprecated({"checkpoints": checkpoints, "log": log}, deprecated, ("checkpoints", "log"))
        schedule = self._schedule(self._mini_steps(mini_steps, train_dataset))
        run = Run(self.parts, self.state, self.parallel, self.guard, self.measure, epoch, train_dataset, schedule,
                  partial_window, options["checkpoints"], options["log"], _validation(eval_dataset, eval_every))
        self._structure.reset()  # start from an empty window whatever happened before
        windows = run.start()
        structure = self.runner(run.largest)  # built once, for the largest K; shorter windows run through it too
        # The network's nn.Dropout cells draw from the streams, and AdaptiveK scales the rate, until training ends.
        with self.dropout.drawing(), run.rate:
            _train_windows(run, windows, structure, partial_window)
        return run.finish(self.network)

    def _schedule(self, mini_steps: Union[ScheduleLike, AdaptiveK]) -> Union[AccumulationSchedule, AdaptiveK]:
        """K as the run takes it, every kind of `mini_steps` normalised here, at the door: a schedule (a fixed K is
        one), its own `KPolicy`, or an `AdaptiveK` this executor can measure the noise scale for, whose `for_run` makes
        the run's (`ms_accum.train.kpolicy`)."""
        if not isinstance(mini_steps, AdaptiveK):
            return AccumulationSchedule(mini_steps, arg_name="mini_steps")
        check_adaptive(mini_steps, self.structure, self.buffer.reduction.name, self.statistics,
                       1 if self.parallel is None else self.parallel.group_size)
        return mini_steps

    def _mini_steps(self, mini_steps: Optional[ScheduleLike], train_dataset: Dataset) -> ScheduleLike:
        """`mini_steps`, or the plan's K; a plan also fixes the micro-batch."""
        if self.plan is None:
            if mini_steps is None:
                raise ArgumentTypeError("{@mini_steps:subject} must be a positive int (only an executor built by "
                                        "GradientAccumulation.from_plan takes its plan's), but got None.")
            return mini_steps
        if isinstance(train_dataset, Dataset) and train_dataset.get_batch_size() != self.plan.batch_size:
            raise ArgumentValueError("{@train_dataset:subject} must yield the plan's micro-batches of {batch_size} "
                                     "samples, but its batch size is {given}.", batch_size=self.plan.batch_size,
                                     given=train_dataset.get_batch_size())
        return self.plan.accumulate_step if mini_steps is None else mini_steps


def _train_windows(run: Run, windows, structure: Structure, partial_window: str) -> None:
    """Trains `run`'s windows through `structure` (a partial one dropped if `partial_window` says so), until the last
    or until `on_step` stops the run."""
    for k, size, window, opened_at in windows:
        if size < k and partial_window == "drop":
            run.drop(window)
            continue
        run.open(opened_at, k)
        with door("GradientAccumulation", final=True):  # a graph's refusal is about the executor's arguments
            trained = structure.run(window, size)
        if run.close(k, trained):
            break


def _validation(eval_dataset: Optional[Dataset], eval_every) -> Optional[Tuple[Dataset, Validation]]:
    """`train_process`'s held-out data and when to score it, checked."""
    if eval_dataset is None:
        if eval_every is not None:
            raise ArgumentValueError("{@eval_every:subject} needs {@eval_dataset}, but {@eval_dataset} is None.")
        return None
    check_isinstance(eval_dataset, "eval_dataset", Dataset)
    if isinstance(eval_every, Validation):
        return eval_dataset, eval_every
    return eval_dataset, Validation(every=2 ** 62 if eval_every is None else eval_every)


def _sharded(shard_optimizer, parallel: Optional[DataParallelInfo], optimizer: nn.Optimizer) -> Optional[RankPart]:
    """This rank's part of the optimizer when its state is sharded (asked for, on more than one rank), else None; an
    optimizer that cannot be sharded so is refused before anything is built."""
    if not isinstance(shard_optimizer, bool) and not callable(shard_optimizer):
        raise wrong_type(shard_optimizer, "shard_optimizer", "bool or a factory params -> optimizer")
    if shard_optimizer is False:
        return None
    if parallel is None:
        warnings.warn(ArgumentWarning("{@shard_optimizer} changes nothing in one process, which holds all the "
                                      "optimizer state: start the script with msrun and call "
                                      "ms_accum.init_data_parallel() first (docs/data-parallel.md)."), stacklevel=4)
        return None
    return rank_part(optimizer, parallel, check_shardable(optimizer, parallel.group_size, shard_optimizer))


def _check_optimizer_updates(network: nn.Cell, optimizer: nn.Optimizer) -> None:
    # An optimizer over another network's Parameters would train nothing, silently.
    own = {id(p) for p in network.get_parameters()}
    for param in optimizer.parameters:
        if id(param) not in own:
            raise ArgumentValueError("{@optimizer:subject} must update Parameters of {@network}, but '{name}' is not "
                                     "one of them (an optimizer built over another network?).", name=param.name)

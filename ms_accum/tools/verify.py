"""verify_equivalence: does the executor's own path, with the options a run trains with, give the updates of one
K-times larger batch?"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn

from .._choices import AUTO_STRUCTURE, PARTIAL_WINDOWS, REDUCTIONS, STRUCTURES, TIMED_STRUCTURES
from .._validation import (LIBRARY, ArgumentError, ArgumentValueError, Words, check_isinstance, check_positive_float,
                           check_positive_int, check_value_in, door)
from ..core.columns import check_columns
from ..core.losses import check_loss_output, window_reduction
from ..core.dropout import uncovered_cells
from ..core.inference import in_inference
from ..core.parallel import data_parallel_info
from ..train.distributed import all_reduce_sum
from ..train.executor import GradientAccumulation
from ..train.options import GuardOptions, StatisticsOptions, WindowOptions
from .causes import (Cause, batchnorm_cells, explain, miscounted_steps, skipped_window, stochastic_cells,
                     uncleared_buffer, uncombined_ranks)
from .reference import BIG_BATCH, Reference

ALL = "all"  # `structure="all"`: every structure the options allow, one verdict each
VERIFIED_STRUCTURES = TIMED_STRUCTURES + ("cached",)


@dataclass
class EquivalenceReport:
    """The executor's windows against as many large-batch updates, after each: for one structure, or for every one
    (``structure="all"``: `by_structure`).

    Attributes:
        accumulate_step (int): K, the number of micro-batches the batch was split into.
        max_abs_diff (float): The largest absolute difference over all parameters and windows.
        max_rel_diff (float): The largest ``|acc - ref| / (|ref| + atol)`` over all parameters and windows.
        rtol (float): The relative tolerance compared with.
        atol (float): The absolute tolerance compared with.
        per_parameter (dict): name -> (max abs diff, max rel diff), each the largest over all windows.
        moved_between_updates (list): Parameters that changed before a window was full, in any window (must be empty).
        passed (bool): After every window every parameter is allclose(rtol, atol) to the reference's, none moved
            between updates and no window was skipped.
        causes (list[Cause]): When it failed, why, each with its evidence and fix (`ms_accum.tools.causes`), found at
            the first window that differs, from the window's gradient as the structure left it in its buffer.
        inference_mode (list): Stochastic layers whose masks ms_accum does not draw (MindSpore's dropout on GPU and
            Ascend, a random function in a `construct`), run as in inference for both: named, since a mask drawn by
            MindSpore's kernels can never be drawn again.
        windows (int): How many windows were compared with as many large-batch updates, the partial one included.
        first_failed_window (int, optional): The first window (1-based, the partial one last) that differs; None when
            it passed.
        per_window (list): (max abs diff, max rel diff) over all parameters after each window, in order.
        structure (str): The structure verified (``"auto"`` resolved), or ``"all"``.
        ranks (int): The data-parallel ranks the window ran on (1 stand-alone); every rank reports the same verdict.
        reference (str): What the windows were compared with: one step on the large batch, or (dropout drawn by
            ms_accum) the micro-batches' gradients with the masks the window drew, combined apart from the window's
            machinery.
        decided_by (str, optional): Which tolerance passed it: ``"rtol"`` (every difference within rtol alone),
            ``"atol"`` (within atol alone, the relative ones beyond rtol) or ``"rtol and atol"``; None when it failed.
        partial_window (int, optional): The micro-batches of the partial window compared last (an epoch's last,
            ``partial_window="apply"``, with more than one window); None when none was.
        skipped (list): Windows (1-based) that the executor skipped as not finite.
        by_structure (dict): With ``structure="all"``, each verified structure's report.
        refused (dict): With ``structure="all"``, each structure that refuses these options, with its refusal (the
            error `GradientAccumulation` raises: ``str`` says it).
    """

    accumulate_step: int
    max_abs_diff: float
    max_rel_diff: float
    rtol: float
    atol: float
    per_parameter: Dict[str, tuple] = field(default_factory=dict)
    moved_between_updates: list = field(default_factory=list)
    passed: bool = False
    causes: List[Cause] = field(default_factory=list)
    inference_mode: list = field(default_factory=list)
    windows: int = 1
    first_failed_window: Optional[int] = None
    per_window: List[Tuple[float, float]] = field(default_factory=list)
    structure: str = AUTO_STRUCTURE
    ranks: int = 1
    reference: str = BIG_BATCH
    decided_by: Optional[str] = None
    partial_window: Optional[int] = None
    skipped: list = field(default_factory=list)
    by_structure: Dict[str, "EquivalenceReport"] = field(default_factory=dict)
    refused: Dict[str, ArgumentError] = field(default_factory=dict)

    def verdict(self) -> str:
        """The one-line verdict: the structure, the ranks, what was compared, and which tolerance decided."""
        passed = "PASSED" if self.passed else "FAILED"
        ranks = "1 process" if self.ranks == 1 else f"{self.ranks} ranks"
        full = self.windows - bool(self.partial_window)
        partial = f" and a partial window of {self.partial_window}" if self.partial_window else ""
        where = (f"window {self.first_failed_window} of {self.windows} first differs, "
                 if self.first_failed_window is not None else "")
        return (f"{passed} ({self.structure}, {ranks}): {full} window{'s' if full != 1 else ''} of "
                f"{self.accumulate_step} accumulated micro-batches{partial} vs {self.windows} big-batch "
                f"step{'s' if self.windows != 1 else ''}: {where}"
                f"max abs diff {self.max_abs_diff:.3e}, max rel diff {self.max_rel_diff:.3e} {self._tolerance()}")

    def _tolerance(self) -> str:
        rtol, atol = f"rtol {self.rtol:g}", f"atol {self.atol:g}"
        if self.decided_by == "rtol":
            return f"(passed by {rtol} alone; {atol} not needed)"
        if self.decided_by == "atol":
            return f"(passed by {atol}: the relative differences exceed {rtol})"
        if self.decided_by is not None:
            return f"(passed by {rtol} and {atol} together)"
        return f"(beyond {rtol} x |reference| + {atol})"

    def __str__(self) -> str:
        return self.text()

    def text(self, words: Words = LIBRARY) -> str:
        """The report as `print` shows it, a refusal said in `words` (a command line's flags)."""
        if self.structure == ALL:
            lines = [f"{'PASSED' if self.passed else 'FAILED'}: {len(self.by_structure)} structure(s) verified"]
            lines += [str(report) for report in self.by_structure.values()]
            lines += [f"not verified ({name}): {refusal.render(words)}" for name, refusal in self.refused.items()]
            return "\n".join(lines)
        lines = [self.verdict()]
        if not self.passed and len(self.per_window) > 1:
            lines.append(f"max abs diff after window {', '.join(map(str, range(1, len(self.per_window) + 1)))}: "
                         f"{', '.join(f'{abs_diff:.3e}' for abs_diff, _ in self.per_window)}")
        if self.moved_between_updates:
            lines.append(f"parameters moved before the window was full: {self.moved_between_updates}")
        if self.reference != BIG_BATCH:
            lines.append(f"compared with {self.reference}")
        if self.inference_mode:
            lines.append(f"compared with {', '.join(self.inference_mode)} in inference mode: their masks come from "
                         f"MindSpore's kernels, which no API draws again")
        lines += [str(cause) for cause in self.causes]
        return "\n".join(lines)


@door("verify_equivalence")
def verify_equivalence(network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer, inputs: Sequence,
                       accumulate_step: int, rtol: float = 1e-5, atol: float = 1e-6,
                       reduction: Optional[str] = None, structure: str = "auto", windows: int = 3, *,
                       window: Optional[WindowOptions] = None, guard: Optional[GuardOptions] = None,
                       statistics: Optional[StatisticsOptions] = None, shard_optimizer=False,
                       partial_window: str = "apply") -> EquivalenceReport:
    r"""
    Trains `windows` windows of `accumulate_step` micro-batches through the executor's own path, with the options a
    run trains with, and compares the parameters after each with as many updates on the whole batch.

    The window is trained exactly as `GradientAccumulation` trains it: the executor is built from `network`,
    `loss_fn`, `optimizer` and the options (`structure`, `window`, `guard`, `statistics`, `shard_optimizer`), and its
    structure runs each window (its Cells, its buffer, its closer; the stacking and padding of ``"window"``; the
    bucketed all-reduce and the sharded optimizer in data parallel). The batch `inputs` is split along its first axis
    into `accumulate_step` micro-batches (of unequal size when it does not divide); every window trains the same
    batch, so each is compared with a step on the same data, and what a later window adds is the state carried from
    one update to the next: the buffer's clear, the optimizer's state, a learning rate that moves with its step.
    With ``partial_window="apply"``, as `train_process` applies an epoch's last, incomplete window, the last window
    holds the first K-1 micro-batches only, compared with a step on those samples.

    The reference is built apart from the window's machinery, with the same meaning: the large batch's gradient,
    divided as the reduction says, clipped by its global norm when `window` clips, unscaled (a loss scale does not
    change an update), stepped by `optimizer`. Where ms_accum draws the dropout masks (its seeded dropout on CPU), the
    comparison runs in training mode: the reference runs the large batch through the network one micro-batch after
    another, each drawing the masks the window drew, and takes one loss of their outputs (`EquivalenceReport.reference`
    says so). Random ops ms_accum does not draw run as in inference for both, named in
    `inference_mode`. Under msrun (`ms_accum.init_data_parallel` first), each rank trains its share of every
    micro-batch (the global batch is `inputs`, the same on every rank), the window is all-reduced as in training, and
    every rank reports the same verdict over all ranks. The network, the optimizer and the loss scaler are left
    exactly as they were.

    Float32 sums in another order differ by rounding, which Adam's first step (about ``lr * g / (|g| + eps)``) can
    magnify to a good part of `lr` where a gradient is within rounding of zero: verify with `nn.SGD` or `nn.Momentum`.

    Args:
        network (nn.Cell): Your network.
        loss_fn (nn.Cell, optional): Your loss, a mean or a sum over the batch, ``loss_fn(output, *labels)`` on the
            batch's last columns; None for a network that computes its own loss from all the columns.
        optimizer (nn.Optimizer): Your optimizer over `network`'s parameters.
        inputs (Sequence[Union[Tensor, numpy.ndarray]]): One batch of any number of columns, e.g. ``(data, label)``
            or ``(input_ids, attention_mask, token_type_ids, label)``: the network takes the first ones, in order.
        accumulate_step (int): K. Must not exceed the batch size (over the ranks: each micro-batch needs a sample on
            every rank).
        rtol (float): Relative tolerance. Default: ``1e-5``.
        atol (float): Absolute tolerance. Default: ``1e-6``.
        reduction (str): How micro-batches are weighted, as `WindowOptions.reduction` (give one of the two). With
            ``"weighted_mean"`` `loss_fn` returns ``(loss, weight)`` (e.g. `TokenCrossEntropy`) and the large batch
            trains its `loss`, the mean over all its items. Default: ``None``, what `loss_fn` says it computes.
        structure (str): The executor's structure to verify, as `GradientAccumulation` takes it (``"auto"``: the one
            it runs), or ``"all"``: each structure, one verdict each (`EquivalenceReport.by_structure`; those that
            refuse these options are listed in `refused`). Default: ``"auto"``.
        windows (int): How many windows are compared with as many large-batch updates (the optimizer steps as many
            times). One checks a single update; a second is the first to start from a cleared buffer and an updated
            optimizer. Default: ``3``.
        window (WindowOptions, optional): The executor's window options: reduction, clipping, buffer dtype.
        guard (GuardOptions, optional): The executor's guard: policy, loss scaler (a finite window is applied, so the
            reference is the unscaled update), stop.
        statistics (StatisticsOptions, optional): The norms and the noise scale measured in the graphs; measuring
            does not change an update. `skip_outliers` has no large-batch meaning and is refused.
        shard_optimizer (Union[bool, Callable]): As `GradientAccumulation`'s, in data parallel. Default: ``False``.
        partial_window (str): ``"apply"`` (default): with more than one window, the last holds K-1 micro-batches,
            as an epoch's last partial window that `train_process` applies; ``"drop"``: every window is full.

    Returns:
        EquivalenceReport; `print` it for the verdict.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `accumulate_step` or `windows` is not positive, `accumulate_step` exceeds the batch size, the
            inputs disagree in batch size, `reduction` is unknown, given twice differently, or does not fit what
            `loss_fn` returns, `statistics` skips outliers, or the executor refuses the options for the structure.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> from ms_accum import verify_equivalence
        >>> net = nn.Dense(4, 2)
        >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        >>> report = verify_equivalence(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9), (x, y), 4)
        >>> report.passed, report.structure, report.windows, report.partial_window
        (True, 'three_graphs', 3, 3)
        >>> print(report.verdict().split(":")[0])
        PASSED (three_graphs, 1 process)
    """
    _check_types(network, loss_fn, optimizer, inputs)
    accumulate_step = check_positive_int(accumulate_step, "accumulate_step")
    windows = check_positive_int(windows, "windows")
    rtol, atol = check_positive_float(rtol, "rtol"), check_positive_float(atol, "atol")
    check_value_in(structure, "structure", STRUCTURES + (ALL,))
    check_value_in(partial_window, "partial_window", PARTIAL_WINDOWS)
    options = _options(reduction, window, guard, statistics)
    parallel = data_parallel_info()
    batch = _split(inputs, accumulate_step, parallel, partial_window == "apply")

    def build(name: str) -> GradientAccumulation:
        return GradientAccumulation(network, loss_fn, optimizer, structure=name, window=options[0], guard=options[1],
                                    statistics=options[2], shard_optimizer=shard_optimizer)

    reports, refused = {}, {}
    with in_inference(network, []):  # every cell's training flag back afterwards: the executor sets them to train
        for name in VERIFIED_STRUCTURES if structure == ALL else [structure]:
            try:
                executor = build(name)
            except ArgumentError as err:
                if structure != ALL:
                    raise
                refused[name] = err  # this structure cannot train these options: said, not verified
                continue
            comparison = _Comparison(executor, batch, parallel, options[0].reduction)
            reports[executor.structure] = comparison.report(windows, rtol, atol)
    if not reports:  # every structure refuses these options: the first refusal says why
        raise next(iter(refused.values()))
    return _all(reports, refused, rtol, atol) if structure == ALL else reports[executor.structure]


def _check_types(network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer, inputs: Sequence) -> None:
    check_isinstance(network, "network", nn.Cell)
    if loss_fn is not None:  # None: the network computes its own loss from all the columns
        check_isinstance(loss_fn, "loss_fn", nn.Cell)
    check_isinstance(optimizer, "optimizer", nn.Optimizer)
    check_isinstance(inputs, "inputs", (tuple, list))


def _options(reduction: Optional[str], window: Optional[WindowOptions], guard: Optional[GuardOptions],
             statistics: Optional[StatisticsOptions]) -> Tuple[WindowOptions, GuardOptions, StatisticsOptions]:
    """The executor's options as verify takes them: `reduction` moved into the window's, and what has no large-batch
    meaning refused."""
    window = WindowOptions() if window is None else check_isinstance(window, "window", WindowOptions)
    guard = GuardOptions() if guard is None else check_isinstance(guard, "guard", GuardOptions)
    statistics = StatisticsOptions() if statistics is None else \
        check_isinstance(statistics, "statistics", StatisticsOptions)
    if reduction is not None:
        check_value_in(reduction, "reduction", REDUCTIONS)
        if window.reduction not in (None, reduction):
            raise ArgumentValueError("{@reduction:subject} and window.reduction must agree, but got '{reduction}' and "
                                     "'{other}'.", reduction=reduction, other=window.reduction)
        window = WindowOptions(reduction, window.clip_norm, window.buffer_dtype)
    if statistics.skip_outliers is not None:
        raise ArgumentValueError("{@skip_outliers:subject} has no large-batch meaning, but got {value}: it leaves "
                                 "micro-batches out of their window by the running statistics of earlier ones, which "
                                 "one step on the whole batch does not have; verify without it.",
                                 value=statistics.skip_outliers)
    return window, guard, statistics


@dataclass(frozen=True)
class _Window:
    """One window to compare: the large batch it equals, and this rank's share of each of its micro-batches."""

    big: List[np.ndarray]
    shares: List[Tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class _Batch:
    """The windows verify trains, full ones then the partial one (if any), and its size."""

    windows: List[_Window]
    accumulate_step: int
    partial: Optional[int]
    columns: list

    def plan(self, windows: int) -> List[_Window]:
        """`windows` windows: full ones, the last partial when there is one and more than one window."""
        full, *partial = self.windows
        if windows == 1:
            return [full]
        return [full] * (windows - len(partial)) + partial


def _split(inputs: Sequence, accumulate_step: int, parallel, partial: bool) -> _Batch:
    arrays = [x.asnumpy() if isinstance(x, Tensor) else np.asarray(x) for x in inputs]
    if not arrays or len({a.shape[0] if a.ndim else -1 for a in arrays}) != 1 or arrays[0].ndim == 0:
        raise ArgumentValueError("{@inputs:subject} must be arrays sharing their first (batch) axis, but got shapes "
                                 "{value}.", value=[a.shape for a in arrays])
    ranks = 1 if parallel is None else parallel.group_size
    if accumulate_step > arrays[0].shape[0]:
        raise ArgumentValueError("{@accumulate_step:subject} must not exceed the batch size {value}, but got "
                                 "{accumulate_step}.", value=arrays[0].shape[0], accumulate_step=accumulate_step)
    if accumulate_step * ranks > arrays[0].shape[0]:  # each micro-batch needs a sample on every rank
        raise ArgumentValueError("{@accumulate_step:subject} must not exceed the batch size {size} over {ranks} ranks "
                                 "({limit}), but got {accumulate_step}.", size=arrays[0].shape[0], ranks=ranks,
                                 limit=arrays[0].shape[0] // ranks, accumulate_step=accumulate_step)
    micro_batches = list(zip(*[np.array_split(a, accumulate_step) for a in arrays]))
    rank = 0 if parallel is None else parallel.rank
    shares = [tuple(np.array_split(column, ranks)[rank] for column in micro) for micro in micro_batches]
    windows = [_Window(arrays, shares)]
    partial = accumulate_step - 1 if partial and accumulate_step > 1 else None
    if partial:
        big = [np.concatenate(column) for column in zip(*micro_batches[:partial])]
        windows.append(_Window(big, shares[:partial]))
    return _Batch(windows, accumulate_step, partial, [a.shape for a in arrays])


def _values(params) -> List[np.ndarray]:
    return [p.asnumpy().copy() for p in params]


def _moved(params, before: List[np.ndarray]) -> List[str]:
    """The names of `params` that differ from their values `before`."""
    return [p.name for p, value in zip(params, before) if not np.array_equal(p.asnumpy(), value)]


def _step_count(optimizer: nn.Optimizer) -> int:
    """The optimizer's ``global_step``, which a learning rate that moves (a list, a schedule) is read at."""
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])


def _left_in_buffer(buffer) -> float:
    """The largest magnitude a closed window left in `buffer`'s sums and counters: exactly 0 once its clear ran
    (``x - x`` is 0 for finite x)."""
    held = [*buffer.grad_sum, buffer.micro_batch_count, buffer.num_samples]
    return max(float(np.abs(h.asnumpy().astype(np.float64)).max(initial=0.0)) for h in held)


@dataclass
class _Differences:
    """One window's parameters against the reference's: per parameter (max abs, max rel), and whether every value
    is within rtol alone, within atol alone, within both."""

    per_parameter: Dict[str, Tuple[float, float]]
    within: bool
    within_rtol: bool
    within_atol: bool

    @classmethod
    def of(cls, params, expected: List[np.ndarray], actual: List[np.ndarray], rtol: float,
           atol: float) -> "_Differences":
        found, within, within_rtol = {}, True, True
        for p, ref, acc in zip(params, expected, actual):
            ref, acc = ref.astype(np.float64), acc.astype(np.float64)
            abs_diff = np.abs(acc - ref)
            found[p.name] = (float(abs_diff.max(initial=0.0)),
                             float((abs_diff / (np.abs(ref) + atol)).max(initial=0.0)))
            within = within and bool(np.all(abs_diff <= atol + rtol * np.abs(ref)))
            within_rtol = within_rtol and bool(np.all(abs_diff <= rtol * np.abs(ref)))
        return cls(found, within, within_rtol, max(a for a, _ in found.values()) <= atol)

    def as_row(self) -> np.ndarray:
        """What the ranks agree on, as numbers whose maximum over the ranks is the group's."""
        values = [v for pair in self.per_parameter.values() for v in pair]
        return np.array(values + [not self.within, not self.within_rtol, not self.within_atol], np.float64)

    def from_row(self, row: np.ndarray) -> "_Differences":
        names = list(self.per_parameter)
        pairs = {name: (float(row[2 * i]), float(row[2 * i + 1])) for i, name in enumerate(names)}
        return _Differences(pairs, not row[-3], not row[-2], not row[-1])


class _Ranks:
    """What every rank holds the same, through small all-reduces in data parallel (stand-alone, the values as they
    are): sums, the largest of each value over the ranks, rank 0's values."""

    def __init__(self, parallel) -> None:
        self.parallel = parallel
        self.count = 1 if parallel is None else parallel.group_size

    def sum(self, arrays: List[np.ndarray]) -> List[np.ndarray]:
        """Each of `arrays` summed over the ranks, float64 (one float32 all-reduce of them all)."""
        if self.parallel is None:
            return arrays
        summed = all_reduce_sum(Tensor(np.concatenate([a.ravel() for a in arrays]).astype(np.float32))).asnumpy()
        bounds = np.cumsum([0] + [a.size for a in arrays])
        return [summed[lo:hi].reshape(a.shape).astype(np.float64) for a, lo, hi in zip(arrays, bounds, bounds[1:])]

    def maxima(self, row: np.ndarray) -> np.ndarray:
        if self.parallel is None:
            return row
        slots = np.zeros((self.count, row.size))
        slots[self.parallel.rank] = row  # each rank's row in its own slot: the sum holds them all
        return self.sum([slots])[0].max(axis=0)

    def from_rank_0(self, arrays: List[np.ndarray]) -> List[np.ndarray]:
        if self.parallel is None or self.parallel.is_main:
            return self.sum(arrays)
        return self.sum([np.zeros_like(a) for a in arrays])


@dataclass
class _Run:
    """What a run of updates left after each: the parameters and the optimizer's step count; for the executor's run
    also the parameters that moved before each window closed, what its buffer still held after it, whether it was
    applied, and the window's gradient where it first differed."""

    params: List[List[np.ndarray]] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    moved: List[List[str]] = field(default_factory=list)
    left: List[float] = field(default_factory=list)
    applied: List[bool] = field(default_factory=list)
    offsets: List[List[int]] = field(default_factory=list)


class _Start:
    """Everything a training changes, as it was (the network, the optimizer's state, the executor's buffer, the
    loss scale, the dropout streams): each ``with`` block puts it back."""

    def __init__(self, executor: GradientAccumulation, optimizer: nn.Optimizer) -> None:
        owned = [*executor.network.get_parameters(), *(p for _, p in optimizer.parameters_and_names()),
                 *executor.state.get_parameters()]
        self.params: List[Parameter] = list({id(p): p for p in owned}.values())
        self.values = {id(p): p.asnumpy().copy() for p in self.params}

    def __enter__(self) -> "_Start":
        return self

    def __exit__(self, *raised) -> bool:
        for p in self.params:
            p.set_data(Tensor(self.values[id(p)]))
        return False


class _Comparison:
    """The reference's updates and the executor's windows, each run from the same start, and why they differ."""

    def __init__(self, executor: GradientAccumulation, batch: _Batch, parallel, reduction: Optional[str]) -> None:
        self.executor, self.batch = executor, batch
        self.parts = executor.parts
        self.params = list(self.parts.optimizer.parameters)
        check_columns(self.parts.net_with_loss, batch.columns, "inputs")
        # What the window means, the user's reduction (a structure may accumulate by another rule of its own).
        reduction = window_reduction(self.parts.loss_fn, reduction)
        check_loss_output(self.parts.net_with_loss, [Tensor(a) for a in batch.windows[0].shares[0]], reduction,
                          arg_name=self.parts.loss_arg)
        self.ranks = _Ranks(parallel)
        streams = executor.dropout
        # The masks ms_accum draws are drawn again for the reference; the rest run as in inference, named.
        stochastic = stochastic_cells(executor.network)
        drawn = [path for path in stochastic if _drawn(executor.network, path, streams)]
        uncovered = uncovered_cells(executor.network, streams)
        self.held = [path for path in stochastic if path not in drawn] + \
            [path for path in uncovered if path not in stochastic]
        same_masks = bool(drawn)
        self.reference = Reference(self.parts.net_with_loss, self.parts.network, self.parts.loss_fn,
                                   self.parts.optimizer, reduction, self.parts.clip_norm,
                                   executor.buffer.reducer.sum_divisor, same_masks,
                                   None if parallel is None else self.ranks.sum)
        self.reference.prepare({len(window.shares) for window in batch.windows})
        self.start = _Start(executor, self.parts.optimizer)
        self.hold = None  # `in_inference`'s, while `report` runs: called after every `set_train`
        self.captured: List[np.ndarray] = []  # the open window's gradient as the structure's check left it

    def report(self, windows: int, rtol: float, atol: float) -> EquivalenceReport:
        plan = self.batch.plan(windows)
        with in_inference(self.executor.network, self.held) as self.hold:
            expected = self._reference_run(plan)
            actual, kept = self._executor_run(plan, expected, rtol, atol)
        differences = [_Differences.of(self.params, e, a, rtol, atol) for e, a in zip(expected.params, actual.params)]
        local = np.concatenate([d.as_row() for d in differences] +
                               [np.array([bool(m) for m in actual.moved] + [not a for a in actual.applied], float)])
        agreed = self.ranks.maxima(local)  # every rank decides on the group's largest differences
        width = differences[0].as_row().size
        differences = [d.from_row(agreed[i * width:(i + 1) * width]) for i, d in enumerate(differences)]
        moved_flags = agreed[len(plan) * width:len(plan) * (width + 1)]
        skipped_flags = agreed[len(plan) * (width + 1):]
        failed = [i for i, d in enumerate(differences) if not d.within or moved_flags[i] or skipped_flags[i]]
        first = failed[0] + 1 if failed else None  # 1-based, as the report says windows
        maxima = [(max(a for a, _ in d.per_parameter.values()), max(r for _, r in d.per_parameter.values()))
                  for d in differences]
        causes = [] if first is None else self._causes(plan, expected, actual, first, kept, maxima[first - 1][0],
                                                       rtol, atol)
        decided = None if first is not None else ("rtol" if all(d.within_rtol for d in differences) else
                                                  "atol" if all(d.within_atol for d in differences) else
                                                  "rtol and atol")
        per_parameter = {name: tuple(max(d.per_parameter[name][i] for d in differences) for i in (0, 1))
                         for name in differences[0].per_parameter}
        return EquivalenceReport(
            accumulate_step=self.batch.accumulate_step, max_abs_diff=max(a for a, _ in maxima),
            max_rel_diff=max(r for _, r in maxima), rtol=rtol, atol=atol, per_parameter=per_parameter,
            moved_between_updates=sorted(set().union(*actual.moved)), passed=first is None, causes=causes,
            inference_mode=self.held, windows=windows, first_failed_window=first, per_window=maxima,
            structure=self.executor.structure, ranks=self.ranks.count, reference=self.reference.kind,
            decided_by=decided, partial_window=self.batch.partial if len(plan) > 1 else None,
            skipped=[i + 1 for i, flag in enumerate(skipped_flags) if flag])

    def _drawing(self):
        """The executor's dropout streams drawing, from where the start left them."""
        return self.executor.dropout.drawing()

    def _reference_run(self, plan: List[_Window]) -> _Run:
        run = _Run()
        with self.start, self._drawing():
            self.reference.set_train()
            self.hold()
            for window in plan:
                self.reference.step(window.big, window.shares)
                run.params.append(_values(self.params))
                run.steps.append(_step_count(self.parts.optimizer))
        return run

    def _executor_run(self, plan: List[_Window], expected: _Run, rtol: float, atol: float):
        """The windows of `plan` through the executor's structure, its buffer and its optimizer carrying their state
        from each window into the next, as in training; returns the run and the gradient of the first window whose
        parameters differ from `expected` (as the structure's check left it in the buffer), or None."""
        run, kept = _Run(), None
        structure = self.executor.runner(self.batch.accumulate_step)
        closer, follow = structure.closer, structure.closer.follow

        def capture(verdict):  # the window's gradient, checked (reduced, divided, unscaled, clipped), before its step
            self.captured = [g.asnumpy().astype(np.float64) for g in self.parts.buffer.grad_sum]
            return follow(verdict)

        closer.follow = capture  # on the structure's own closer, which this comparison built
        try:
            with self.start, self._drawing():
                structure.reset()
                self.hold()
                before = _values(self.params)
                for index, window in enumerate(plan):
                    run.offsets.append([op.offset for op in self.executor.dropout.ops])
                    moved: List[str] = []
                    trained = structure.run(self._fed(window, before, moved), len(window.shares))
                    before = _values(self.params)
                    run.moved.append(moved)
                    run.params.append(before)
                    run.steps.append(_step_count(self.parts.optimizer))
                    run.left.append(_left_in_buffer(self.parts.buffer))
                    run.applied.append(trained.applied)
                    if kept is None and not all(np.allclose(x, r, rtol=rtol, atol=atol)
                                                for r, x in zip(expected.params[index], before)):
                        kept = self.captured
        finally:
            del closer.follow
        return run, kept

    def _fed(self, window: _Window, before: List[np.ndarray], moved: List[str]):
        """The window's micro-batches as the structure reads them, noting the parameters that moved from `before`
        each time another is asked for (a structure that reads them all first moves nothing in between)."""
        for index, share in enumerate(window.shares):
            if index:
                moved += [name for name in _moved(self.params, before) if name not in moved]
            yield tuple(Tensor(a) for a in share)

    def _causes(self, plan: List[_Window], expected: _Run, actual: _Run, first: int, kept, parameter_diff: float,
                rtol: float, atol: float) -> List[Cause]:
        """Why window `first`, the first that differs, does: what the earlier windows carried into it, a skip, or
        else the layers and the window's gradient, as the structure left it, against the reference's from the
        parameters the window started from."""
        carried = _carried(expected, actual, first)
        if carried or actual.moved[first - 1]:
            return carried
        if not actual.applied[first - 1]:
            return [skipped_window(first)]
        with self.start, self._drawing():
            if first > 1:  # the reference's gradient where the window started: the executor's parameters then
                for p, value in zip(self.params, actual.params[first - 2]):
                    p.set_data(Tensor(value))
            for op, offset in zip(self.executor.dropout.ops, actual.offsets[first - 1]):
                op.set(op.seed, offset)
            self.reference.set_train()
            self.hold()
            window = plan[first - 1]
            reference = self.reference.window_gradient(window.big, window.shares)
        # A rank that saw no difference of its own holds no gradient of the window: the reference's stands in. Every
        # rank explains rank 0's, so all say the same; ranks whose windows differ from it were never combined.
        grads = self.ranks.from_rank_0(reference if kept is None else kept)
        apart = self.ranks.maxima(np.array([max(float(np.abs(g - k).max(initial=0.0)) for g, k in zip(grads, kept))
                                            if kept is not None else 0.0]))[0]
        if apart > 0:
            return [uncombined_ranks(first, float(apart))]
        return explain(batchnorm_cells(self.executor.network), grads, reference, self.batch.accumulate_step,
                       parameter_diff, rtol, atol)


def _drawn(network: nn.Cell, path: str, streams) -> bool:
    """Whether the stochastic cell at `path` draws its masks from ms_accum's `streams`."""
    from .._mindspore import dropout_op
    cells = dict(network.cells_and_names())
    cell = cells.get(path) or (cells.get("") if path == type(network).__name__ else None)
    prim = dropout_op(cell) if isinstance(cell, nn.Dropout) else None
    return prim is not None and streams.covers(prim)


def _carried(expected: _Run, actual: _Run, first: int) -> List[Cause]:
    """What the windows before `first` carried into it that a window must not: a buffer its clear did not zero, or
    an optimizer that counted other steps than the big batch's up to it."""
    causes = []
    kept = [window for window in range(1, first) if actual.left[window - 1] > 0]
    if kept:
        causes.append(uncleared_buffer(kept[0], actual.left[kept[0] - 1]))
    counted = [window for window in range(1, first + 1) if actual.steps[window - 1] != expected.steps[window - 1]]
    if counted:
        window = counted[0]
        causes.append(miscounted_steps(window, expected.steps[window - 1], actual.steps[window - 1]))
    return causes


def _all(reports: Dict[str, EquivalenceReport], refused: Dict[str, ArgumentError], rtol: float,
         atol: float) -> EquivalenceReport:
    """One report of every structure's: passed when each verified one passed."""
    first = next(iter(reports.values()))
    return EquivalenceReport(
        accumulate_step=first.accumulate_step, max_abs_diff=max(r.max_abs_diff for r in reports.values()),
        max_rel_diff=max(r.max_rel_diff for r in reports.values()), rtol=rtol, atol=atol,
        passed=all(r.passed for r in reports.values()), windows=first.windows, structure=ALL, ranks=first.ranks,
        inference_mode=first.inference_mode, reference=first.reference, partial_window=first.partial_window,
        by_structure=reports, refused=refused)

"""verify_equivalence: does accumulating K micro-batches give the update of one K-times larger batch?"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn, ops

from .._validation import (ArgumentValueError, check_isinstance, check_positive_float, check_positive_int,
                           check_value_in, door)
from ..core.buffer import RULES
from ..core.inference import in_inference
from .causes import Cause, batchnorm_cells, explain, miscounted_steps, stochastic_cells, uncleared_buffer
from ..graphs.cells import TrainAccumulationCell
from ..graphs.cached import TrainCachedWindowCell
from ..train.options import GuardOptions, StatisticsOptions
from ..train.structures import structure_class
from .._choices import STRUCTURES
from ..core.columns import check_columns, with_loss
from ..core.losses import LossOnly, check_loss_output, window_reduction


@dataclass
class EquivalenceReport:
    """Parameter differences between accumulated windows and big-batch steps, after each of `windows` updates.

    Attributes:
        accumulate_step (int): K, the number of micro-batches the batch was split into.
        max_abs_diff (float): The largest absolute difference over all parameters and windows.
        max_rel_diff (float): The largest ``|acc - ref| / (|ref| + atol)`` over all parameters and windows.
        rtol (float): The relative tolerance compared with.
        atol (float): The absolute tolerance compared with.
        per_parameter (dict): name -> (max abs diff, max rel diff), each the largest over all windows.
        moved_between_updates (list): Parameters that changed before a window was full, in any window (must be
            empty).
        passed (bool): After every window every parameter is allclose(rtol, atol) to the big batch's, and none moved
            between updates.
        causes (list[Cause]): When it failed, why, each with its evidence and fix (`ms_accum.tools.causes`), found at
            the first window that differs.
        inference_mode (list): Stochastic layers (dropout, drop-path) that ran as in inference for both updates,
            which can only be compared without their random masks.
        windows (int): How many windows were compared with as many big-batch steps.
        first_failed_window (int, optional): The first window (1-based) whose parameters differ or moved before it
            was full; None when it passed.
        per_window (list): (max abs diff, max rel diff) over all parameters after each window, in order.
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

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        plural = "s" if self.windows != 1 else ""
        where = (f"window {self.first_failed_window} of {self.windows} first differs, "
                 if self.first_failed_window is not None else "")
        lines = [f"{verdict}: {self.windows} window{plural} of {self.accumulate_step} accumulated micro-batches vs "
                 f"{self.windows} big-batch step{plural}: {where}max abs diff {self.max_abs_diff:.3e}, max rel diff "
                 f"{self.max_rel_diff:.3e} (rtol {self.rtol:g}, atol {self.atol:g})"]
        if not self.passed and len(self.per_window) > 1:
            lines.append(f"max abs diff after window {', '.join(map(str, range(1, len(self.per_window) + 1)))}: "
                         f"{', '.join(f'{abs_diff:.3e}' for abs_diff, _ in self.per_window)}")
        if self.moved_between_updates:
            lines.append(f"parameters moved before the window was full: {self.moved_between_updates}")
        if self.inference_mode:
            lines.append(f"compared with {', '.join(self.inference_mode)} in inference mode: a random mask drawn for "
                         f"the big batch never equals the micro-batches' masks")
        lines += [str(cause) for cause in self.causes]
        return "\n".join(lines)


class _Gradient(nn.Cell):
    """The gradient of `network`'s loss with respect to `params`."""

    def __init__(self, network: nn.Cell, params) -> None:
        super().__init__(auto_prefix=False)
        self.network, self.params = network, params
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs):
        return self.grad(self.network, self.params)(*inputs)


@door("verify_equivalence")
def verify_equivalence(network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer, inputs: Sequence,
                       accumulate_step: int, rtol: float = 1e-5, atol: float = 1e-6,
                       reduction: Optional[str] = None, structure: str = "auto",
                       windows: int = 3) -> EquivalenceReport:
    r"""
    Compares `windows` optimizer updates from `accumulate_step` accumulated micro-batches each with as many big-batch
    updates.

    The batch `inputs` is split along its first axis into `accumulate_step` micro-batches (of unequal size when it
    does not divide). From the same starting weights and optimizer state, it trains `windows` steps of
    `nn.TrainOneStepCell` on the whole batch, then `windows` windows of one `TrainAccumulationCell` on the
    micro-batches, and compares the parameters after every window with those after the same number of big-batch
    steps. Every window trains the same batch: a window is compared with a step on the same data, and what a later
    window adds is the state carried from one update to the next, which a single window never exercises: the
    buffer's clear after the update, the optimizer's state after it (momentum, Adam's moments), and a learning rate
    that moves with the optimizer's step (a list or a `LearningRateSchedule`: `optimizer` is used as given). The
    report names the first window that differs. The network and the optimizer are left exactly as they were (its
    ``global_step`` and moments included).

    Float32 sums in another order differ by rounding, which Adam's first step (about ``lr * g / (|g| + eps)``) can
    magnify to a good part of `lr` where a gradient is within rounding of zero: verify with `nn.SGD` or `nn.Momentum`.

    Args:
        network (nn.Cell): Your network.
        loss_fn (nn.Cell, optional): Your loss, a mean or a sum over the batch, ``loss_fn(output, *labels)`` on the
            batch's last columns; None for a network that computes its own loss from all the columns.
        optimizer (nn.Optimizer): Your optimizer over `network`'s parameters.
        inputs (Sequence[Union[Tensor, numpy.ndarray]]): One batch of any number of columns, e.g. ``(data, label)``
            or ``(input_ids, attention_mask, token_type_ids, label)``: the network takes the first ones, in order.
        accumulate_step (int): K. Must not exceed the batch size.
        rtol (float): Relative tolerance. Default: ``1e-5``.
        atol (float): Absolute tolerance. Default: ``1e-6``.
        reduction (str): How micro-batches are weighted, as in `AccumulationBuffer`. With ``"weighted_mean"``
            `loss_fn` returns ``(loss, weight)`` (e.g. `TokenCrossEntropy`) and the big batch's step trains its
            `loss`, the mean over all its items. Default: ``None``, what `loss_fn` says it computes (``"sum"`` for a
            MindSpore loss built with ``reduction="sum"``, else ``"mean"``), as `GradientAccumulation` takes it.
        structure (str): The executor's structure. Every one but ``"cached"`` gives the same update, checked through
            `TrainAccumulationCell`; ``"cached"`` checks gradient caching (`TrainCachedWindowCell`: `network` returns
            the outputs, ``loss_fn(outputs, labels)`` runs once on the whole window's), the way to train a loss that
            couples the samples of a batch exactly. Default: ``"auto"``.
        windows (int): How many windows are compared with as many big-batch steps. One checks a single update;
            a second is the first to start from a cleared buffer and an updated optimizer. Default: ``3``.

    Returns:
        EquivalenceReport; `print` it for a one-line verdict.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `accumulate_step` or `windows` is not positive, `accumulate_step` exceeds the batch size, the
            inputs disagree in batch size, or `reduction` is unknown or does not fit what `loss_fn` returns
            (``"weighted_mean"`` needs ``(loss, weight)``, the others a loss alone; found by one eager forward pass,
            `check_loss_output`).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> from ms_accum import verify_equivalence
        >>> net = nn.Dense(4, 2)
        >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        >>> report = verify_equivalence(net, nn.MSELoss(), nn.Adam(net.trainable_params()), (x, y), 4)
        >>> report.passed, report.windows, report.first_failed_window
        (True, 3, None)
    """
    _check_types(network, loss_fn, optimizer, inputs)
    accumulate_step = check_positive_int(accumulate_step, "accumulate_step")
    windows = check_positive_int(windows, "windows")
    rtol, atol = check_positive_float(rtol, "rtol"), check_positive_float(atol, "atol")
    reduction = _checked_reduction(network, loss_fn, reduction, structure)
    comparison = _Comparison(network, loss_fn, optimizer, _split(inputs, accumulate_step), reduction)
    return comparison.report(structure, windows, rtol, atol)


def _check_types(network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer, inputs: Sequence) -> None:
    check_isinstance(network, "network", nn.Cell)
    if loss_fn is not None:  # None: the network computes its own loss from all the columns
        check_isinstance(loss_fn, "loss_fn", nn.Cell)
    check_isinstance(optimizer, "optimizer", nn.Optimizer)
    check_isinstance(inputs, "inputs", (tuple, list))


def _checked_reduction(network: nn.Cell, loss_fn: Optional[nn.Cell], reduction: Optional[str], structure: str) -> str:
    """The window's reduction for `loss_fn` under `structure`, as the executor takes it (the structure's refusals)."""
    kind = structure_class(check_value_in(structure, "structure", STRUCTURES))
    return kind.refuse(network, loss_fn, window_reduction(loss_fn, reduction), GuardOptions(), StatisticsOptions())


@dataclass(frozen=True)
class _Batch:
    """The batch as arrays, and as the K micro-batches they split into along the first axis."""

    arrays: List[np.ndarray]
    micro_batches: List[Tuple[np.ndarray, ...]]


def _split(inputs: Sequence, accumulate_step: int) -> _Batch:
    arrays = [x.asnumpy() if isinstance(x, Tensor) else np.asarray(x) for x in inputs]
    if not arrays or len({a.shape[0] if a.ndim else -1 for a in arrays}) != 1 or arrays[0].ndim == 0:
        raise ArgumentValueError("{@inputs:subject} must be arrays sharing their first (batch) axis, but got shapes "
                                 "{value}.", value=[a.shape for a in arrays])
    if accumulate_step > arrays[0].shape[0]:
        raise ArgumentValueError("{@accumulate_step:subject} must not exceed the batch size {value}, but got "
                                 "{accumulate_step}.", value=arrays[0].shape[0], accumulate_step=accumulate_step)
    return _Batch(arrays=arrays, micro_batches=list(zip(*[np.array_split(a, accumulate_step) for a in arrays])))


def _tensors(arrays) -> List[Tensor]:
    return [Tensor(a) for a in arrays]


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


def _differences(params, expected: List[np.ndarray], actual: List[np.ndarray],
                 atol: float) -> Dict[str, Tuple[float, float]]:
    """Each parameter's name -> (max abs diff, max rel diff) of its `actual` values against the `expected` ones."""
    found = {}
    for p, ref, acc in zip(params, expected, actual):
        ref, acc = ref.astype(np.float64), acc.astype(np.float64)
        abs_diff = np.abs(acc - ref)
        found[p.name] = (float(abs_diff.max(initial=0.0)), float((abs_diff / (np.abs(ref) + atol)).max(initial=0.0)))
    return found


class _Start:
    """Everything the updates change, BatchNorm's statistics and the optimizer's ``global_step`` and moments included,
    as it was: each ``with`` block puts it back."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer) -> None:
        owned = [*network.get_parameters(), *(p for _, p in optimizer.parameters_and_names())]
        self.params = list({id(p): p for p in owned}.values())
        self.values = {id(p): p.asnumpy().copy() for p in self.params}

    def __enter__(self) -> "_Start":
        return self

    def __exit__(self, *raised) -> bool:
        for p in self.params:
            p.set_data(Tensor(self.values[id(p)]))
        return False


@dataclass
class _Run:
    """What a run of updates left after each: the parameters and the optimizer's step count; for the accumulating
    run also the parameters that moved before each window closed, and what its buffer still held after it."""

    params: List[List[np.ndarray]] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    moved: List[List[str]] = field(default_factory=list)
    left: List[float] = field(default_factory=list)


class _Comparison:
    """The big batch's updates and the windows', each run from the same start, and why they differ."""

    def __init__(self, network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer, batch: _Batch,
                 reduction: str) -> None:
        self.network, self.loss_fn, self.optimizer, self.batch = network, loss_fn, optimizer, batch
        self.reduction = reduction
        self.with_loss = with_loss(network, loss_fn)
        check_columns(self.with_loss, [a.shape for a in batch.arrays], "inputs")
        check_loss_output(self.with_loss, _tensors(batch.micro_batches[0]), reduction, arg_name="loss_fn")
        self.loss_only = LossOnly(self.with_loss) if reduction == "weighted_mean" else self.with_loss
        self.start = _Start(network, optimizer)
        self.hold = None  # `in_inference`'s, while `report` runs: called after every `set_train`

    def report(self, structure: str, windows: int, rtol: float, atol: float) -> EquivalenceReport:
        """Both runs of `windows` updates, with the stochastic layers held as in inference (a mask drawn for the big
        batch never equals the micro-batches' masks), compared after each update within `rtol` and `atol`."""
        stochastic = stochastic_cells(self.network)
        with in_inference(self.network, stochastic) as self.hold:
            expected = self._big_batch_steps(windows)
            actual = self._windows(structure, windows)
            per_window = [_differences(self.optimizer.parameters, e, a, atol)
                          for e, a in zip(expected.params, actual.params)]
            failed = [window for window, (e, a, moved) in enumerate(zip(expected.params, actual.params, actual.moved))
                      if moved or not all(np.allclose(x, r, rtol=rtol, atol=atol) for r, x in zip(e, a))]
            first = failed[0] + 1 if failed else None  # 1-based, as the report says windows
            maxima = [(max(a for a, _ in found.values()), max(r for _, r in found.values())) for found in per_window]
            causes = [] if first is None else self._causes(structure, expected, actual, first,
                                                           maxima[first - 1][0], rtol, atol)
        per_parameter = {name: tuple(max(found[name][i] for found in per_window) for i in (0, 1))
                         for name in per_window[0]}
        return EquivalenceReport(accumulate_step=len(self.batch.micro_batches),
                                 max_abs_diff=max(a for a, _ in maxima), max_rel_diff=max(r for _, r in maxima),
                                 rtol=rtol, atol=atol, per_parameter=per_parameter,
                                 moved_between_updates=sorted(set().union(*actual.moved)), passed=first is None,
                                 causes=causes, inference_mode=stochastic, windows=windows,
                                 first_failed_window=first, per_window=maxima)

    def _big_batch_steps(self, windows: int) -> _Run:
        run = _Run()
        with self.start:
            reference = nn.TrainOneStepCell(self.loss_only, self.optimizer).set_train()
            self.hold()
            for _ in range(windows):
                reference(*_tensors(self.batch.arrays))
                run.params.append(_values(self.optimizer.parameters))
                run.steps.append(_step_count(self.optimizer))
        return run

    def _windows(self, structure: str, windows: int) -> _Run:
        """`windows` windows of one accumulating cell: its buffer and the optimizer carry their state from each
        window into the next, as in training."""
        run = _Run()
        with self.start:
            if structure == "cached":
                cell = TrainCachedWindowCell(self.network, self.loss_fn, self.optimizer).set_train()
            else:
                cell = TrainAccumulationCell(self.with_loss, self.optimizer, len(self.batch.micro_batches),
                                             reduction=self.reduction).set_train()
            self.hold()
            before = _values(self.optimizer.parameters)
            for _ in range(windows):
                run.moved.append(self._window(cell, structure, before))
                before = _values(self.optimizer.parameters)
                run.params.append(before)
                run.steps.append(_step_count(self.optimizer))
                run.left.append(_left_in_buffer(cell.buffer))
        return run

    def _window(self, cell: nn.Cell, structure: str, before: List[np.ndarray]) -> List[str]:
        """Trains one window; returns the parameters that moved from their values `before` it, before it closed."""
        if structure == "cached":  # one call trains the whole window: nothing can move before it closes
            cell.train_window([tuple(_tensors(micro)) for micro in self.batch.micro_batches])
            return []
        moved: List[str] = []
        *opening, last = self.batch.micro_batches
        for micro in opening:
            cell(*_tensors(micro))
            moved += [name for name in _moved(self.optimizer.parameters, before) if name not in moved]
        cell(*_tensors(last))
        return moved

    def _causes(self, structure: str, expected: _Run, actual: _Run, first: int, parameter_diff: float, rtol: float,
                atol: float) -> List[Cause]:
        """Why window `first`, the first that differs, does: what the earlier windows carried into it, or else the
        layers and the gradients from the parameters it started from."""
        carried = _carried(expected, actual, first)
        if carried or actual.moved[first - 1]:
            return carried
        batchnorm = batchnorm_cells(self.network)
        if structure == "cached":  # the loss saw the whole window: only BatchNorm's statistics remain
            return [c for c in explain(batchnorm, [np.zeros(1)], [np.zeros(1)], 1, 0.0, rtol, atol)
                    if c.name.startswith("BatchNorm")]
        with self.start:
            if first > 1:  # the gradients where the window started: the accumulating run's parameters then
                for p, value in zip(self.optimizer.parameters, actual.params[first - 2]):
                    p.set_data(Tensor(value))
            window, big = self._gradients()
        return explain(batchnorm, window, big, len(self.batch.micro_batches), parameter_diff, rtol, atol)

    def _gradients(self) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """The window's gradient as the reduction's rule combines its micro-batches' (float64, on the host: what a
        micro-batch weighs, what the window is divided by, stand-alone) and the big batch's."""
        rule = RULES[self.reduction]()
        gradient = _Gradient(self.loss_only, self.optimizer.parameters).set_train()
        self.hold()
        big = [g.asnumpy().astype(np.float64) for g in gradient(*_tensors(self.batch.arrays))]
        total, weights = [np.zeros_like(b) for b in big], 0.0
        for micro in self.batch.micro_batches:
            inputs = _tensors(micro)
            weight = float(rule.split(self.with_loss(*inputs), inputs[0])[1])
            total = [t + weight * g.asnumpy().astype(np.float64) for t, g in zip(total, gradient(*inputs))]
            weights += weight
        return [t / rule.divisor(weights, 1.0) for t in total], big


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

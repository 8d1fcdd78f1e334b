"""verify_equivalence: does accumulating K micro-batches give the update of one K-times larger batch?"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
from mindspore import Tensor, nn, ops

from .._validation import check_isinstance, check_positive_float, check_positive_int, check_value_in
from ..core.buffer import RULES
from ..core.inference import in_inference
from .causes import Cause, batchnorm_cells, explain, stochastic_cells
from ..graphs.cells import TrainAccumulationCell
from ..graphs.cached import TrainCachedWindowCell, check_cached_options, check_loss_signature
from .._choices import STRUCTURES
from ..core.losses import LossOnly, check_loss_output, window_reduction


@dataclass
class EquivalenceReport:
    """Parameter differences between accumulated micro-batches and one big batch, after one update.

    Attributes:
        accumulate_step (int): K, the number of micro-batches the batch was split into.
        max_abs_diff (float): The largest absolute difference over all parameters.
        max_rel_diff (float): The largest ``|acc - ref| / (|ref| + atol)`` over all parameters.
        per_parameter (dict): name -> (max abs diff, max rel diff).
        moved_between_updates (list): Parameters that changed before the window was full (must be empty).
        passed (bool): Every parameter is allclose(rtol, atol) and none moved between updates.
        causes (list[Cause]): When it failed, why, each with its evidence and fix (`ms_accum.tools.causes`).
        inference_mode (list): Stochastic layers (dropout, drop-path) that ran as in inference for both updates,
            which can only be compared without their random masks.
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

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [f"{verdict}: {self.accumulate_step} accumulated micro-batches vs one big batch: "
                 f"max abs diff {self.max_abs_diff:.3e}, max rel diff {self.max_rel_diff:.3e} "
                 f"(rtol {self.rtol:g}, atol {self.atol:g})"]
        if self.moved_between_updates:
            lines.append(f"parameters moved before the window was full: {self.moved_between_updates}")
        if self.inference_mode:
            lines.append(f"compared with {', '.join(self.inference_mode)} in inference mode: a random mask drawn for "
                         f"the big batch never equals the micro-batches' masks")
        lines += [str(cause) for cause in self.causes]
        return "\n".join(lines)


def _restore(params, snapshot: Dict[int, np.ndarray]) -> None:
    for p in params:
        p.set_data(Tensor(snapshot[id(p)]))


class _Gradient(nn.Cell):
    """The gradient of `network`'s loss with respect to `params`."""

    def __init__(self, network: nn.Cell, params) -> None:
        super().__init__(auto_prefix=False)
        self.network, self.params = network, params
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs):
        return self.grad(self.network, self.params)(*inputs)


def _gradients(with_loss: nn.Cell, loss_only: nn.Cell, params, micro_batches, arrays, reduction: str, hold):
    """The window's gradient as `reduction`'s rule combines its micro-batches' (float64, on the host: what a micro-batch
    weighs, what the window is divided by, stand-alone) and the big batch's."""
    rule = RULES[reduction]()
    gradient = _Gradient(loss_only, params).set_train()
    hold()
    big = [g.asnumpy().astype(np.float64) for g in gradient(*[Tensor(a) for a in arrays])]
    total, weights = [np.zeros_like(b) for b in big], 0.0
    for micro in micro_batches:
        inputs = [Tensor(a) for a in micro]
        weight = float(rule.split(with_loss(*inputs), inputs[0])[1])
        total = [t + weight * g.asnumpy().astype(np.float64) for t, g in zip(total, gradient(*inputs))]
        weights += weight
    return [t / rule.divisor(weights, 1.0) for t in total], big


def verify_equivalence(network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer, inputs: Sequence,
                       accumulate_step: int, rtol: float = 1e-5, atol: float = 1e-6,
                       reduction: Optional[str] = None, structure: str = "auto") -> EquivalenceReport:
    r"""
    Compares one optimizer update from `accumulate_step` accumulated micro-batches with one big-batch update.

    The batch `inputs` is split along its first axis into `accumulate_step` micro-batches (of unequal size
    when it does not divide). From the same starting weights and optimizer state, it trains one step of
    `nn.TrainOneStepCell` on the whole batch, then one window of `TrainAccumulationCell` on the
    micro-batches, and reports the parameter differences. The network and the optimizer are left exactly as
    they were.

    Float32 sums in another order differ by rounding, and an adaptive optimizer can magnify it: Adam's first step
    is about ``lr * g / (|g| + eps)``, so where a gradient is within rounding of zero (an input pixel that is
    always 0, say) the two updates may differ by a good part of `lr`. Verify with `nn.SGD` or `nn.Momentum`,
    which pass a gradient's difference through unchanged, to check the accumulation itself.

    Args:
        network (nn.Cell): Your network.
        loss_fn (nn.Cell): Your loss, a mean or a sum over the batch.
        optimizer (nn.Optimizer): Your optimizer over `network`'s parameters.
        inputs (Sequence[Union[Tensor, numpy.ndarray]]): One batch, e.g. ``(data, label)``.
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

    Returns:
        EquivalenceReport; `print` it for a one-line verdict.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `accumulate_step` is not positive or exceeds the batch size, the inputs disagree in
            batch size, or `reduction` is unknown or does not fit what `loss_fn` returns (``"weighted_mean"`` needs
            ``(loss, weight)``, the others a loss alone; found by one eager forward pass, `check_loss_output`).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> from ms_accum import verify_equivalence
        >>> net = nn.Dense(4, 2)
        >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        >>> report = verify_equivalence(net, nn.MSELoss(), nn.Adam(net.trainable_params()), (x, y), 4)
        >>> report.passed
        True
    """
    name = "verify_equivalence"
    check_isinstance(network, "network", nn.Cell, name)
    check_isinstance(loss_fn, "loss_fn", nn.Cell, name)
    check_isinstance(optimizer, "optimizer", nn.Optimizer, name)
    check_isinstance(inputs, "inputs", (tuple, list), name)
    accumulate_step = check_positive_int(accumulate_step, "accumulate_step", name)
    rtol = check_positive_float(rtol, "rtol", name)
    atol = check_positive_float(atol, "atol", name)
    reduction = window_reduction(loss_fn, reduction, name)
    if check_value_in(structure, "structure", STRUCTURES, name) == "cached":
        check_loss_signature(loss_fn, name)
        reduction = check_cached_options(reduction, "skip_window", False, False, None, name)
    arrays = [x.asnumpy() if isinstance(x, Tensor) else np.asarray(x) for x in inputs]
    if not arrays or len({a.shape[0] if a.ndim else -1 for a in arrays}) != 1 or arrays[0].ndim == 0:
        raise ValueError(f"For '{name}', the argument 'inputs' must be arrays sharing their first (batch) axis, "
                         f"but got shapes {[a.shape for a in arrays]}.")
    if accumulate_step > arrays[0].shape[0]:
        raise ValueError(f"For '{name}', the argument 'accumulate_step' must not exceed the batch size "
                         f"{arrays[0].shape[0]}, but got {accumulate_step}.")

    with_loss = nn.WithLossCell(network, loss_fn)
    micro_batches = list(zip(*[np.array_split(a, accumulate_step) for a in arrays]))
    check_loss_output(with_loss, [Tensor(a) for a in micro_batches[0]], reduction, name, "loss_fn")
    # Everything the two updates change, BatchNorm's statistics included, is put back afterwards.
    state = list({id(p): p for p in [*network.get_parameters(), *(p for _, p in optimizer.parameters_and_names())]}
                 .values())
    start = {id(p): p.asnumpy().copy() for p in state}
    names = [p.name for p in optimizer.parameters]
    loss_only = LossOnly(with_loss) if reduction == "weighted_mean" else with_loss
    stochastic = stochastic_cells(network)
    with in_inference(network, stochastic) as hold:
        try:
            reference = nn.TrainOneStepCell(loss_only, optimizer).set_train()
            hold()
            reference(*[Tensor(a) for a in arrays])
            expected = [p.asnumpy().copy() for p in optimizer.parameters]
            _restore(state, start)

            moved = set()
            if structure == "cached":  # one call trains the whole window: nothing can move before it closes
                cached = TrainCachedWindowCell(network, loss_fn, optimizer).set_train()
                hold()
                cached.train_window([tuple(Tensor(a) for a in micro) for micro in micro_batches])
            else:
                accumulating = TrainAccumulationCell(with_loss, optimizer, accumulate_step,
                                                     reduction=reduction).set_train()
                hold()
                for i, micro in enumerate(micro_batches):
                    accumulating(*[Tensor(a) for a in micro])
                    if i < accumulate_step - 1:
                        moved.update(n for n, p in zip(names, optimizer.parameters) if not np.array_equal(
                            p.asnumpy(), start[id(p)]))
            actual = [p.asnumpy().copy() for p in optimizer.parameters]
        finally:
            _restore(state, start)

        per_parameter = {}
        for n, ref, acc in zip(names, expected, actual):
            abs_diff = np.abs(acc.astype(np.float64) - ref.astype(np.float64))
            per_parameter[n] = (float(abs_diff.max(initial=0.0)),
                                float((abs_diff / (np.abs(ref.astype(np.float64)) + atol)).max(initial=0.0)))
        passed = not moved and all(np.allclose(acc, ref, rtol=rtol, atol=atol) for ref, acc in zip(expected, actual))
        causes = []
        if not passed and structure == "cached":  # the loss saw the whole window: only BatchNorm's statistics remain
            causes = [c for c in explain(batchnorm_cells(network), [np.zeros(1)], [np.zeros(1)], 1, 0.0, rtol, atol)
                      if c.name.startswith("BatchNorm")]
        elif not passed and not moved:
            try:
                window, big = _gradients(with_loss, loss_only, optimizer.parameters, micro_batches, arrays, reduction,
                                         hold)
            finally:
                _restore(state, start)
            causes = explain(batchnorm_cells(network), window, big, accumulate_step,
                             max(v[0] for v in per_parameter.values()), rtol, atol)
    return EquivalenceReport(accumulate_step, max(v[0] for v in per_parameter.values()),
                             max(v[1] for v in per_parameter.values()), rtol, atol, per_parameter,
                             sorted(moved), passed, causes, stochastic)

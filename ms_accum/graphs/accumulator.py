"""The `@ms.jit_class` Accumulator of MindSpore's gradient-accumulation page, made exact and lean."""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import nn, ops

from ..core import _ops
from ..core.buffer import AccumulationBuffer
from ..runtime import check_cpu_kernels
from .._validation import ArgumentValueError, check_isinstance, check_positive_float, check_positive_int, door


@ms.jit_class
class Accumulator:
    r"""
    Accumulates the gradients of `accumulate_step` micro-batches and steps `optimizer` once per window.

    Call it inside an `@ms.jit` train step with the gradients of one micro-batch, as on MindSpore's "Gradient
    Accumulation" page. When the window is full the accumulated gradient is reduced, optionally clipped by global norm,
    handed to the optimizer, and the buffer is cleared. Between updates the network's parameters do not move.

    With `reduction="mean"` (the default) write the loss as the ordinary mean over the micro-batch and do
    **not** divide it by `accumulate_step`: the Accumulator divides the window's sum by the number of
    micro-batches (or, when `num_samples` is given, by the samples seen), so each update equals one step on
    the concatenated batch. The page's `loss / accumulate_step` corresponds to `reduction="sum"`.

    In data parallel (msrun's processes joined when the Accumulator is built, see `ms_accum.init_data_parallel`),
    micro-batches still accumulate without communication; the full
    window's buffer and sample count are all-reduced once, before clipping and the optimizer step, so the mean is
    over the global samples even when ranks' micro-batches differ in size (pass `num_samples` then).

    State: an `AccumulationBuffer` (``buffer``, whose rules every Cell uses too), with the page's names for its
    Parameters: `inner_grads` (named ``accumulate.<param>``; no all-zeros copy as on the page), `mini_step`,
    `num_samples`.

    Args:
        optimizer (nn.Optimizer): The optimizer that applies each window's gradient.
        accumulate_step (int): Micro-batches per optimizer step, K. Must be a positive int.
        clip_norm (float, optional): If given, the window's gradient is clipped to this global norm before
            the optimizer step. Default: ``None``.
        reduction (str): ``"mean"``, ``"sum"`` or ``"weighted_mean"``, how the window's gradients are combined.
            Here ``"weighted_mean"`` is ``"mean"`` under its sequence name: pass the micro-batch's token count as
            `num_samples`. Default: ``"mean"``.

    Inputs:
        - **grads** (tuple[Tensor]) - The gradients of one micro-batch, one per optimizer parameter, in the
          optimizer's order (what `value_and_grad(fn, None, optimizer.parameters)` returns).
        - **num_samples** (Union[int, Tensor], optional) - The micro-batch's sample count. Give it when micro-batches
          differ in size: the mean then weights each by its count, so the window's gradient equals the gradient of the
          concatenated batch (``"sum"`` ignores it; ``"weighted_mean"`` needs it: the micro-batch's token count).
          Default: ``None``, every micro-batch weighs 1 and its gradient is accumulated as it is (no multiplication).

    Outputs:
        Tensor of bool, whether this call closed a window. The optimizer then ran, unless the window's gradient
        was not finite: such a window is skipped, so parameters never become NaN or inf, and counted in
        ``buffer.guard.skipped_windows``.

    Raises:
        TypeError: If `optimizer` is not an `nn.Optimizer`, or `accumulate_step` is not an int, or
            `clip_norm` is not a number, or `reduction` is not a str.
        ValueError: If `accumulate_step` or `clip_norm` is not positive, or `reduction` is unknown, or
            `grads` do not match the optimizer's parameters in number or shape, or `num_samples` is missing under
            ``"weighted_mean"`` (when the step compiles), or MindSpore's parallel mode is neither stand-alone nor
            data parallel (or data parallel before `mindspore.communication.init()`).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> from mindspore import nn, ops
        >>> from ms_accum import Accumulator
        >>> net = nn.Dense(4, 2)
        >>> loss_fn = nn.MSELoss()
        >>> optimizer = nn.SGD(net.trainable_params(), 0.1)
        >>> accumulator = Accumulator(optimizer, accumulate_step=4)
        >>> def forward_fn(x, y):
        ...     return loss_fn(net(x), y)   # the plain mean: no "/ accumulate_step"
        >>> grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)
        >>> @ms.jit
        ... def train_step(x, y):
        ...     loss, grads = grad_fn(x, y)
        ...     return ops.depend(loss, accumulator(grads))
    """

    @door("Accumulator")
    def __init__(self, optimizer: nn.Optimizer, accumulate_step: int, clip_norm: Optional[float] = None,
                 reduction: str = "mean") -> None:
        check_isinstance(optimizer, "optimizer", nn.Optimizer)
        check_cpu_kernels()
        self.accumulate_step = check_positive_int(accumulate_step, "accumulate_step")
        self.clip_norm = check_positive_float(clip_norm, "clip_norm", allow_none=True)
        self.optimizer = optimizer
        # The buffer refuses an unsupported parallel mode (and a reduction), in this class's name: the door's.
        self.buffer = AccumulationBuffer(optimizer.parameters, "accumulate", reduction=reduction)
        self.inner_grads = self.buffer.grad_sum
        self.mini_step = self.buffer.micro_batch_count  # the page's name for the micro-batches in the window
        self.num_samples = self.buffer.num_samples
        self.param_shapes = tuple(tuple(p.shape) for p in optimizer.parameters)

    def __call__(self, grads, num_samples=None):
        # No Python-level if/else before the tensor `if` below (docs/mindspore.md, a constant if/else): a micro-batch
        # without a sample count (None) is left unweighted by type dispatch, not by a branch. The Accumulator sees
        # no loss (None): the window's gradient check finds what is not finite.
        self._check_grads(grads)
        self._check_weight(num_samples)
        weight = self.buffer.reduction.given_weight(num_samples)
        micro_batches = self.buffer.add(None, _ops.weigh(grads, weight), _ops.count(weight))
        applied = micro_batches >= self.accumulate_step
        if applied:
            self.buffer.close(self.optimizer, self.clip_norm)
        return applied

    def flush(self):
        """Apply an open, partial window now (its mean is over what it holds); do nothing if it is empty.

        Outputs:
            Tensor of bool, whether the optimizer was applied: False for an empty window, and for one skipped as not
            finite (counted in ``buffer.guard.skipped_windows``).
        """
        applied = ops.zeros((), ms.bool_)
        if self.mini_step > 0:
            applied = self.buffer.close(self.optimizer, self.clip_norm)
        return applied

    def _check_weight(self, num_samples):
        # The Accumulator sees no loss: under "weighted_mean" the caller's token count is the only weight there is.
        if num_samples is None and self.buffer.reduction.name == "weighted_mean":
            _refuse_no_weight()

    def _check_grads(self, grads):
        # Shapes are compile-time constants, so a mismatch fails while the step compiles, before any update.
        if len(grads) != len(self.param_shapes):
            _refuse_grads_count(len(self.param_shapes), len(grads))
        for i in range(len(grads)):
            shape = _ops.dense_shape(grads[i])
            if not _ops.shape_matches(shape, self.param_shapes[i]):
                _refuse_grad_shape(i, shape, self.param_shapes[i])


# The refusals of a call, run while the step compiles: a graph can raise only Python's own exception types, and a
# `constexpr` runs in Python, so the user gets the library's error whole (named here: no door runs in a graph).
@ops.constexpr
def _refuse_no_weight():
    raise ArgumentValueError("{@num_samples:subject} must be given under {reduction=} (the micro-batch's weight, e.g. "
                             "its real tokens, the weight TokenCrossEntropy returns), but got None.",
                             reduction="weighted_mean").named("Accumulator")


@ops.constexpr
def _refuse_grads_count(expected, got):
    raise ArgumentValueError("{@grads:subject} must hold {expected} tensors, one per optimizer parameter, but got "
                             "{got}.", expected=expected, got=got).named("Accumulator")


@ops.constexpr
def _refuse_grad_shape(i, shape, expected):
    raise ArgumentValueError("{@grads:subject} must match the optimizer's parameter shapes, but grads[{i}] has shape "
                             "{shape}, expected {expected}.", i=i, shape=tuple(shape),
                             expected=tuple(expected)).named("Accumulator")

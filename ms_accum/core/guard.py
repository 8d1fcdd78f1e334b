"""Non-finite gradients and loss scaling, decided once per accumulation window.

Every window's gradient is checked before the optimizer sees it; a window that is not finite is skipped (the
optimizer is not called, so parameters and optimizer state stay finite) and counted. Micro-batches are handled by
one of two policies:

- ``"skip_window"`` (default): every micro-batch is accumulated as it is; a non-finite loss or gradient
  anywhere in the window skips the whole window. The only checks are the one on the accumulated gradient,
  plus a scalar test of each loss.
- ``"skip_microbatch"``: each micro-batch's loss and gradient are checked; a non-finite one is left out and the
  window's mean is taken over the samples that remain (MindSpore's boost accumulation drops such micro-batches
  silently; here they are counted). A window whose micro-batches were all left out is skipped.

With a MindSpore loss scaler the backward pass is scaled by its ``scale_value`` and the window's gradient unscaled
before the check; a dynamic scaler is adjusted once per window. Without one nothing is scaled, so the backward
pass's sensitivity stays a compile-time constant. In data parallel the counts the decision rests on are
all-reduced, so every rank decides alike.

The window's check is `mindspore.amp.all_finite` on GPU and Ascend (where it reads the device's overflow status)
and for half-precision buffers; on CPU a float32 buffer is checked through each tensor's sum of squares, one L2Loss
kernel per tensor instead of three (docs/structures.md). Wherever the window's squared norm is measured, by
statistics or for clipping, its finiteness is the check, on any device, and the window is not read a second time.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import mindspore as ms
from mindspore import Parameter, Tensor, amp, nn, ops

from . import _ops
from .._choices import POLICIES
from .._mindspore import primitives
from .._validation import ArgumentValueError, check_isinstance, check_value_in, door

LossScaler = Union[amp.StaticLossScaler, amp.DynamicLossScaler]

_mark_bad_loss_op = ops.MultitypeFuncGraph("ms_accum_mark_bad_loss")


def check_policy_fits(sparse: Optional[str], policy: str, leaves_out: bool) -> None:
    """Refuses a buffer that `leaves_out` micro-batches (``"skip_microbatch"``, or an outlier filter) for a network
    with sparse gradients (`sparse`: the name of the cell that makes one, `sparse_gradient_cell`), before anything
    compiles: MindSpore cannot check a micro-batch's RowTensor gradients, nor add them behind the tensor `if` that
    leaves a micro-batch out (docs/mindspore.md, sparse gradients); ``"skip_window"`` checks the dense window
    instead."""
    if sparse is None or not leaves_out:
        return
    if policy == "skip_microbatch":
        raise ArgumentValueError("{@policy:subject} must be 'skip_window' for a network with sparse gradients (its "
                                 "cell '{sparse}'), but got 'skip_microbatch': MindSpore 2.10 cannot check sparse "
                                 "gradients one micro-batch at a time.", sparse=sparse)
    raise ArgumentValueError("{@skip_outliers:subject} must {_none} for a network with sparse gradients (its cell "
                             "'{sparse}'): MindSpore 2.10 cannot leave sparse gradients out one micro-batch at a time.",
                             sparse=sparse)


def sparse_gradient_cell(network) -> Optional[str]:
    """The name of a sub-Cell whose gradient is a RowTensor (it gathers with SparseGatherV2), or None. In a
    `nn.WithLossCell`, the name is its network's: what the user built and named."""
    network = network.backbone_network if isinstance(network, nn.WithLossCell) else network
    for name, cell in network.cells_and_names():
        if any(isinstance(p, ops.SparseGatherV2) for p in primitives(cell).values()):
            return name or type(cell).__name__
    return None


@_mark_bad_loss_op.register("None", "Tensor", "Tensor")
@_mark_bad_loss_op.register("None", "Number", "Tensor")
def _no_loss(loss, weight, window_bad):
    return weight  # the Accumulator has no loss to test: its window's gradient check finds what is not finite


@_mark_bad_loss_op.register("Tensor", "Tensor", "Tensor")
@_mark_bad_loss_op.register("Tensor", "Number", "Tensor")
def _mark_bad_loss(loss, weight, window_bad):
    # `loss - loss` is 0 for a finite loss and nan for any other: one kernel where counting took three (IsFinite,
    # LogicalNot, Cast), and a window marked nan is ruled out by `_KeepAll.spoiled`. The weight is returned as it
    # came, not through a Depend on the count: a constant weight stays a compile-time constant (passed through a
    # Depend, a Python number cost two kernels a call, ScalarToTensor and Cast).
    ops.assign_add(window_bad, ops.cast(loss - loss, ms.float32))
    return weight


@ms.jit_class
class _ElementsFinite:
    """Whether the window is finite, by `elements_finite` over its tensors: `_ops.sums_finite` (one sum of squares per
    float32 tensor; finite elements squaring past float32's range are counted as an overflow) or MindSpore's
    `amp.all_finite` (the device's overflow status on Ascend, a test of every element elsewhere). A window clipped was
    measured: its norm is tested, as `_NormIsFinite` tests it, because a read of the clipped buffer gets MindSpore's
    copy of each large tensor (docs/mindspore.md, in-place operations, measures it)."""

    def __init__(self, elements_finite) -> None:
        self.elements_finite = elements_finite

    def __call__(self, grads, sq_norm):
        if sq_norm is None:
            return self.elements_finite(grads)
        return ops.isfinite(sq_norm)  # measured for clipping: as `_NormIsFinite`


@ms.jit_class
class _NormIsFinite:
    """Statistics on: the window's squared norm, measured before clipping in float32, is finite exactly when the
    elements are (then the clipped window is too), with `_ops.sums_finite`'s one exception. Reading it spares a second
    pass over the window, and MindSpore's copy of each buffer tensor before that second read
    (docs/mindspore.md, in-place operations)."""

    def __call__(self, grads, sq_norm):
        return ops.isfinite(sq_norm)


def _window_check(dtypes, measured: bool):
    """The window's finiteness check for buffers of `dtypes`, chosen once (see the module's docstring)."""
    if measured:
        return _NormIsFinite()
    cpu = ms.get_context("device_target") == "CPU"
    # AddN sums one dtype, and a float16 sum would overflow long before its elements do: float32 buffers only.
    sums = cpu and all(dtype == ms.float32 for dtype in dtypes)
    return _ElementsFinite(_ops.sums_finite if sums else amp.all_finite)


@ms.jit_class
class _Unscaled:
    """No loss scaler: a micro-batch's sensitivity is its weight alone (a constant for sample counts)."""

    def sens(self, weight):
        return weight

    def unscale(self, divisor):
        return divisor

    def adjust(self, apply, bad):
        return apply  # no scale to adjust: nothing runs


@ms.jit_class
class _Scaled:
    """A loss scaler: the backward pass is scaled by its value, and the window divided by it again."""

    def __init__(self, scaler: LossScaler) -> None:
        self.scaler = scaler
        self.loss_scale = scaler.scale_value

    def sens(self, weight):
        return weight * self.loss_scale

    def unscale(self, divisor):
        return divisor * self.loss_scale

    def adjust(self, apply, bad):
        """Lets a dynamic scaler grow after a clean window (applied, no bad micro-batch) or shrink after an overflow."""
        return self.scaler.adjust(ops.logical_and(apply, bad <= 0.0))


@ms.jit_class
class _KeepAll:
    """skip_window: accumulate everything; a non-finite loss marks the window, `window_bad` turns nan (its gradient
    shows by itself)."""

    def __call__(self, loss, grads, weight, window_bad, skipped_micro_batches):
        return grads, _mark_bad_loss_op(loss, weight, window_bad)

    def spoiled(self, bad, seen):  # whether the window's mark `bad` (all ranks') of `seen` micro-batches rules it out
        # nan is not equal to 0 (nor is a count from an older state); an empty window is never applied
        return ops.logical_or(ops.not_equal(bad, 0.0), bad >= seen)


@ms.jit_class
class _DropNonFinite:
    """skip_microbatch: a micro-batch with a non-finite loss or gradient adds nothing, not even its samples: its weight
    is zeroed, and the buffer adds no gradient of a micro-batch that weighs nothing. One already left out (by the
    outlier filter) is not judged again."""

    def __call__(self, loss, grads, weight, window_bad, skipped_micro_batches):
        finite = ops.logical_and(amp.all_finite(grads), ops.isfinite(loss).all())
        bad = ops.logical_and(ops.logical_not(finite), weight > 0)
        ops.assign_add(window_bad, ops.cast(bad, ms.float32))
        ops.assign_add(skipped_micro_batches, ops.cast(bad, ms.int32))
        return grads, weight * ops.cast(finite, ms.float32)

    def spoiled(self, bad, seen):
        return bad >= seen  # only when no micro-batch is left


@ms.jit_class
class WindowGuard:
    r"""
    Decides, once per window, whether the window's gradient may be applied, and keeps the loss scale.

    Held by an `AccumulationBuffer`: each micro-batch goes through `micro_batch`, each window through `close`, and
    the buffer's `clear` zeroes `window_bad`. Its Parameters are part of the training state, so they are saved and
    resumed with it.

    Args:
        policy (str): ``"skip_window"`` (default) or ``"skip_microbatch"``; see the module's docstring.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler; its
            Parameters are renamed ``<prefix>.loss_scale`` and ``<prefix>.loss_scale_counter``. Default: ``None``,
            no scaling.
        prefix (str): Name prefix of the Parameters. Default: ``"guard"``.
        dtypes (Sequence[mindspore.dtype], optional): The dtypes of the window's buffers, which choose its
            finiteness check. Default: ``None``, float32.
        measured (bool): Whether `close` is given the window's squared norm (statistics on): its finiteness is then
            the check, whatever the dtypes. Default: ``False``.

    Attributes:
        loss_scale (Parameter): float32, the scale of the backward pass (1 without a scaler).
        skipped_windows (Parameter): int32, windows not applied because they were not finite.
        skipped_micro_batches (Parameter): int32, micro-batches left out by ``"skip_microbatch"`` (and by the
            buffer's outlier filter, `ms_accum.core.statistics.OutlierFilter`, which counts here too).
        window_bad (Parameter): float32, the open window's mark: under ``"skip_microbatch"`` the micro-batches left
            out as not finite, under ``"skip_window"`` 0 until a micro-batch's loss is not finite, then nan.

    Raises:
        TypeError: If `loss_scaler` is not a MindSpore loss scaler.
        ValueError: If `policy` is unknown.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    @door("WindowGuard")
    def __init__(self, policy: str = "skip_window", loss_scaler: Optional[LossScaler] = None,
                 prefix: str = "guard", dtypes: Optional[Sequence] = None, measured: bool = False) -> None:
        self.policy = check_value_in(policy, "policy", POLICIES)
        if loss_scaler is not None:
            check_isinstance(loss_scaler, "loss_scaler", (amp.StaticLossScaler, amp.DynamicLossScaler))
        # Chosen here, not by flags in the graph (docs/mindspore.md, constant if/else).
        self.scaling = _Unscaled() if loss_scaler is None else _Scaled(loss_scaler)
        self.window_finite = _window_check(dtypes or (ms.float32,), measured)
        if loss_scaler is None:
            loss_scaler = amp.StaticLossScaler(1.0)  # unused, but its scale is saved: every state has one layout
        self.loss_scale = loss_scaler.scale_value
        self.loss_scale.name = f"{prefix}.loss_scale"
        self.state = [self.loss_scale]
        if isinstance(loss_scaler, amp.DynamicLossScaler):
            loss_scaler.counter.name = f"{prefix}.loss_scale_counter"
            self.state.append(loss_scaler.counter)
        self.filter = _KeepAll() if policy == "skip_window" else _DropNonFinite()
        self.window_bad = Parameter(Tensor(0.0, ms.float32), name=f"{prefix}.window_bad", requires_grad=False)
        self.skipped_windows = Parameter(Tensor(0, ms.int32), name=f"{prefix}.skipped_windows", requires_grad=False)
        self.skipped_micro_batches = Parameter(Tensor(0, ms.int32), name=f"{prefix}.skipped_micro_batches",
                                               requires_grad=False)
        self.state += [self.window_bad, self.skipped_windows, self.skipped_micro_batches]

    def parameters(self) -> list:
        """Every Parameter of the guard: the loss scale (and a dynamic scaler's counter), then the counters."""
        return list(self.state)

    def micro_batch(self, loss, grads, weight):
        """What one micro-batch adds to the window, `(grads, weight)`, after the policy; counts a bad one."""
        return self.filter(loss, grads, weight, self.window_bad, self.skipped_micro_batches)

    def close(self, grads, reducer, micro_batches, sq_norm):
        """Whether the window's unscaled, reduced `grads` may be applied; adjusts the scale and the counters.

        `micro_batches` is this rank's micro-step count; `reducer` sums the counts over the ranks. `sq_norm` is the
        window's squared norm before clipping, measured by statistics (None when off)."""
        bad, seen = reducer.totals(self.window_bad, ops.cast(micro_batches, ms.float32))
        apply = ops.logical_and(self.window_finite(grads, sq_norm), ops.logical_not(self.filter.spoiled(bad, seen)))
        ops.assign_add(self.skipped_windows, ops.cast(ops.logical_not(apply), ms.int32))
        # Every result is used (docs/mindspore.md, discarded results of functions with side effects).
        return ops.depend(apply, self.scaling.adjust(apply, bad))

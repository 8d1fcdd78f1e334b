"""Cell graphs of MindSpore's gradient-accumulation tutorial, made exact, plus one fused micro-step Cell.

`TrainForwardBackward`, `TrainOptim` and `TrainClear` are the tutorial's three graphs. Unlike the
tutorial, which sums K mean losses and so takes a K-times larger step, `TrainOptim` applies the
sample-weighted mean: each update equals one step on the concatenated batch. `TrainAccumulationCell`
does a whole micro-step, with the optimizer step every K calls, in one graph: it is the executor's fast
path and what `mindspore.train.Model` trains.

In data parallel (MindSpore's ``ParallelMode.DATA_PARALLEL`` when a Cell is built) `TrainOptim` and
`TrainAccumulationCell` all-reduce the window's buffer and sample count once, when they apply it: micro-steps
communicate nothing, and the update is the mean over the global batch (see `ms_accum.parallel`).
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import ParameterTuple, nn, ops

from . import _ops
from ._validation import check_isinstance, check_positive_float, check_positive_int, check_value_in
from .accumulator import REDUCTIONS
from .buffer import AccumulationBuffer
from .guard import LossScaler, check_policy_fits
from .parallel import window_reducer


def _check_network(network, cls_name: str) -> nn.Cell:
    check_isinstance(network, "network", nn.Cell, cls_name)
    if not network.trainable_params():
        raise ValueError(f"For '{cls_name}', the argument 'network' must have trainable parameters, but got none.")
    return network


def _check_buffer(buffer, optimizer: nn.Optimizer, cls_name: str) -> AccumulationBuffer:
    check_isinstance(buffer, "buffer", AccumulationBuffer, cls_name)
    if len(buffer) != len(optimizer.parameters):
        raise ValueError(f"For '{cls_name}', the argument 'buffer' must hold one gradient per optimizer "
                         f"parameter ({len(optimizer.parameters)}), but holds {len(buffer)}.")
    return buffer


def _own_buffer(optimizer: nn.Optimizer, buffer: Optional[AccumulationBuffer], policy: str,
                loss_scaler: Optional[LossScaler], cls_name: str) -> AccumulationBuffer:
    """The buffer a window Cell trains on: the one given, or a new one with `policy` and `loss_scaler`."""
    if buffer is None:
        return AccumulationBuffer(optimizer.parameters, policy=policy, loss_scaler=loss_scaler)
    if policy != "skip_window" or loss_scaler is not None:
        raise ValueError(f"For '{cls_name}', the arguments 'policy' and 'loss_scaler' belong to the buffer: pass "
                         f"them to the AccumulationBuffer given as 'buffer', not here.")
    return _check_buffer(buffer, optimizer, cls_name)


class _WindowCell(nn.Cell):
    """Holds a buffer's Parameters as attributes, so every graph built on one buffer shares them."""

    def __init__(self, buffer: AccumulationBuffer) -> None:
        super().__init__(auto_prefix=False)
        self.grad_sum = buffer.grad_sum
        self.mini_step = buffer.mini_step
        self.num_samples = buffer.num_samples
        self.guard = buffer.guard
        self.guard_state = ParameterTuple(buffer.guard.parameters())  # registered, so checkpoints hold them

    def apply_window(self, optimizer, reducer, clip_norm):
        """Reduce, unscale and clip the window's gradient, and step `optimizer` if the guard allows it."""
        grad_sum, divisor = reducer(self.grad_sum, self.num_samples)
        grads = _ops.window_grads(grad_sum, divisor * self.guard.loss_scale, clip_norm)
        applied = self.guard.close(grads, reducer, self.mini_step)
        if applied:
            optimizer(grads)
        return applied

    def close_window(self, optimizer, reducer, clip_norm):
        """`apply_window`, then clear the buffer for the next window; returns whether the optimizer ran."""
        applied = self.apply_window(optimizer, reducer, clip_norm)
        _ops.clear_window(self.grad_sum, self.mini_step, self.num_samples)
        return applied

    def micro_batch(self, inputs):
        """Forward, backward and accumulation of one micro-batch: `(loss, micro-steps in the window now)`.

        For the Cells that own `network`, `grad`, `weights` and `by_samples` (1.0: weight each micro-batch by its
        sample count, folded into the backward pass's sensitivity for free; 0.0: weight 1).
        """
        loss = self.network(*inputs)
        weight = _sample_weight(inputs[0], self.by_samples)
        grads = self.grad(self.network, self.weights)(*inputs, _sens(loss, weight, self.guard.loss_scale))
        grads, weight = self.guard.micro_batch(loss, grads, weight)
        return loss, _ops.accumulate(self.grad_sum, self.mini_step, self.num_samples, grads, weight)


class TrainingState(_WindowCell):
    r"""
    Every Parameter a training owns, in one Cell to save and load: the network's, the optimizer's state
    (moments, step, learning rate) and the accumulation buffer with its counters.

    It computes nothing. `GradientAccumulation` saves it as its resumable checkpoint, so the file is the same
    whichever graph structure trains.

    Args:
        network (nn.Cell): The network (with its loss).
        optimizer (nn.Optimizer): The optimizer.
        buffer (AccumulationBuffer): The window's state.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `buffer` does not fit the optimizer.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from ms_accum import AccumulationBuffer, TrainingState
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        >>> state = TrainingState(net, optimizer, AccumulationBuffer(optimizer.parameters))
        >>> # ms.save_checkpoint(state, "state.ckpt") holds weights, moments and buffer
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, buffer: AccumulationBuffer) -> None:
        check_isinstance(optimizer, "optimizer", nn.Optimizer, "TrainingState")
        super().__init__(_check_buffer(buffer, optimizer, "TrainingState"))
        self.network = check_isinstance(network, "network", nn.Cell, "TrainingState")
        self.optimizer = optimizer

    def construct(self):
        return self.mini_step


class TrainForwardBackward(_WindowCell):
    r"""
    Forward, backward and accumulation of one micro-batch; the parameters do not change.

    The micro-batch's gradient is weighted by its sample count, the leading dimension of the first input,
    for free: the count is the backward pass's sensitivity. With a loss that is a mean over the batch, the
    buffer then holds the gradient of the window's summed loss, and `TrainOptim` divides by the samples seen.

    Args:
        network (nn.Cell): The network with its loss (for example `nn.WithLossCell`), returning a scalar.
        optimizer (nn.Optimizer): The optimizer whose parameters are differentiated.
        buffer (AccumulationBuffer): The window's state, shared with `TrainOptim` and `TrainClear`.
        weight_by_samples (bool): Weight each micro-batch by its sample count; set False to weigh every
            micro-batch the same (``reduction="sum"``, or inputs whose first axis is not the batch).
            Default: ``True``.

    Inputs:
        - **\*inputs** (Tensor) - The micro-batch, as `network` takes it; the first input's first axis is the
          batch.

    Outputs:
        Tensor, the micro-batch's loss.

    Raises:
        TypeError: If `network` is not a Cell, `optimizer` not an `nn.Optimizer`, or `buffer` not an
            `AccumulationBuffer`.
        ValueError: If `network` has no trainable parameters or `buffer` does not fit the optimizer.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import AccumulationBuffer, TrainForwardBackward, TrainOptim, TrainClear
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> optimizer = nn.SGD(net.trainable_params(), 0.1)
        >>> buffer = AccumulationBuffer(optimizer.parameters)
        >>> forward_backward = TrainForwardBackward(net, optimizer, buffer)
        >>> optim, clear = TrainOptim(optimizer, buffer), TrainClear(buffer)
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, buffer: AccumulationBuffer,
                 weight_by_samples: bool = True) -> None:
        check_isinstance(optimizer, "optimizer", nn.Optimizer, "TrainForwardBackward")
        super().__init__(_check_buffer(buffer, optimizer, "TrainForwardBackward"))
        self.network = _check_network(network, "TrainForwardBackward")
        check_policy_fits(network, buffer.guard.policy, "TrainForwardBackward")
        self.network.set_grad()
        self.weights = optimizer.parameters
        # 1.0 or 0.0: an arithmetic switch, because a Python if/else ahead of a tensor `if` in the same graph
        # makes MindSpore 2.10 drop that branch's side effects (see _ops).
        self.by_samples = float(bool(weight_by_samples))
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, *inputs):
        loss, step = self.micro_batch(inputs)
        return ops.depend(loss, step)


class TrainOptim(_WindowCell):
    r"""
    Applies the window's gradient: the sample-weighted mean (or the sum), unscaled, clipped, then `optimizer`,
    unless the buffer's `WindowGuard` finds it not finite (the window is then skipped and counted).

    In data parallel the buffer and the sample count are first all-reduced over the ranks. The division happens in
    place (in graph mode the buffer then holds the applied gradient), so `TrainClear` must follow before the next
    window, as in the tutorial's loop.

    Args:
        optimizer (nn.Optimizer): The optimizer.
        buffer (AccumulationBuffer): The window's state.
        clip_norm (float, optional): Clip the gradient to this global norm first. Default: ``None``.
        reduction (str): ``"mean"`` divides by the samples accumulated, ``"sum"`` does not.
            Default: ``"mean"``.

    Inputs:
        None.

    Outputs:
        Tensor of bool, whether the optimizer was applied.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `clip_norm` is not positive, or `reduction` is unknown, or MindSpore's parallel
            mode is neither stand-alone nor data parallel.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, optimizer: nn.Optimizer, buffer: AccumulationBuffer, clip_norm: Optional[float] = None,
                 reduction: str = "mean") -> None:
        check_isinstance(optimizer, "optimizer", nn.Optimizer, "TrainOptim")
        super().__init__(_check_buffer(buffer, optimizer, "TrainOptim"))
        self.optimizer = optimizer
        self.clip_norm = check_positive_float(clip_norm, "clip_norm", "TrainOptim", allow_none=True)
        check_value_in(reduction, "reduction", REDUCTIONS, "TrainOptim")
        # Local, or all-reduced over the ranks in data parallel: chosen here, so the graph has no mode branch.
        self.reducer = window_reducer(reduction, "TrainOptim")

    def construct(self):
        return self.apply_window(self.optimizer, self.reducer, self.clip_norm)


class TrainClear(_WindowCell):
    r"""
    Zeroes the window's buffer and counters, ready for the next window.

    Args:
        buffer (AccumulationBuffer): The window's state.

    Inputs:
        None.

    Outputs:
        Tensor, the cleared micro-step counter (0).

    Raises:
        TypeError: If `buffer` is not an `AccumulationBuffer`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, buffer: AccumulationBuffer) -> None:
        check_isinstance(buffer, "buffer", AccumulationBuffer, "TrainClear")
        super().__init__(buffer)

    def construct(self):
        ops.assign(self.guard.window_bad, ops.zeros((), ms.float32))  # a dropped window's count goes too
        return _ops.clear_window(self.grad_sum, self.mini_step, self.num_samples)


class TrainAccumulationCell(_WindowCell):
    r"""
    One accumulation micro-step in one graph: forward, backward, accumulate, and every `accumulate_step`
    calls the optimizer step on the window's mean and the clear.

    It trains like `nn.TrainOneStepCell`, so `mindspore.train.Model(TrainAccumulationCell(...)).train(...)`
    works with the standard callbacks; each call is one micro-batch. In data parallel the window is all-reduced
    once, when it is applied, instead of every micro-batch's gradients.

    Args:
        network (nn.Cell): The network with its loss, returning a scalar.
        optimizer (nn.Optimizer): The optimizer.
        accumulate_step (int): Micro-batches per optimizer step, K.
        clip_norm (float, optional): Clip the window's gradient to this global norm. Default: ``None``.
        reduction (str): ``"mean"`` (sample-weighted) or ``"sum"``. Default: ``"mean"``.
        buffer (AccumulationBuffer, optional): Share an existing window state; a new one by default.
        policy (str): What a non-finite micro-batch does to its window when the buffer is new: ``"skip_window"``
            (default) or ``"skip_microbatch"`` (see `ms_accum.guard`). A non-finite window is never applied.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler, when
            the buffer is new. Default: ``None``.

    Inputs:
        - **\*inputs** (Tensor) - One micro-batch; the first input's first axis is the batch.

    Outputs:
        Tensor, the micro-batch's loss.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `accumulate_step` or `clip_norm` is not positive, or `reduction` is unknown, or MindSpore's
            parallel mode is neither stand-alone nor data parallel.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from mindspore.train import Model, LossMonitor
        >>> from ms_accum import TrainAccumulationCell
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> cell = TrainAccumulationCell(net, nn.SGD(net.trainable_params(), 0.1), accumulate_step=4)
        >>> model = Model(cell)   # model.train(epochs, dataset, callbacks=[LossMonitor()])
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, accumulate_step: int,
                 clip_norm: Optional[float] = None, reduction: str = "mean",
                 buffer: Optional[AccumulationBuffer] = None, policy: str = "skip_window",
                 loss_scaler: Optional[LossScaler] = None) -> None:
        name = type(self).__name__
        check_isinstance(optimizer, "optimizer", nn.Optimizer, name)
        _check_network(network, name)
        accumulate_step = check_positive_int(accumulate_step, "accumulate_step", name)
        clip_norm = check_positive_float(clip_norm, "clip_norm", name, allow_none=True)
        mean = float(check_value_in(reduction, "reduction", REDUCTIONS, name) == "mean")
        super().__init__(_own_buffer(optimizer, buffer, policy, loss_scaler, name))
        check_policy_fits(network, self.guard.policy, name)
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.accumulate_step = accumulate_step
        self.clip_norm = clip_norm
        self.by_samples = mean
        self.reducer = window_reducer(reduction, name)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, *inputs):
        loss, step = self.micro_batch(inputs)
        if step >= self.accumulate_step:
            # The window's only communication in data parallel: micro-steps before it stay local.
            self.close_window(self.optimizer, self.reducer, self.clip_norm)
        return loss


def _sens(loss, weight, loss_scale):
    # The backward pass's sensitivity: the sample weight times the loss scale, in the loss's dtype.
    return ops.ones_like(loss) * ops.cast(weight * loss_scale, ops.dtype(loss))


def _sample_weight(batch, by_samples: float) -> float:
    # The batch size is a compile-time constant; `by_samples` is 1.0 (weight = batch size) or 0.0 (weight 1).
    return ops.shape(batch)[0] * by_samples + (1.0 - by_samples)

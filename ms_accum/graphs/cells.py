"""Cell graphs of MindSpore's gradient-accumulation tutorial, made exact, plus one fused micro-step Cell.

`TrainForwardBackward`, `TrainOptim` and `TrainClear` are the tutorial's three graphs; `TrainAccumulationCell` is
a whole micro-step, with the optimizer step every K calls, in one graph (what `mindspore.train.Model` trains).
Every Cell applies the rules of its `AccumulationBuffer` (add, check, step, clear), and those that run a network
share one micro-batch step (`_MicroBatchCell.micro_batch`).
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

from ..core import _ops
from .._mindspore import loss_of
from .._validation import (Argument, ArgumentValueError, check_isinstance, check_positive_float, check_positive_int,
                           door)
from ..core.buffer import AccumulationBuffer
from ..core.dropout import DropoutStreams
from ..core.guard import LossScaler, check_policy_fits, sparse_gradient_cell
from ..core.losses import loss_output_error, window_reduction
from ..core.parallel import data_parallel_info
from ..runtime import check_cpu_kernels


def _check_buffer(buffer, optimizer: nn.Optimizer) -> AccumulationBuffer:
    check_isinstance(optimizer, "optimizer", nn.Optimizer)
    check_isinstance(buffer, "buffer", AccumulationBuffer)
    if len(buffer) != len(optimizer.parameters):
        raise ArgumentValueError("{@buffer:subject} must hold one gradient per optimizer parameter ({parameters}), but "
                                 "holds {gradients}.", parameters=len(optimizer.parameters), gradients=len(buffer))
    return buffer


def _check_reduction(buffer: AccumulationBuffer, reduction: Optional[str], arg_name: str = "reduction",
                     value=None) -> None:
    # The buffer's rule decides for every Cell on it; an argument may only repeat it.
    if reduction is not None and reduction != buffer.reduction.name:
        raise ArgumentValueError("{arg_name:subject} must agree with the buffer's reduction ('{name}') or be "
                                 "None, but got {value!r}: the AccumulationBuffer decides the reduction.",
                                 arg_name=Argument(arg_name), name=buffer.reduction.name,
                                 value=reduction if value is None else value)


def own_buffer(network: nn.Cell, optimizer: nn.Optimizer, buffer: Optional[AccumulationBuffer], policy: str,
               loss_scaler: Optional[LossScaler], reduction: Optional[str]) -> AccumulationBuffer:
    """The buffer a window Cell trains on: the one given (which decides the policy, the scaler and the reduction), or
    a new one with `policy`, `loss_scaler` and `reduction`, which honours what the loss of a `nn.WithLossCell` says
    it computes (`window_reduction`)."""
    loss_fn = loss_of(network)
    if buffer is None:
        check_isinstance(optimizer, "optimizer", nn.Optimizer)
        data_parallel_info()  # an unsupported parallel mode is refused before anything is built
        if isinstance(loss_fn, nn.Cell):
            reduction = window_reduction(loss_fn, reduction)
        return AccumulationBuffer(optimizer.parameters, policy=policy, loss_scaler=loss_scaler,
                                  reduction=reduction or "mean")
    if policy != "skip_window" or loss_scaler is not None:
        raise ArgumentValueError("the arguments {@policy} and {@loss_scaler} belong to the buffer: pass them to the "
                                 "AccumulationBuffer given as {@buffer}, not here.")
    _check_reduction(buffer, reduction)
    buffer = _check_buffer(buffer, optimizer)
    if isinstance(loss_fn, nn.Cell):
        window_reduction(loss_fn, buffer.reduction.name)
    return buffer


class _BufferCell(nn.Cell):
    """A graph on one `AccumulationBuffer`: registers its Parameters, so checkpoints of the Cell hold them."""

    def __init__(self, buffer: AccumulationBuffer, scratch: bool = True) -> None:
        super().__init__(auto_prefix=False)
        check_cpu_kernels()
        self.buffer = buffer
        self.window_state = ParameterTuple(buffer.parameters())
        if scratch and buffer.statistics.parameters():  # rewritten every window: used, not saved
            self.scratch = ParameterTuple(buffer.statistics.parameters())


class _MicroBatchCell(_BufferCell):
    """A window graph that runs micro-batches of `network`: the one micro-batch step, for every such Cell."""

    loss_arg = "network"  # the argument that gave the loss, for the message (the executor's Cells: its loss_fn)

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, buffer: AccumulationBuffer) -> None:
        super().__init__(_check_buffer(buffer, optimizer))
        self.network = check_isinstance(network, "network", nn.Cell)
        if not network.trainable_params():
            raise ArgumentValueError("{@network:subject} must have trainable parameters, but got none.")
        sparse = sparse_gradient_cell(network)
        check_policy_fits(sparse, buffer.guard.policy, buffer.leaves_out)
        self.grads_norm = _ops.SparseGradsNorm() if sparse else _ops.DenseGradsNorm()  # for statistics
        self.output_checked = False
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def __call__(self, *inputs):
        if self.output_checked:
            return super().__call__(*inputs)
        try:
            out = super().__call__(*inputs)
        except Exception:
            # An output that does not fit the buffer's reduction (`(loss, weight)` for "weighted_mean", else a loss)
            # cannot compile: the backward's sensitivity mirrors the output the reduction expects, so the graph fails
            # before anything runs. Only then does one eager pass say why (an eager pass's memory stays with the
            # process: docs/mindspore.md).
            misfit = loss_output_error(self.network, self.one_micro_batch(inputs), self.buffer.reduction.name,
                                       self.loss_arg)
            if misfit is None:
                raise
            with door(type(self).__name__):  # the Cell the user called, unless the executor called it
                raise misfit from None
        self.output_checked = True
        return out

    def one_micro_batch(self, inputs):
        """One micro-batch of this Cell's inputs (all of them: a call is one micro-batch)."""
        return inputs

    def micro_batch(self, inputs):
        """Forward, backward and accumulation of one micro-batch: `(network output, micro-steps now, statistics)`.

        The micro-batch's weight (its sample count under ``"mean"``, the network's count under ``"weighted_mean"``)
        and the loss scale are the backward pass's sensitivity, so weighting costs nothing. The statistics are the
        buffer's (`ms_accum.core.statistics`: None when off). Callers use the results (docs/mindspore.md,
        discarded results of functions with side effects)."""
        out = self.network(*inputs)
        loss, weight = self.buffer.reduction.split(out, inputs[0])
        scale = self.buffer.guard.scaling.sens(weight)
        grads = self.grad(self.network, self.weights)(*inputs, self.buffer.reduction.sens(out, scale))
        loss, grads, weight, stats = self.buffer.statistics.micro_batch(loss, grads, weight, scale, self.grads_norm)
        return out, self.buffer.add(loss, grads, weight), stats


class TrainingState(_BufferCell):
    r"""
    Every Parameter a training owns, in one Cell to save and load: the network's, the optimizer's state (moments, step,
    learning rate), the accumulation buffer with its counters and the dropout streams' seeds and offsets.

    It computes nothing. `GradientAccumulation` saves it as its resumable checkpoint, so the file is the same
    whichever graph structure trains.

    Args:
        network (nn.Cell): The network (with its loss).
        optimizer (nn.Optimizer): The optimizer.
        buffer (AccumulationBuffer): The window's state.
        dropout (DropoutStreams, optional): The network's dropout state (`ms_accum.core.dropout`). Default: ``None``,
            none.

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

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, buffer: AccumulationBuffer,
                 dropout: Optional[DropoutStreams] = None) -> None:
        with door("TrainingState"):
            super().__init__(_check_buffer(buffer, optimizer), scratch=False)
            self.network = check_isinstance(network, "network", nn.Cell)
            self.dropout = DropoutStreams(nn.Cell()) if dropout is None else \
                check_isinstance(dropout, "dropout", DropoutStreams)
        self.optimizer = optimizer

    def contents(self) -> nn.Cell:
        """What a training-state file holds: this Cell, the dropout streams read from their kernel (a state sharded
        over ranks gathers its parts instead, `ms_accum.train.sharding.ShardedState`)."""
        self.dropout.pull()
        return self


class TrainForwardBackward(_MicroBatchCell):
    r"""
    Forward, backward and accumulation of one micro-batch; the parameters do not change.

    The buffer's reduction weighs the micro-batch's gradient, for free, through the backward pass's sensitivity:
    ``"mean"`` by its sample count (the leading dimension of the first input), ``"weighted_mean"`` by the weight the
    network returns with its loss (its real tokens, say), ``"sum"`` by 1. With a loss that is a mean over the batch,
    the buffer then holds the gradient of the window's summed loss, and `TrainOptim` divides by the weights seen.

    Args:
        network (nn.Cell): The network with its loss (for example `nn.WithLossCell`), returning a scalar.
        optimizer (nn.Optimizer): The optimizer whose parameters are differentiated.
        buffer (AccumulationBuffer): The window's state, shared with `TrainOptim` and `TrainClear`.
        weight_by_samples (bool, optional): Whether micro-batches are weighted by their sample counts. The buffer's
            reduction decides (``"mean"``: True, ``"sum"``: False; leave it None under ``"weighted_mean"``); give it
            only to state that. Default: ``None``.

    Inputs:
        - **\*inputs** (Tensor) - The micro-batch, as `network` takes it; the first input's first axis is the batch.

    Outputs:
        The network's output: the micro-batch's loss (under ``"weighted_mean"``, the tuple `(loss, weight)`); with a
        buffer that measures (``AccumulationBuffer(statistics=True)``, `ms_accum.core.statistics`), the tuple of that
        and the micro-batch's ``[squared gradient norm, left out]``.

    Raises:
        TypeError: If `network` is not a Cell, `optimizer` not an `nn.Optimizer`, or `buffer` not an
            `AccumulationBuffer`.
        ValueError: If `network` has no trainable parameters, `buffer` does not fit the optimizer, or
            `weight_by_samples` contradicts the buffer's reduction.

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
                 weight_by_samples: Optional[bool] = None) -> None:
        with door("TrainForwardBackward"):
            super().__init__(network, optimizer, buffer)
            if weight_by_samples is not None:
                check_isinstance(weight_by_samples, "weight_by_samples", bool)
                _check_reduction(buffer, "mean" if weight_by_samples else "sum", "weight_by_samples", weight_by_samples)

    def construct(self, *inputs):
        out, step, stats = self.micro_batch(inputs)
        return self.buffer.statistics.output(ops.depend(out, step), stats)


class _ThreadedForwardBackward(TrainForwardBackward):
    """`TrainForwardBackward` in a graph that MindSpore runs on its actor threads, not synchronously on the caller's:
    a tensor `if` makes it a graph with control flow (docs/mindspore.md, small straight-line graphs run synchronously).
    Its branch never runs (a micro-batch was just counted), and would only write the count's own value back."""

    def construct(self, *inputs):
        out, step, stats = self.micro_batch(inputs)
        out = ops.depend(out, step)
        if step < 0:
            ops.assign(self.buffer.micro_batch_count, step)
        return self.buffer.statistics.output(out, stats)


@ms.jit_class
class _Apply:
    """`TrainOptim`'s step when the window stays open for `TrainClear`: the buffer's `apply`."""

    def __init__(self, buffer: AccumulationBuffer) -> None:
        self.buffer = buffer

    def __call__(self, optimizer, clip_norm):
        return self.buffer.apply(optimizer, clip_norm)


@ms.jit_class
class _Close(_Apply):
    """`TrainOptim`'s step with ``clear=True``: the buffer's `close`, apply and clear in one branch."""

    def __call__(self, optimizer, clip_norm):
        return self.buffer.close(optimizer, clip_norm)


class TrainOptim(_BufferCell):
    r"""
    Applies the window's gradient: the sample-weighted mean (or the sum), unscaled, clipped, then `optimizer`,
    unless the buffer's `WindowGuard` finds it not finite (the window is then skipped and counted). The buffer's
    reduction decides what the window is divided by.

    In data parallel the buffer and the sample count are first all-reduced over the ranks. The division happens in
    place (in graph mode the buffer then holds the applied gradient), so `TrainClear` must follow before the next
    window, as in the tutorial's loop; or give ``clear=True`` and the window is also cleared in the same graph call:
    one launch and one tensor `if` per window instead of two of each. (`GradientAccumulation` goes further: it makes
    the choice on the host, with no tensor `if` deciding it; docs/structures.md.)

    Args:
        optimizer (nn.Optimizer): The optimizer.
        buffer (AccumulationBuffer): The window's state.
        clip_norm (float, optional): Clip the gradient to this global norm first. Default: ``None``.
        reduction (str, optional): The buffer's reduction (``"mean"``, ``"sum"`` or ``"weighted_mean"``); give it only
            to state it. Default: ``None``.
        clear (bool): Also clear the window, as `TrainClear` would. Default: ``False``.

    Inputs:
        None.

    Outputs:
        Tensor of bool, whether the optimizer was applied.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `clip_norm` is not positive, or `reduction` is not the buffer's.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, optimizer: nn.Optimizer, buffer: AccumulationBuffer, clip_norm: Optional[float] = None,
                 reduction: Optional[str] = None, clear: bool = False) -> None:
        with door("TrainOptim"):
            super().__init__(_check_buffer(buffer, optimizer))
            _check_reduction(buffer, reduction)
            self.clip_norm = check_positive_float(clip_norm, "clip_norm", allow_none=True)
            self.step = _Close(buffer) if check_isinstance(clear, "clear", bool) else _Apply(buffer)
        self.optimizer = optimizer

    def construct(self):
        return self.step(self.optimizer, self.clip_norm)


class _CheckWindow(_BufferCell):
    """The buffer's `check`: the window made ready in place and judged; outputs the verdict for the host."""

    def __init__(self, buffer: AccumulationBuffer, clip_norm: Optional[float]) -> None:
        super().__init__(buffer)
        self.clip_norm = clip_norm

    def construct(self):
        return self.buffer.check(self.clip_norm)


class _StepWindow(_BufferCell):
    """The buffer's `step`: the optimizer on the window `_CheckWindow` accepted, then the window closed."""

    def __init__(self, optimizer: nn.Optimizer, buffer: AccumulationBuffer) -> None:
        super().__init__(buffer)
        self.optimizer = optimizer

    def construct(self):
        return self.buffer.step(self.optimizer)


class TrainClear(_BufferCell):
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
        with door("TrainClear"):
            check_isinstance(buffer, "buffer", AccumulationBuffer)
        super().__init__(buffer)

    def construct(self):
        return self.buffer.clear()


class TrainAccumulationCell(_MicroBatchCell):
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
        reduction (str, optional): ``"mean"`` (sample-weighted), ``"sum"`` or ``"weighted_mean"`` (see
            `AccumulationBuffer`), for a new buffer (``None``: ``"mean"``);
            a buffer given decides its own, and `reduction` may only repeat it. Default: ``None``.
        buffer (AccumulationBuffer, optional): Share an existing window state; a new one by default.
        policy (str): What a non-finite micro-batch does to its window when the buffer is new: ``"skip_window"``
            (default) or ``"skip_microbatch"`` (see `ms_accum.core.guard`). A non-finite window is never applied.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler, when
            the buffer is new. Default: ``None``.

    Inputs:
        - **\*inputs** (Tensor) - One micro-batch; the first input's first axis is the batch.

    Outputs:
        The same as `TrainForwardBackward`'s.

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
                 clip_norm: Optional[float] = None, reduction: Optional[str] = None,
                 buffer: Optional[AccumulationBuffer] = None, policy: str = "skip_window",
                 loss_scaler: Optional[LossScaler] = None) -> None:
        with door(type(self).__name__):
            self.accumulate_step = check_positive_int(accumulate_step, "accumulate_step")
            clip_norm = check_positive_float(clip_norm, "clip_norm", allow_none=True)
            super().__init__(network, optimizer, own_buffer(network, optimizer, buffer, policy, loss_scaler, reduction))
        self.clip_norm = clip_norm

    def construct(self, *inputs):
        out, step, stats = self.micro_batch(inputs)
        if step >= self.accumulate_step:
            # The window's only communication in data parallel: micro-steps before it stay local.
            self.buffer.close(self.optimizer, self.clip_norm)
        return self.buffer.statistics.output(out, stats)


class _HostChecked:
    """What a host-stepped Cell adds to its structure's (`HostSteppedAccumulationCell`, `HostSteppedWindowCell`):
    `checks`, whether its graph checks the window, and the verdict False of a call that does not."""

    loss_arg = "loss_fn"  # the executor's: it was given the loss

    def __init__(self, *args, checks: bool = True, **kwargs) -> None:
        with door(type(self).__name__):
            check_isinstance(checks, "checks", bool)
        super().__init__(*args, **kwargs)
        self.checks = checks  # a graph constant: the graph holds the check, or not
        self.unchecked = Tensor(False)  # the verdict of a call that does not check the window


class HostSteppedAccumulationCell(_HostChecked, TrainAccumulationCell):
    r"""
    `TrainAccumulationCell` without the optimizer: every K-th call ends with the buffer's `check` instead of its
    `close`, and the host then launches the buffer's `step` or `TrainClear`, as the verdict says (the executor's
    ``"fused"`` structure). With ``checks=False`` no call checks: the host reduces and checks the window itself
    (the executor in data parallel, `ms_accum.core.parallel.CountSums`).

    An optimizer in a graph after the backward costs memory: with the network's weights in a branch that follows the
    backward, MindSpore's CPU pool holds about two more gradients while the backward runs (docs/memory.md, an
    optimizer in a graph after the backward). Closing on the host costs one more launch per window.

    Args:
        The same as `TrainAccumulationCell`'s, and:
        checks (bool): Whether the K-th call checks the window; ``False``: the host does (the executor decides where,
            `ms_accum.train.structures.Structure.checks_in_graph`). Default: ``True``.

    Inputs:
        The same as `TrainAccumulationCell`'s.

    Outputs:
        Tuple of `TrainAccumulationCell`'s output and a bool Tensor: after the K-th micro-batch, whether the window may
        be applied (exactly one of the buffer's `step`, if True, or `TrainClear` must follow before the next call);
        before it, or with ``checks=False``, False.
    """

    def construct(self, *inputs):
        out, step, stats = self.micro_batch(inputs)
        applied = self.unchecked
        if self.checks:
            if step >= self.accumulate_step:
                applied = self.buffer.check(self.clip_norm)
        return self.buffer.statistics.output(out, stats), applied

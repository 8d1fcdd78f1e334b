"""A whole accumulation window in one graph call (one launch, not K): K stacked micro-batches, one step."""
from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from .._validation import ArgumentValueError, StateError, check_positive_int, door
from .cells import _HostChecked, TrainAccumulationCell


class TrainWindowCell(TrainAccumulationCell):
    r"""
    One accumulation window in one graph: K forward and backward passes, then the optimizer step on the window's mean.

    A call equals `accumulate_step` calls of `TrainAccumulationCell` on the same micro-batches, bit for bit: the
    same micro-batch step runs in a graph-mode loop, then the buffer's `close`. One micro-batch's activations are
    alive at a time, but the loop's control flow costs more memory than `TrainForwardBackward` (docs/structures.md).
    A shorter window (an epoch's partial one, or a smaller K of a schedule) runs through the same graph: stacked to K
    and trained on its first `micro_batches` (`set_micro_batches`), since another graph of the network would keep
    activation memory of its own.

    Args:
        The same as `TrainAccumulationCell`'s; `accumulate_step` is also the length of the inputs' leading axis.

    Inputs:
        - **\*inputs** (Tensor) - The window: each input of `network` with a leading axis of K micro-batches,
          shape :math:`(K, B, \ldots)`, so a window's micro-batches are of equal size B.

    Outputs:
        Tensor of shape :math:`(K,)`, the loss of each micro-batch (under ``"weighted_mean"``, the tuple of the losses
        and the weights, both :math:`(K,)`); with a buffer that measures, the tuple of that and the micro-batches'
        statistics, :math:`(K, 2)`. Past `micro_batches`, zeros.

    Raises:
        TypeError: As `TrainAccumulationCell` raises.
        ValueError: As `TrainAccumulationCell` raises; or, when called, if the inputs' leading axis is not K long.
        RuntimeError: When called, if the buffer holds an open window (a window is the micro-batches of one call).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor, nn
        >>> from ms_accum import TrainWindowCell
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> cell = TrainWindowCell(net, nn.SGD(net.trainable_params(), 0.1), accumulate_step=4)
        >>> x, y = np.ones((4, 8, 4), np.float32), np.zeros((4, 8, 2), np.float32)
        >>> cell(Tensor(x), Tensor(y)).shape   # one optimizer step on 4 micro-batches of 8
        (4,)
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The loop's bound: a Parameter, so that a shorter window needs no graph of its own.
        self.micro_batches = Parameter(Tensor(self.accumulate_step, ms.int32),
                                       name=f"{self.buffer.mini_step.name.rsplit('.', 1)[0]}.window_bound",
                                       requires_grad=False)
        self._bound = self.accumulate_step

    def set_micro_batches(self, count: int) -> None:
        """Trains the first `count` of the K stacked micro-batches in the next calls (K: all, the default).

        Raises:
            ValueError: If `count` is not an int from 1 to K.
        """
        with door("TrainWindowCell.set_micro_batches"):
            check_positive_int(count, "count")
            if count > self.accumulate_step:
                raise ArgumentValueError("{@count:subject} must be at most {@accumulate_step} ({accumulate_step}), "
                                         "but got {count}.", accumulate_step=self.accumulate_step, count=count)
        if count != self._bound:  # written only when it changes: one host-to-device copy
            self.micro_batches.set_data(Tensor(count, ms.int32))
            self._bound = count

    def __call__(self, *inputs):
        # Checked before the graph runs: the loop below closes the window after the stack's first `micro_batches`.
        with door(type(self).__name__):
            if inputs and inputs[0].shape[0] != self.accumulate_step:
                raise ArgumentValueError("the inputs' leading axis must be {@accumulate_step} long "
                                         "({accumulate_step}), but got shape {shape}.",
                                         accumulate_step=self.accumulate_step, shape=tuple(inputs[0].shape))
            open_window = int(self.buffer.mini_step.asnumpy())  # one scalar read per window
            if open_window:
                raise StateError("the buffer must hold no open window when called, but it holds {open_window} "
                                 "micro-batch(es): close it first (TrainOptim and TrainClear).",
                                 open_window=open_window)
        return super().__call__(*inputs)

    def one_micro_batch(self, inputs):
        """The first micro-batch of a stacked window."""
        return tuple(x[0] for x in inputs)

    def construct(self, *inputs):
        out = self.train_stack(inputs)
        self.buffer.close(self.optimizer, self.clip_norm)
        return out

    def train_stack(self, inputs):
        """The stack's first `micro_batches` forward, backward and accumulated, in a graph-mode loop: the Cell's
        output before the window closes."""
        losses = ops.zeros((self.accumulate_step,), ms.float32)
        weights = ops.zeros((self.accumulate_step,), ms.float32)
        norms = ops.zeros((self.accumulate_step, 2), ms.float32)
        i = ops.zeros((), ms.int32)
        # A loop over a tensor index, not a Python loop (docs/mindspore.md, unrolled windows).
        # A copy of the bound, not the Parameter: compared directly with the loop's index, it kept its value at
        # compilation (docs/mindspore.md, a Parameter in a loop's condition).
        bound = self.micro_batches * 1
        while i < bound:
            micro = tuple([x[i] for x in inputs])
            out, step, stats = self.micro_batch(micro)
            loss, weight = self.buffer.reduction.split(out, micro[0])
            at = ops.reshape(i, (1, 1))
            losses = ops.tensor_scatter_update(losses, at, ops.reshape(ops.cast(ops.depend(loss, step), ms.float32),
                                                                       (1,)))
            weights = ops.tensor_scatter_update(weights, at, ops.reshape(ops.cast(weight, ms.float32), (1,)))
            norms = self.buffer.statistics.collect(norms, at, stats)
            i = i + 1
        return self.buffer.statistics.output(self.buffer.reduction.window_output(losses, weights), norms)


class HostSteppedWindowCell(_HostChecked, TrainWindowCell):
    r"""
    `TrainWindowCell` without the optimizer: one graph call trains the stacked window and makes it ready (the buffer's
    `check`), and the host then launches the buffer's `step` or `TrainClear`, as the verdict says (the executor's
    ``"window"`` structure). With ``checks=False`` the call does not check (its verdict is False): the host
    reduces and checks the window itself (the executor in data parallel, `ms_accum.core.parallel.CountSums`).

    An optimizer in the graph after the backward costs memory: with the network's weights in a graph that follows the
    backward, MindSpore's CPU pool holds about two more gradients while the backward runs (docs/memory.md, an
    optimizer in a graph after the backward). Closing on the host costs one more launch per window and no
    synchronisation the executor does not make anyway.

    Args:
        The same as `TrainWindowCell`'s, and:
        checks (bool): Whether the call checks the window; ``False``: the host does (the executor decides where,
            `ms_accum.train.structures.Structure.checks_in_graph`). Default: ``True``.

    Inputs:
        The same as `TrainWindowCell`'s.

    Outputs:
        Tuple of `TrainWindowCell`'s output and a bool Tensor, whether the window may be applied: exactly one of the
        buffer's `step` (if True) or `TrainClear` must follow before the next call. With ``checks=False``, False.
    """

    def construct(self, *inputs):
        out = self.train_stack(inputs)
        if self.checks:
            return out, self.buffer.check(self.clip_norm)
        return out, self.unchecked

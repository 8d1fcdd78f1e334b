"""A whole accumulation window in one graph call: K stacked micro-batches, one optimizer step.

`TrainAccumulationCell` costs one Python-to-graph launch per micro-batch. `TrainWindowCell` takes the window's
K micro-batches stacked on a leading axis and runs the same micro-batch step in a graph-mode ``while`` loop over
a tensor index, so a window is one launch.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops

from .cells import TrainAccumulationCell


class TrainWindowCell(TrainAccumulationCell):
    r"""
    One accumulation window in one graph: K forward and backward passes, then the optimizer step on the
    window's mean.

    A call equals `accumulate_step` calls of `TrainAccumulationCell` on the same micro-batches, bit for bit: the
    same micro-batch step (forward, backward, guard, accumulate into the buffer) runs in a graph-mode loop, then
    the same window close (reduce, unscale, check, clip, step, clear). One micro-batch's activations are alive at
    a time, but the loop's control flow costs more memory than `TrainForwardBackward` (README, "Memory").

    Args:
        network (nn.Cell): The network with its loss, returning a scalar.
        optimizer (nn.Optimizer): The optimizer.
        accumulate_step (int): Micro-batches per optimizer step, K: the length of the inputs' leading axis.
        clip_norm (float, optional): Clip the window's gradient to this global norm. Default: ``None``.
        reduction (str): ``"mean"`` (sample-weighted) or ``"sum"``. Default: ``"mean"``.
        buffer (AccumulationBuffer, optional): Share an existing window state; a new one by default.
        policy (str): What a non-finite micro-batch does to its window when the buffer is new: ``"skip_window"``
            (default) or ``"skip_microbatch"`` (see `ms_accum.guard`). A non-finite window is never applied.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler, when
            the buffer is new. Default: ``None``.

    Inputs:
        - **\*inputs** (Tensor) - The window: each input of `network` with a leading axis of K micro-batches,
          shape :math:`(K, B, \ldots)`, so a window's micro-batches are of equal size B.

    Outputs:
        Tensor of shape :math:`(K,)`, the loss of each micro-batch.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `accumulate_step` or `clip_norm` is not positive, `reduction` is unknown, `network` has no
            trainable parameters, `buffer` does not fit `optimizer` or comes with `policy` or `loss_scaler`,
            MindSpore's parallel mode is neither stand-alone nor data parallel, the buffer holds an open window
            when called (a window is K micro-batches, all of this call), or (when the graph compiles) the inputs'
            leading axis is not K long.

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

    def __call__(self, *inputs):
        # One scalar read per window: the loop below closes the window after exactly K micro-batches.
        open_window = int(self.buffer.mini_step.asnumpy())
        if open_window:
            raise ValueError(f"For 'TrainWindowCell', the buffer must hold no open window when called, but it holds "
                             f"{open_window} micro-batch(es): close it first (TrainOptim and TrainClear).")
        return super().__call__(*inputs)

    def construct(self, *inputs):
        # Shapes are compile-time constants, so a window of the wrong length fails when the graph compiles.
        if ops.shape(inputs[0])[0] != self.accumulate_step:
            raise ValueError("For 'TrainWindowCell', the inputs' leading axis must be 'accumulate_step' long.")
        losses = ops.zeros((self.accumulate_step,), ms.float32)
        i = ops.zeros((), ms.int32)
        # A loop over a tensor index, not a Python loop (README, "Known MindSpore behaviour": unrolled windows).
        while i < self.accumulate_step:
            loss, step = self.micro_batch(tuple([x[i] for x in inputs]))
            # Every output is used (README, "Known MindSpore behaviour": side effects eliminated inside `while`).
            losses = ops.tensor_scatter_update(losses, ops.reshape(i, (1, 1)),
                                               ops.reshape(ops.cast(ops.depend(loss, step), ms.float32), (1,)))
            i = i + 1
        self.buffer.close(self.optimizer, self.clip_norm)
        return losses

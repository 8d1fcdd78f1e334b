"""A whole accumulation window in one graph call: K stacked micro-batches, one optimizer step.

`TrainAccumulationCell` costs one Python-to-graph launch per micro-batch. `TrainWindowCell` takes the window's
K micro-batches stacked on a leading axis and runs their forward and backward passes in a graph-mode ``while``
loop over a tensor index, so a window is one launch and one micro-batch's activations are alive at a time. (An
unrolled Python loop, the first design, kept every micro-batch's activations alive: README, "Known MindSpore
behaviour".) Its peak memory is still above the tutorial's three graphs' (README, "Memory"), so the executor's
``structure="auto"`` does not choose it.

The window's gradient is summed in loop-carried tensors and the window's side effects (the guard's counters,
the optimizer step) come after the loop. The buffer is still the shared window state: its guard (loss scale,
non-finite counts) is used here, and an epoch's partial window can run through `TrainForwardBackward` /
`TrainOptim` / `TrainClear` on the same buffer with the same arithmetic. Networks with sparse (RowTensor)
gradients are refused: MindSpore 2.10 cannot compile the guard's check of such a loop-carried sum.
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import Tensor, nn, ops

from . import _ops
from ._validation import check_isinstance, check_positive_float, check_positive_int, check_value_in
from .accumulator import REDUCTIONS
from .buffer import AccumulationBuffer
from .cells import _check_network, _own_buffer, _sample_weight, _sens, _WindowCell
from .guard import LossScaler, sparse_gradient_cell
from .parallel import window_reducer

_hyper_map = ops.HyperMap()
_add_op = ops.MultitypeFuncGraph("ms_accum_window_add")


_zeros_op = ops.MultitypeFuncGraph("ms_accum_window_zeros")


@_add_op.register("Tensor", "Tensor")
def _add(total, grad):
    return total + grad


@_zeros_op.register("Tensor")
def _zeros(param):
    return ops.zeros_like(param)


class TrainWindowCell(_WindowCell):
    r"""
    One accumulation window in one graph: K forward and backward passes, then the optimizer step on the
    window's mean.

    A call equals `accumulate_step` calls of `TrainAccumulationCell` on the same micro-batches, bit for bit:
    each micro-batch's gradient is weighted by its sample count through the backward pass's sensitivity, the K
    gradients are summed in the same order, and the sum is reduced (all-reduced once in data parallel), divided
    by the samples, unscaled, checked by the buffer's guard, optionally clipped and applied. The passes run one
    after the other in a graph-mode loop, so one micro-batch's activations are alive at a time; the loop's control
    flow still costs more memory than `TrainForwardBackward` (README, "Memory"). The sum lives only during the
    call: the buffer's gradients and counters are neither read nor written, so they must be empty (as every other
    Cell leaves them after a full window).

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
        TypeError: If an argument has the wrong type, or `network` has sparse (RowTensor) gradients.
        ValueError: If `accumulate_step` or `clip_norm` is not positive, `reduction` is unknown, `network` has no
            trainable parameters, `buffer` does not fit `optimizer` or comes with `policy` or `loss_scaler`,
            MindSpore's parallel mode is neither stand-alone nor data parallel, or (when the graph compiles) the
            inputs' leading axis is not K long.

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

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, accumulate_step: int,
                 clip_norm: Optional[float] = None, reduction: str = "mean",
                 buffer: Optional[AccumulationBuffer] = None, policy: str = "skip_window",
                 loss_scaler: Optional[LossScaler] = None) -> None:
        name = "TrainWindowCell"
        check_isinstance(optimizer, "optimizer", nn.Optimizer, name)
        _check_network(network, name)
        sparse = sparse_gradient_cell(network)
        if sparse is not None:
            # In MindSpore 2.10 anything HyperMap derives from a gradient tuple holding a RowTensor keeps an
            # undetermined type, and the guard's amp.all_finite on the window's sum then fails to compile
            # (measured, also when summed into a Parameter); TrainAccumulationCell checks the buffer it reads back.
            raise TypeError(f"For '{name}', the argument 'network' must have dense gradients, but its cell "
                            f"'{sparse}' gathers with SparseGatherV2 (e.g. nn.EmbeddingLookup(sparse=True)), whose "
                            f"RowTensor gradients MindSpore 2.10 cannot check inside one window graph: use "
                            f"TrainAccumulationCell.")
        accumulate_step = check_positive_int(accumulate_step, "accumulate_step", name)
        clip_norm = check_positive_float(clip_norm, "clip_norm", name, allow_none=True)
        # 1.0 or 0.0: an arithmetic switch, because a Python if/else ahead of the tensor `if` below would make
        # MindSpore 2.10 drop that branch's side effects (the optimizer step; see _ops.accumulate).
        mean = float(check_value_in(reduction, "reduction", REDUCTIONS, name) == "mean")
        super().__init__(_own_buffer(optimizer, buffer, policy, loss_scaler, name))
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.accumulate_step = accumulate_step
        self.micro_batches = Tensor(accumulate_step, ms.int32)  # the guard's count of the window's micro-batches
        self.clip_norm = clip_norm
        self.mean = mean
        self.reducer = window_reducer(reduction, name)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, *inputs):
        # Shapes are compile-time constants, so a window of the wrong length fails when the graph compiles.
        if ops.shape(inputs[0])[0] != self.accumulate_step:
            raise ValueError("For 'TrainWindowCell', the inputs' leading axis must be 'accumulate_step' long.")
        total = _hyper_map(_zeros_op, self.weights)
        samples = ops.zeros((), ms.float32)
        bad = ops.zeros((), ms.float32)
        losses = ops.zeros((self.accumulate_step,), ms.float32)
        i = ops.zeros((), ms.int32)
        # A graph-mode loop over a tensor index stays a loop (README, "Known MindSpore behaviour": an unrolled
        # window kept every micro-batch's activations alive): one micro-batch's activations live at a time.
        while i < self.accumulate_step:
            loss, grads, weight, step_bad = self._micro_batch(tuple([x[i] for x in inputs]))
            total = _hyper_map(_add_op, total, grads)
            samples = samples + weight
            bad = bad + step_bad
            losses = ops.tensor_scatter_update(losses, ops.reshape(i, (1, 1)),
                                               ops.reshape(ops.cast(loss, ms.float32), (1,)))
            i = i + 1
        # The guard's per-micro-batch counts, written once, after the loop.
        self.guard.count(bad)
        # As _WindowCell.apply_window, on the local sum instead of the buffer. In data parallel this is the
        # window's only communication.
        grad_sum, divisor = self.reducer(total, samples)
        grads = _ops.window_grads(grad_sum, divisor * self.guard.loss_scale, self.clip_norm)
        applied = self.guard.close(grads, self.reducer, self.micro_batches)
        if applied:
            self.optimizer(grads)
        return losses

    def _micro_batch(self, inputs):
        loss = self.network(*inputs)
        weight = _sample_weight(inputs[0], self.mean)
        grads = self.grad(self.network, self.weights)(*inputs, _sens(loss, weight, self.guard.loss_scale))
        # The guard's policy without its counting (WindowGuard.micro_batch = filter + count), done once per window.
        grads, weight, bad = self.guard.filter(loss, grads, weight)
        return loss, grads, weight, bad


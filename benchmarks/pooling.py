"""Can graph-level code close the max-pooling gap? LeNet5's 2x2 max pooling written three ways, timed side by side.

MindSpore's CPU MaxPoolGrad runs oneDNN's `simple_nchw` pooling (plain NCHW has no jit pooling kernel) and
recomputes the forward pass to get its workspace (see the profile section). The rewrites below produce the
same forward values; average pooling is a different model, shown only as the cost of a pooling whose gradient
needs no max.
"""
from mindspore import nn, ops

from .common import BATCH, Table, cycle_calls, interleave, lenet, tensors


class ReshapeMaxPool(nn.Cell):
    """2x2/2 max pooling as reshape + ReduceMax: its gradient is elementwise masks, not MaxPoolGrad."""

    def construct(self, x):
        n, c, h, w = x.shape
        return x.reshape(n, c, h // 2, 2, w // 2, 2).amax(axis=(3, 5))


class AvgPool(nn.Cell):
    def construct(self, x):
        return ops.avg_pool2d(x, 2, 2)


def alternatives(batches, rounds: int, calls: int) -> Table:
    def step(pool):
        net, loss, opt = lenet()
        if pool is not None:
            net.max_pool2d = pool
        return cycle_calls(nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train(), tensors(batches))

    table = Table("p", "LeNet5's max pooling rewritten in the graph (nn.TrainOneStepCell b32)",
                  "one micro-batch of 32", BATCH, "nn.MaxPool2d (MaxPool + MaxPoolGrad, oneDNN simple_nchw)")
    table.rows = interleave({
        "nn.MaxPool2d (MaxPool + MaxPoolGrad, oneDNN simple_nchw)": step(None),
        "reshape + amax (same values, ReduceMax gradient)": step(ReshapeMaxPool()),
        "avg_pool2d (a different model: lower bound)": step(AvgPool()),
    }, rounds, calls)
    return table

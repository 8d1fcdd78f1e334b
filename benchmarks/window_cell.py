"""Prototype (benchmark-only, not library code): a whole accumulation window in one Cell call.

`WindowCell` takes a window of K equal micro-batches stacked as (K, B, ...) and, inside one graph, runs the K
forward/backward passes unrolled (a Python loop over a constant range, which graph mode unrolls), sums their
gradients in graph-local tensors and steps the optimizer once. Each micro-batch's backward pass gets the
sensitivity 1/K, so the sum is the window's mean gradient: with equal micro-batches it is exactly one step on
the concatenated K*B batch. There is no persistent gradient buffer and no counter (the sum lives only during
the call), and one Python->graph launch per window instead of K.

With `chain=True` micro-batch i+1 starts only after micro-batch i's gradient exists (`ops.depend`), so the
graph cannot interleave the K forward passes and keep K sets of activations alive at once; this is the
memory behaviour accumulation is for.
"""
from mindspore import nn, ops

_add = ops.MultitypeFuncGraph("window_add")


@_add.register("Tensor", "Tensor")
def _add_tensors(total, grad):
    return total + grad


class WindowCell(nn.Cell):
    """Inputs: images (K, B, C, H, W), labels (K, B). Output: the window's mean loss. One optimizer step."""

    def __init__(self, network_with_loss: nn.Cell, optimizer: nn.Optimizer, accumulate_step: int,
                 chain: bool = True) -> None:
        super().__init__(auto_prefix=False)
        self.network = network_with_loss
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.k = accumulate_step
        self.chain = chain
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()

    def construct(self, images, labels):
        loss = self.network(images[0], labels[0])
        sens = ops.fill(ops.dtype(loss), ops.shape(loss), 1.0 / self.k)
        grads = self.grad(self.network, self.weights)(images[0], labels[0], sens)
        total = loss
        for i in range(1, self.k):  # unrolled at compile time: K is a constant
            x = images[i]
            if self.chain:
                x = ops.depend(x, grads)  # finish micro-batch i-1 before starting i
            total = total + self.network(x, labels[i])
            grads = self.hyper_map(_add, grads, self.grad(self.network, self.weights)(x, labels[i], sens))
        return ops.depend(total / self.k, self.optimizer(grads))


def stack_window(batches, k: int):
    """numpy (images, labels) micro-batches -> windows of stacked (K, B, ...) arrays."""
    import numpy as np
    return [(np.stack([x for x, _ in batches[i:i + k]]), np.stack([y for _, y in batches[i:i + k]]))
            for i in range(0, len(batches) - k + 1, k)]


def check_equivalence(batches, k: int) -> float:
    """Max |param difference| after 3 windows: WindowCell on K micro-batches vs TrainOneStepCell on K*B."""
    import numpy as np
    from mindspore import Tensor
    from .common import lenet
    big_net, loss, big_opt = lenet(seed=1)
    win_net, _, win_opt = lenet(seed=1)
    big = nn.TrainOneStepCell(nn.WithLossCell(big_net, loss), big_opt).set_train()
    win = WindowCell(nn.WithLossCell(win_net, loss), win_opt, k).set_train()
    for images, labels in stack_window(batches, k)[:3]:
        big(Tensor(images.reshape((-1,) + images.shape[2:])), Tensor(labels.reshape(-1)))
        win(Tensor(images), Tensor(labels))
    return max(float(np.abs(a.asnumpy() - b.asnumpy()).max())
               for a, b in zip(big_opt.parameters, win_opt.parameters))


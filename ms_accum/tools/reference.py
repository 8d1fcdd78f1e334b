"""What `verify_equivalence` compares the executor with: the update of one large batch, built apart from the window's
machinery (no buffer, no closer, no structure), with the same meaning as the executor's options.

A reference step takes the gradient of the loss on the large batch; where ms_accum draws the dropout masks, the large
batch runs through the network one micro-batch after another, so that each forward draws the masks the window drew,
and one loss is taken of their outputs concatenated (a network that computes its own loss: the micro-batches'
gradients combined by the reduction's weights). On the host, in float64, the gradient is then divided as the window is
(the "sum" rule by the ranks' divisor) and clipped by its global norm as ``WindowOptions(clip_norm=...)`` clips the
window's, and the user's optimizer steps on it. A loss scale does not change what an update means: the reference is
unscaled.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import ParameterTuple, Tensor, nn, ops

from ..core.buffer import RULES
from ..core.columns import label_columns

BIG_BATCH = "one step on the large batch"
SAME_MASKS = ("the large batch with the masks the window drew (its micro-batches run through the network in turn, one "
              "loss of their outputs), apart from the window's machinery")
SAME_MASKS_PER_MICRO_BATCH = ("the micro-batches' gradients with the masks the window drew, combined by the "
                              "reduction's weights apart from the window's machinery")


def _concat(outputs):
    """The micro-batches' outputs joined along the batch axis (each part of a tuple output on its own)."""
    if isinstance(outputs[0], tuple):
        return tuple(ops.concat([out[i] for out in outputs], 0) for i in range(len(outputs[0])))
    return ops.concat(outputs, 0)


class _WindowLoss(nn.Cell):
    """The loss of `count` micro-batches run through `network` one after another, of their outputs concatenated: the
    large batch, each micro-batch's forward drawing its own masks. Its inputs are the micro-batches' columns, one
    micro-batch after another."""

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell, labels: int, count: int) -> None:
        super().__init__(auto_prefix=False)
        self.network, self.loss_fn, self.labels, self.count = network, loss_fn, labels, count

    def construct(self, *columns):
        width = len(columns) // self.count
        split = width - self.labels
        outputs = []
        for i in range(self.count):
            outputs.append(self.network(*columns[i * width:i * width + split]))
        labels = [ops.concat([columns[i * width + split + j] for i in range(self.count)], 0)
                  for j in range(self.labels)]
        return self.loss_fn(_concat(outputs), *labels)


class _Gradient(nn.Cell):
    """`(output, gradient of its loss)` of `net_with_loss` on a batch, with one forward: a dropout mask is drawn once
    per call, as in training. Under ``"weighted_mean"`` the output is ``(loss, weight)`` and the gradient the loss's."""

    def __init__(self, net_with_loss: nn.Cell, params, weighted: bool) -> None:
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.value_and_grad = ops.value_and_grad(net_with_loss, None, ParameterTuple(params), has_aux=weighted)

    def construct(self, *inputs):
        return self.value_and_grad(*inputs)


class _Apply(nn.Cell):
    """The user's optimizer stepped once on the gradients given."""

    def __init__(self, optimizer: nn.Optimizer) -> None:
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    def construct(self, *grads):
        return self.optimizer(grads)


def _float64(tensors) -> List[np.ndarray]:
    return [t.asnumpy().astype(np.float64) for t in tensors]


def clipped(grads: List[np.ndarray], clip_norm: Optional[float]) -> List[np.ndarray]:
    """`grads` scaled to the global norm `clip_norm` when theirs exceeds it, as `ops.clip_by_global_norm` clips."""
    if clip_norm is None:
        return grads
    norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads)))
    return grads if norm <= clip_norm else [g * (clip_norm / norm) for g in grads]


class Reference:
    """
    The large batch's updates, from the user's network, loss and optimizer.

    Args:
        net_with_loss (nn.Cell): The network with its loss, as the executor trains it.
        network (nn.Cell): The network.
        loss_fn (nn.Cell, optional): The loss; None when the network computes its own.
        optimizer (nn.Optimizer): The user's optimizer.
        reduction (str): The window's reduction.
        clip_norm (float, optional): The window's clipping.
        sum_divisor (float): What a ``"sum"`` window is divided by (1, or the ranks).
        same_masks (bool): Build the gradient from the micro-batches, with the masks they drew (`SAME_MASKS`),
            instead of one large batch (`BIG_BATCH`).
        sum_over_ranks (Callable, optional): Sums a list of arrays over the ranks, in data parallel; None stand-alone.
    """

    def __init__(self, net_with_loss: nn.Cell, network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer: nn.Optimizer,
                 reduction: str, clip_norm: Optional[float], sum_divisor: float, same_masks: bool,
                 sum_over_ranks=None) -> None:
        self.rule = RULES[reduction]()
        self.weighted = reduction == "weighted_mean"
        self.gradient = _Gradient(net_with_loss, optimizer.parameters, self.weighted)
        self.apply = _Apply(optimizer)
        self.params = list(optimizer.parameters)
        self.network, self.loss_fn = network, loss_fn
        self.window_losses: Dict[int, _Gradient] = {}  # micro-batches -> the gradient of their `_WindowLoss`
        self.clip_norm, self.sum_divisor, self.same_masks = clip_norm, sum_divisor, same_masks
        self.sum_over_ranks = sum_over_ranks
        self.kind = BIG_BATCH if not same_masks else SAME_MASKS if loss_fn is not None else SAME_MASKS_PER_MICRO_BATCH

    def prepare(self, counts) -> None:
        """Builds the Cells for windows of each of `counts` micro-batches (before `set_train`: building a Cell after
        the stochastic cells were held as in inference would set them to train again)."""
        if self.same_masks and self.loss_fn is not None:
            for count in counts:
                loss = _WindowLoss(self.network, self.loss_fn, label_columns(self.loss_fn), count)
                self.window_losses[count] = _Gradient(loss, self.params, self.weighted)

    def set_train(self) -> "Reference":
        for cell in (self.gradient, self.apply, *self.window_losses.values()):
            cell.set_train()
        return self

    def window_gradient(self, big_batch: Sequence[np.ndarray],
                        shares: Sequence[Tuple[np.ndarray, ...]]) -> List[np.ndarray]:
        """The update's gradient, float64: of the loss on `big_batch`, or, with `same_masks`, of this rank's
        micro-batch `shares` (every rank's summed in data parallel); divided and clipped as the window is."""
        if not self.same_masks:
            grads = _float64(self._output_and_grads(big_batch)[1])
            if self.rule.name == "sum":
                grads = [g / self.sum_divisor for g in grads]
            return clipped(grads, self.clip_norm)
        total, weights = [np.zeros(p.shape, np.float64) for p in self.params], 0.0
        for out, grads, samples in self._units(shares):
            weight = float(out[1].asnumpy()) if self.weighted else float(self.rule.weight(samples))
            total = [t + weight * g for t, g in zip(total, _float64(grads))]
            weights += weight
        total, weights = self._summed_over_ranks(total, weights)
        divisor = self.sum_divisor if self.rule.name == "sum" else weights
        return clipped([t / divisor for t in total], self.clip_norm)

    def step(self, big_batch: Sequence[np.ndarray], shares: Sequence[Tuple[np.ndarray, ...]]) -> None:
        """One reference update."""
        grads = self.window_gradient(big_batch, shares)
        self.apply(*[Tensor(g, p.dtype) for g, p in zip(grads, self.params)])

    def _output_and_grads(self, arrays):
        return self.gradient(*[Tensor(a) for a in arrays])

    def _units(self, shares: Sequence[Tuple[np.ndarray, ...]]):
        """`(output, gradient, samples)` of this rank's part of the window with the masks the window drew: its
        micro-batches in one loss when the loss is apart from the network, else each micro-batch on its own."""
        if self.loss_fn is None:
            return [(*self._output_and_grads(share), share[0].shape[0]) for share in shares]
        out, grads = self.window_losses[len(shares)](*[Tensor(a) for share in shares for a in share])
        return [(out, grads, sum(share[0].shape[0] for share in shares))]

    def _summed_over_ranks(self, total: List[np.ndarray], weights: float) -> Tuple[List[np.ndarray], float]:
        if self.sum_over_ranks is None:
            return total, weights
        *total, weights = self.sum_over_ranks([*total, np.array([weights])])
        return total, float(weights[0])

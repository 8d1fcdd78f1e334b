"""Losses for sequence models: one that says how many items it averaged, for token-weighted windows, and the plain
mean of such a loss, for the large-batch step it is compared with."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


class TokenCrossEntropy(nn.Cell):
    r"""
    Cross-entropy over the tokens whose target is not `ignore_index` (padding): returns the mean over those tokens
    and their count, the `(loss, weight)` that ``reduction="weighted_mean"`` accumulates.

    With it, a window of padded micro-batches of any lengths gives the update of one large batch whose loss is the
    mean over all its real tokens (a mean of per-micro-batch means would weight a short micro-batch's tokens more).

    Args:
        ignore_index (int): The target of padding positions. Default: ``-100``.

    Inputs:
        - **logits** (Tensor) - :math:`(..., C)`.
        - **targets** (Tensor) - int32 :math:`(...)`, the class of each position or `ignore_index`.

    Outputs:
        Tuple of (Tensor, Tensor): the mean loss over the real tokens (0 when there are none), and their count
        (float32).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import GradientAccumulation, TokenCrossEntropy
        >>> # GradientAccumulation(language_model, TokenCrossEntropy(ignore_index=0), optimizer,
        >>> #                      reduction="weighted_mean")
    """

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def construct(self, logits, targets):
        logits = ops.reshape(logits, (-1, ops.shape(logits)[-1]))
        targets = ops.reshape(targets, (-1,))
        real = targets != self.ignore_index
        nll = -ops.gather_elements(ops.log_softmax(logits, -1), 1,
                                   ops.reshape(ops.select(real, targets, ops.zeros_like(targets)), (-1, 1)))
        mask = ops.cast(real, ms.float32)
        count = mask.sum()
        return (ops.reshape(nll, (-1,)) * mask).sum() / ops.maximum(count, 1.0), count


class LossOnly(nn.Cell):
    r"""
    The loss alone of a Cell that returns ``(loss, weight)``: what a plain, non-accumulated step (e.g.
    `nn.TrainOneStepCell`) trains on one large batch, whose loss is then the mean over all its items.

    Args:
        cell (nn.Cell): A loss, or a network with its loss, returning ``(loss, weight)`` (e.g. `TokenCrossEntropy`).

    Inputs:
        - **\*inputs** - `cell`'s inputs.

    Outputs:
        Tensor, `cell`'s loss.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import LossOnly, TokenCrossEntropy
        >>> # nn.TrainOneStepCell(nn.WithLossCell(language_model, LossOnly(TokenCrossEntropy())), optimizer)
    """

    def __init__(self, cell: nn.Cell) -> None:
        super().__init__()
        self.cell = cell

    def construct(self, *inputs):
        return self.cell(*inputs)[0]

"""Losses for sequence models: one that says how many items it averaged, for token-weighted windows, and the plain
mean of such a loss, for the large-batch step it is compared with."""
from __future__ import annotations

import weakref
from typing import Optional, Sequence

import mindspore as ms
from mindspore import Tensor, nn, ops

from .._choices import REDUCTIONS
from .._validation import Argument, ArgumentValueError, check_isinstance, check_value_in, door, wrong_type
from .inference import in_inference


class TokenCrossEntropy(nn.Cell):
    r"""
    Cross-entropy over the tokens whose target is not `ignore_index` (padding): returns the mean over those tokens
    and their count, the `(loss, weight)` that ``reduction="weighted_mean"`` accumulates.

    With it, a window of padded micro-batches of any lengths gives the update of one large batch whose loss is the
    mean over all its real tokens (a mean of per-micro-batch means would weight a short micro-batch's tokens more).

    Args:
        ignore_index (int): The target of padding positions. Default: ``-100``.

    Raises:
        TypeError: If `ignore_index` is not an int.

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

    @door("TokenCrossEntropy")
    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise wrong_type(ignore_index, "ignore_index", "an int, the target of padding positions")
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

    Raises:
        TypeError: If `cell` is not a Cell.

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

    @door("LossOnly")
    def __init__(self, cell: nn.Cell) -> None:
        super().__init__()
        self.cell = check_isinstance(cell, "cell", nn.Cell)

    def construct(self, *inputs):
        return self.cell(*inputs)[0]


WEIGHTED = "weighted_mean"


def declared_reduction(loss_fn: nn.Cell) -> Optional[str]:
    """What `loss_fn` says it reduces the batch to: ``"mean"``, ``"sum"`` or ``"none"`` for MindSpore's losses (their
    `reduction`, or `LossBase`'s `average` and `reduce` flags where a loss keeps no `reduction`), None for a Cell that
    does not say."""
    own = getattr(loss_fn, "reduction", None)
    if own in ("mean", "sum", "none"):
        return own
    if isinstance(loss_fn, nn.LossBase):
        return "none" if not loss_fn.reduce else "mean" if loss_fn.average else "sum"
    return None


def window_reduction(loss_fn: Optional[nn.Cell], reduction: Optional[str]) -> str:
    """
    The window's reduction for `loss_fn`, honouring what the loss says it computes: a loss that sums over its batch
    is accumulated by summing (the window's gradient is then the gradient of the sum over the whole window, one step
    on the concatenated batch with that loss), a mean by the sample-weighted mean.

    Args:
        loss_fn (nn.Cell, optional): The loss; None for a network that computes its own loss (``"mean"`` unless
            `reduction` says otherwise).
        reduction (str, optional): The reduction asked for; None takes the loss's own.

    Returns:
        str, ``"mean"``, ``"sum"`` or ``"weighted_mean"``.

    Raises:
        ValueError: If `loss_fn` does not reduce its batch to a scalar (``reduction="none"``), or `reduction` is
            unknown, or `loss_fn` sums and `reduction` asks for a mean: the update would silently be a fraction of
            the large batch's.
    """
    if loss_fn is None:
        return "mean" if reduction is None else check_value_in(reduction, "reduction", REDUCTIONS)
    own = declared_reduction(loss_fn)
    if own == "none":  # one loss per sample: there is no window of it to accumulate
        raise ArgumentValueError(
            "{@loss_fn:subject} must reduce the batch to a scalar, but got {name} with reduction 'none': build it with "
            "{reduction=} (or 'sum').", name=type(loss_fn).__name__, reduction='mean')
    if reduction is None:
        return "sum" if own == "sum" else "mean"
    check_value_in(reduction, "reduction", REDUCTIONS)
    if own == "sum" and reduction != "sum":
        raise ArgumentValueError(
            "{@reduction:subject} must be 'sum' or None for a loss_fn that sums over its batch ({name} with reduction "
            "'sum'), but got '{given}': a window of K sums divided by its samples is 1/K of the large batch's "
            "update. Leave {@reduction} out, or build the loss with {reduction=}.", name=type(loss_fn).__name__,
            given=reduction, reduction='mean')
    return reduction


_checked = weakref.WeakKeyDictionary()  # network -> the reductions its output was checked for


def check_loss_output(network: nn.Cell, inputs: Sequence[Tensor], reduction: str, arg_name: str = "network") -> None:
    """
    Refuses a network (with its loss) whose output does not fit `reduction`.

    ``"weighted_mean"`` needs `(loss, weight)`; ``"mean"`` and ``"sum"`` need a loss alone. Which one the network
    returns is found by running it once on `inputs`, eagerly (PyNative, nothing compiles) and in inference mode (so no
    BatchNorm statistic moves), then restoring the mode and every Cell's training flag. Each network is checked once
    per reduction.

    Args:
        network (nn.Cell): The network with its loss.
        inputs (Sequence[Tensor]): One micro-batch, as `network` takes it.
        reduction (str): The reduction it is trained with.
        arg_name (str): The argument that gave the loss, for the message. Default: ``"network"``.

    Raises:
        ValueError: If `network` returns `(loss, weight)` and `reduction` is not ``"weighted_mean"``, or returns
            something else and `reduction` is ``"weighted_mean"``.
    """
    misfit = loss_output_error(network, inputs, reduction, arg_name)
    if misfit is not None:
        raise misfit


def loss_output_error(network: nn.Cell, inputs: Sequence[Tensor], reduction: str,
                      arg_name: str = "network") -> Optional[ValueError]:
    """The error `check_loss_output` raises, or None when the output fits; one eager pass, once per network and
    reduction that fit. Unnamed: the door it is raised through names it."""
    if reduction in _checked.get(network, ()):
        return None
    out = _eager_output(network, inputs)
    pair = isinstance(out, (tuple, list))
    if pair and reduction != WEIGHTED:
        return ArgumentValueError("{@reduction:subject} must be '{WEIGHTED}' for a loss that returns (loss, weight), "
                                  "as the {arg_name} given does, but got '{reduction}'.", WEIGHTED=WEIGHTED,
                                  arg_name=Argument(arg_name), reduction=reduction)
    if not pair and reduction == WEIGHTED:
        return ArgumentValueError("{arg_name:subject} must return (loss, weight) under {reduction=} (e.g. "
                                  "ms_accum.TokenCrossEntropy: the mean over real tokens and their count), but it "
                                  "returns {value}; a loss alone needs reduction='mean' or 'sum'.",
                                  arg_name=Argument(arg_name), reduction=WEIGHTED, value=_describe(out))
    _checked.setdefault(network, set()).add(reduction)
    return None


def returns_weight(network: nn.Cell, inputs: Sequence[Tensor]) -> bool:
    """Whether `network` (with its loss) returns ``(loss, weight)``, the output ``"weighted_mean"`` trains on, found
    as `check_loss_output` finds it: one eager forward pass in inference mode."""
    return isinstance(_eager_output(network, inputs), (tuple, list))


def _eager_output(network: nn.Cell, inputs: Sequence[Tensor]):
    # Without the backward's flag: with it, PyNative records the pass for a gradient and keeps its activations, memory
    # that stays with the process beside the graph's (docs/mindspore.md, an eager pass's memory).
    mode, requires_grad = ms.get_context("mode"), network.requires_grad
    with in_inference(network) as hold:
        hold()
        ms.set_context(mode=ms.PYNATIVE_MODE)
        network.set_grad(False)
        try:
            return network(*inputs)
        finally:
            network.set_grad(requires_grad)
            ms.set_context(mode=mode)


def _describe(out) -> str:
    if isinstance(out, Tensor):
        return f"a Tensor of shape {tuple(out.shape)}"
    return f"{type(out).__name__}"

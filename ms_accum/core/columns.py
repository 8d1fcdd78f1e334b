"""How a batch's columns reach the network and its loss: the first ones go to the network, in order, the last ones to
the loss as its labels (as many as the loss takes after the network's output). MindSpore's `nn.WithLossCell` is the
case of two columns; a batch of ``(input_ids, attention_mask, token_type_ids, label)`` is four."""
from __future__ import annotations

import inspect
from typing import Optional

from mindspore import nn

from .._mindspore import WITH_LOSS_BACKBONE, WITH_LOSS_FN, with_loss_cells


def label_columns(loss_fn: nn.Cell) -> int:
    """How many label columns `loss_fn` takes: the required positional arguments of its `construct` after the
    network's output (at least one; a loss that takes ``*labels`` takes one)."""
    parameters = inspect.signature(loss_fn.construct).parameters.values()
    required = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    return max(1, len(required) - 1)


class WithLossColumns(nn.WithLossCell):
    r"""
    `nn.WithLossCell` over a batch of any number of columns: the network takes the first ones, in order, and the loss
    the network's output and the last `labels` ones.

    Args:
        backbone (nn.Cell): The network.
        loss_fn (nn.Cell): The loss, ``loss_fn(output, *labels)``.
        labels (int): How many of the last columns are the loss's labels. Default: ``1``.

    Inputs:
        - **\*columns** (Tensor) - One batch: the network's inputs, then the labels.

    Outputs:
        The loss's output.
    """

    def __init__(self, backbone: nn.Cell, loss_fn: nn.Cell, labels: int = 1) -> None:
        super().__init__(backbone, loss_fn)
        with_loss_cells(self)  # MindSpore's names for the two Cells, which construct reads, hold in this release
        self.labels = labels

    def construct(self, *columns):
        split = len(columns) - self.labels
        network, loss_fn = getattr(self, WITH_LOSS_BACKBONE), getattr(self, WITH_LOSS_FN)
        return loss_fn(network(*columns[:split]), *columns[split:])


def with_loss(network: nn.Cell, loss_fn: nn.Cell) -> nn.Cell:
    """The Cell that maps a batch's columns to its loss: `network` itself when it computes its own loss (`loss_fn`
    None), else `network` and `loss_fn` over the columns (`WithLossColumns`)."""
    if loss_fn is None:
        return network
    return WithLossColumns(network, loss_fn, label_columns(loss_fn))


def columns_wanted(net_with_loss: nn.Cell, count: int) -> Optional[str]:
    """None when a batch of `count` columns can feed `net_with_loss` (`with_loss`), else what it must hold instead:
    the number of inputs its network's `construct` takes, then the loss's labels."""
    labels = net_with_loss.labels if isinstance(net_with_loss, WithLossColumns) else 0
    network = net_with_loss.backbone_network if labels else net_with_loss
    inputs = count - labels
    parameters = list(inspect.signature(network.construct).parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        least, most = 1, count
    else:
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        least, most = len([p for p in positional if p.default is p.empty]), len(positional)
    if least <= inputs <= most and inputs >= 1:
        return None
    takes = f"{least}" if least == most else f"{least} to {most}"
    return (f"the network's {takes} input(s), then the loss's {labels} label(s)" if labels else
            f"the network's {takes} input(s) (it computes its own loss)")


def check_columns(net_with_loss: nn.Cell, columns: list, arg_name: str = "train_dataset") -> None:
    """Refuses, before anything compiles, a batch whose `columns` (their names or shapes) cannot feed `net_with_loss`
    (`with_loss`): too few for the loss's labels, or a number of inputs the network's `construct` cannot take."""
    from .._validation import Argument, ArgumentValueError
    wanted = columns_wanted(net_with_loss, len(columns))
    if wanted is not None:
        raise ArgumentValueError("{arg_name:subject} must yield the columns of {wanted}, but it yields "
                                 "{value}: {columns}.", arg_name=Argument(arg_name), wanted=wanted, value=len(columns),
                                 columns=columns)

"""Recomputation: trade compute for memory when even one micro-batch's activations do not fit.

Accumulation bounds the batch held at once to one micro-batch; recomputation (MindSpore's `Cell.recompute()`)
goes further and keeps only the inputs of the chosen cells, running their forward again during the backward
pass. Gradients are unchanged; each marked cell's forward runs twice.
"""
from __future__ import annotations

from typing import Iterable, List

from mindspore import nn

from .._validation import Argument, ArgumentTypeError, ArgumentValueError, check_isinstance, door


@door("recompute_cells")
def recompute_cells(network: nn.Cell, names: Iterable[str], arg_name: str = "names") -> List[str]:
    """
    Marks the sub-cells of `network` at the given paths for recomputation (`Cell.recompute()`).

    Call it before the network is first compiled (before the first training step).

    Args:
        network (nn.Cell): The network.
        names (Iterable[str]): Paths as `network.cells_and_names()` gives them, e.g. ``["conv1", "fc1"]``.
        arg_name (str): The argument that gave `names`, for messages. Default: ``"names"``.

    Returns:
        list[str], the marked paths.

    Raises:
        TypeError: If `network` is not a Cell, `names` is a str rather than a list of them, or a name is not a str.
        ValueError: If a name is not a sub-cell of `network` (the message lists the valid paths).

    Examples:
        >>> from ms_accum.demo.models import LeNet5
        >>> from ms_accum.train.recompute import recompute_cells
        >>> recompute_cells(LeNet5(), ["conv1", "conv2"])
        ['conv1', 'conv2']
    """
    check_isinstance(network, "network", nn.Cell)
    cells = {path: cell for path, cell in network.cells_and_names() if path}
    if isinstance(names, str):  # a str is iterable too: its letters are no cell paths
        raise ArgumentTypeError("{arg_name:subject} must be a list of cell paths, e.g. ['{names}'], but got "
                                "the str '{names}'.", arg_name=Argument(arg_name), names=names)
    names = list(names)
    for name in names:
        check_isinstance(name, arg_name, str)
        if name not in cells:
            raise ArgumentValueError("{arg_name:subject} must hold sub-cells of the network, but got '{name}'; valid "
                                     "paths: {value}.", arg_name=Argument(arg_name), name=name, value=sorted(cells))
    for name in names:
        cells[name].recompute()
    return names

"""Running a network as in inference for a moment: no dropout mask drawn, no BatchNorm statistic moved."""
from __future__ import annotations

import contextlib
from typing import Iterable, Optional

from mindspore import nn


@contextlib.contextmanager
def in_inference(network: nn.Cell, paths: Optional[Iterable[str]] = None):
    """Yields `hold`, which sets the cells at `paths` (every cell when None) to run as in inference (call it again after
    every `set_train`, which sets them all to train); every cell of `network` gets its training flag back afterwards."""
    cells = list(network.cells_and_names())
    flags = [cell.training for _, cell in cells]
    held = [cell for name, cell in cells if paths is None or (name or type(cell).__name__) in set(paths)]

    def hold():
        for cell in held:
            cell.add_flags(training=False)

    try:
        yield hold
    finally:
        for (_, cell), flag in zip(cells, flags):
            cell.add_flags(training=flag)

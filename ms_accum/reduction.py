"""How a window's micro-batches combine: a sample-weighted mean, or a sum. Chosen once, held by the buffer.

Each rule is a small `jit_class` with the two answers every graph needs: what one micro-batch weighs, and what
the window's (possibly all-reduced) sum is divided by. Choosing the object at `__init__` keeps mode branches out
of graph code (README, "Known MindSpore behaviour": a constant if/else ahead of a tensor `if`).
"""
from __future__ import annotations

from typing import Union

import mindspore as ms

from ._validation import check_value_in

REDUCTIONS = ("mean", "sum")


@ms.jit_class
class SampleMean:
    """``"mean"``: a micro-batch weighs its samples; the window is divided by the samples it holds."""

    name = "mean"

    def weight(self, samples):
        return samples

    def divisor(self, samples, sum_divisor):
        return samples


@ms.jit_class
class Sum:
    """``"sum"``: every micro-batch weighs 1; the window is divided by `sum_divisor` (1, or the ranks)."""

    name = "sum"

    def weight(self, samples):
        return 1.0

    def divisor(self, samples, sum_divisor):
        return sum_divisor


Reduction = Union[SampleMean, Sum]


def reduction_rule(reduction: str, cls_name: str) -> Reduction:
    """The rule named `reduction`, ``"mean"`` or ``"sum"``; a ValueError in MindSpore's wording otherwise."""
    return SampleMean() if check_value_in(reduction, "reduction", REDUCTIONS, cls_name) == "mean" else Sum()

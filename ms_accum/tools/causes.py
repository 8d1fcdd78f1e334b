"""Why an accumulated window can differ from one big batch: the causes `verify_equivalence` names, with evidence.

Some layers and losses make a window of K micro-batches differ from one step on their concatenation however exact the
accumulation is: BatchNorm normalizes each micro-batch by its own statistics; a loss that sums makes the window K times
smaller than the big batch (the window divides by the samples seen); a loss that couples the samples of a batch
(in-batch negatives, a normalization over the batch) sees K small batches instead of one. An adaptive optimizer can also
turn rounding into a visible parameter difference. The executor's own machinery can differ too (a buffer not cleared, an
optimizer that counted other steps, a window skipped, ranks not combined): those causes say it is not the model's doing.
Dropout that ms_accum draws is compared with the masks the window drew; other random layers, whose masks MindSpore's
kernels draw, run as in inference for both (`ms_accum.tools.verify`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
from mindspore import nn

from .._mindspore import batchnorm_types


@dataclass(frozen=True)
class Cause:
    """One reason the window differs from the big batch: what, the evidence, and what to do."""

    name: str
    evidence: str
    fix: str

    def __str__(self) -> str:
        return f"cause: {self.name}: {self.evidence}. Fix: {self.fix}."


def batchnorm_cells(network: nn.Cell) -> List[str]:
    """Paths of BatchNorm layers (MindSpore's BatchNorm1d/2d/3d and their subclasses) that normalize by the batch's
    own statistics when training."""
    return [name or type(cell).__name__ for name, cell in network.cells_and_names()
            if isinstance(cell, batchnorm_types()) and cell.use_batch_statistics is not False]


def stochastic_cells(network: nn.Cell) -> List[str]:
    """Paths of layers that draw a random mask when training: dropout with a positive rate, drop-path."""
    found = []
    for name, cell in network.cells_and_names():
        dropout = isinstance(cell, nn.Dropout) and getattr(cell, "p", 1.0 - getattr(cell, "keep_prob", 1.0)) > 0
        if dropout or "droppath" in type(cell).__name__.lower():
            found.append(name or type(cell).__name__)
    return found


def _listed(names: List[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} layer(s), " * (len(names) > shown) + ", ".join(names[:shown]) + more


def explain(batchnorm: List[str], window_grads: List[np.ndarray], big_grads: List[np.ndarray],
            accumulate_step: int, parameter_diff: float, rtol: float, atol: float) -> List[Cause]:
    """The causes of a failed comparison, from the network's layers and the two gradients (the window's, the big
    batch's), which do not depend on the optimizer."""
    grad_diff = max(float(np.abs(w - b).max(initial=0.0)) for w, b in zip(window_grads, big_grads))
    grads_equal = all(np.allclose(w, b, rtol=rtol, atol=atol) for w, b in zip(window_grads, big_grads))
    window_norm = float(np.sqrt(sum(float((w.astype(np.float64) ** 2).sum()) for w in window_grads)))
    big_norm = float(np.sqrt(sum(float((b.astype(np.float64) ** 2).sum()) for b in big_grads)))
    ratio = big_norm / window_norm if window_norm > 0 else float("inf")
    causes = []
    if batchnorm:
        causes.append(Cause(
            name="BatchNorm layers in training mode",
            evidence=f"{_listed(batchnorm)} normalize each micro-batch by its own mean and variance, the big batch "
                     f"by the batch's; the gradients differ by up to {grad_diff:.3e}",
            fix="ms_accum.replace_batchnorm(network) before the optimizer is built (every BatchNorm1d/2d/3d becomes a "
                "GroupNorm, which normalizes each sample on its own), or accept the difference"))
    if accumulate_step > 1 and abs(ratio - accumulate_step) <= 0.1 * accumulate_step:
        causes.append(Cause(
            name="a loss that sums over the batch instead of averaging",
            evidence=f"the big batch's gradient is {ratio:.2f}x the window's (K = {accumulate_step}): the window "
                     f"divides by the samples it holds, so its update is K times smaller",
            fix="average the loss over the batch (e.g. reduction='mean'), or accumulate with reduction='sum'"))
    elif grads_equal:
        causes.append(Cause(
            name="the optimizer magnifies rounding",
            evidence=f"the window's gradient equals the big batch's (max abs diff {grad_diff:.3e}, within rtol "
                     f"{rtol:g}, atol {atol:g}) but the parameters differ by up to {parameter_diff:.3e}: an adaptive "
                     f"step such as Adam's first, lr * g / (|g| + eps), turns gradients that are rounding noise into "
                     f"full steps",
            fix="verify with nn.SGD or nn.Momentum, which pass a gradient's difference through unchanged"))
    elif not batchnorm:
        causes.append(Cause(
            name="a loss that couples the samples of a batch",
            evidence=f"the gradients differ by up to {grad_diff:.3e} and no BatchNorm or summing loss explains it: "
                     f"in-batch negatives or a normalization over the batch inside the loss see K small batches "
                     f"instead of one",
            fix="use structure=\"cached\" (GradientAccumulation(..., structure=\"cached\"), gradient caching: the "
                "loss runs once on the whole window's outputs, docs/cached.md), or make the loss a mean of per-sample "
                "terms"))
    return causes


# What a later window can carry over that no model or setting of the user's explains: the window's own machinery.
_CARRIED_FIX = ("not your model's doing: report it with your MindSpore and ms_accum versions; PyNative mode "
                "(ms.set_context(mode=ms.PYNATIVE_MODE)) runs the window without compiling it")


def uncleared_buffer(window: int, held: float) -> Cause:
    """The cause of a later window's difference when the buffer still held something after window `window`'s
    update: up to `held` in magnitude, in its sums or counters."""
    return Cause(
        name="a buffer not cleared after the update",
        evidence=f"after window {window}'s update the accumulation buffer still held values up to {held:.3e} instead "
                 f"of zeros, so window {window + 1} added its micro-batches to what window {window} left",
        fix=_CARRIED_FIX)


def skipped_window(window: int) -> Cause:
    """The cause of a difference when the executor skipped window `window` as not finite."""
    return Cause(
        name="a window skipped as not finite",
        evidence=f"the executor skipped window {window}: its gradient or loss was not finite (with a loss scaler, the "
                 f"scaled backward overflowed), so the optimizer did not step where the large batch did",
        fix="check the loss on this batch; with a loss scaler, start from a smaller scale "
            "(GuardOptions(loss_scaler=...))")


def uncombined_ranks(window: int, apart: float) -> Cause:
    """The cause of a data-parallel difference when the ranks held different window gradients after the window's
    all-reduce: up to `apart` from rank 0's."""
    return Cause(
        name="ranks whose windows were not combined",
        evidence=f"after window {window}'s all-reduce the ranks' window gradients differ from rank 0's by up to "
                 f"{apart:.3e}: each applied its own share instead of the global batch's",
        fix=_CARRIED_FIX)


def miscounted_steps(window: int, expected: int, actual: int) -> Cause:
    """The cause of a difference when the optimizer's ``global_step`` after window `window` is `actual`, where the
    big batch's steps left `expected`."""
    return Cause(
        name="an optimizer that counted other steps",
        evidence=f"after window {window} the optimizer's global_step is {actual}, after {window} big-batch steps "
                 f"{expected}: a learning rate that changes with the step (a list, a LearningRateSchedule) is read at "
                 f"another step, and every update should step it once",
        fix=_CARRIED_FIX)

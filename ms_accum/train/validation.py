"""Validation during training: a score on held-out data every few optimizer steps, the best checkpoint kept.

`train_process(..., eval_dataset=..., eval_every=N)` scores the network every N optimizer steps (counted as
`StepRecord.step` counts them, so a resumed run scores at the same steps) and at the end: the loss, the accuracy when
the labels are one column of integer classes or a binary classifier's (`nn.BCEWithLogitsLoss` over one logit a
sample), and any MindSpore `Metric` passed. The network runs in inference mode
(dropout off) through one graph of its own, built once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np
from mindspore import Tensor, nn
from mindspore.dataset import Dataset

from .._validation import ArgumentValueError, check_isinstance, check_positive_int, door
from ..core.columns import label_columns


@dataclass(frozen=True)
class Validation:
    r"""
    When and how `train_process` scores its `eval_dataset`.

    Args:
        every (int): Optimizer steps between scores; the run's last step is scored too.
        metrics (dict, optional): More scores, name -> `mindspore.train.Metric` (e.g. ``{"f1": F1()}``), each updated
            with the network's output and the labels of every batch. Default: ``None``.
        keep_best (str, optional): Keep the network whose score of this name is best (the lowest ``"loss"``, else the
            highest) in ``{directory}/{name}-best.ckpt`` (or ``.safetensors``, the `format`) of the run's
            `Checkpoints`. Default: ``None``.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `every` is not positive.
    """

    every: int
    metrics: Optional[dict] = None
    keep_best: Optional[str] = None

    @door("Validation")
    def __post_init__(self) -> None:
        check_positive_int(self.every, "eval_every")
        if self.metrics is not None:
            check_isinstance(self.metrics, "metrics", dict)
        if self.keep_best is not None:
            check_isinstance(self.keep_best, "keep_best", str)


class _EvalCell(nn.Cell):
    """The network and its loss over a batch's columns, in one graph: `(output, loss)`."""

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.network, self.loss_fn, self.labels = network, loss_fn, label_columns(loss_fn)

    def construct(self, *columns):
        split = len(columns) - self.labels
        out = self.network(*columns[:split])
        return out, self.loss_fn(out, *columns[split:])


@dataclass
class Evaluator:
    """Scores `network` (with `loss_fn`, or alone when it computes its own loss) on a dataset."""

    network: nn.Cell
    loss_fn: Optional[nn.Cell]
    validation: Validation
    best: float = math.nan  # the best `keep_best` score so far
    cell: nn.Cell = field(init=False)

    def __post_init__(self) -> None:
        self.cell = self.network if self.loss_fn is None else _EvalCell(self.network, self.loss_fn)

    def due(self, step: int, last: bool) -> bool:
        """Whether the run scores after optimizer step `step` (`last`: the run's last)."""
        return last or step % self.validation.every == 0

    def score(self, dataset: Dataset, reducer) -> Dict[str, float]:
        """The loss over `dataset` (sample-weighted), its accuracy for integer class labels, and the metrics; the loss
        and the accuracy over every rank's shard (`reducer`, the buffer's), the metrics over this rank's."""
        metrics = dict(self.validation.metrics or {})
        for metric in metrics.values():
            metric.clear()
        self.network.set_train(False)
        loss_sum = weight_sum = correct = samples = 0.0
        classes, binary = self.loss_fn is not None, isinstance(self.loss_fn, nn.BCEWithLogitsLoss)
        try:
            for columns in dataset.create_tuple_iterator(num_epochs=1):
                out, loss = (None, self.cell(*columns)) if self.loss_fn is None else self.cell(*columns)
                loss, weight = (loss if isinstance(loss, tuple) else (loss, columns[0].shape[0]))
                loss_sum += float(loss.asnumpy()) * float(np.asarray(weight))
                weight_sum += float(np.asarray(weight))
                label = columns[-1]
                samples += columns[0].shape[0]
                hits = _hits(out, label, binary) if classes else None
                classes = hits is not None
                correct += hits or 0
                for metric in metrics.values():
                    metric.update(out, label)
        finally:
            self.network.set_train(True)
        totals = np.asarray([loss_sum, weight_sum, correct, samples, float(classes), 1.0], np.float32)
        loss_sum, weight_sum, correct, samples, classes, ranks = reducer.total(Tensor(totals)).asnumpy().astype(float)
        if weight_sum == 0:
            raise ArgumentValueError("{@eval_dataset:subject} must yield at least one batch, but it yields none.")
        scores = {"loss": loss_sum / weight_sum}
        if classes == ranks:  # classified on every rank (each adds 1.0 to `ranks` in the same all-reduce)
            scores["accuracy"] = correct / samples
        scores.update((name, float(np.asarray(metric.eval()))) for name, metric in metrics.items())
        return scores

    def improved(self, scores: Dict[str, float]) -> bool:
        """Whether `scores` beat the best so far in `keep_best` (then it becomes the best)."""
        name = self.validation.keep_best
        if name is None:
            return False
        if name not in scores:
            raise ArgumentValueError("{@keep_best:subject} must name a score of the validation, one of {value}, but "
                                     "got '{name}'.", value=sorted(scores), name=name)
        value = scores[name]
        better = math.isnan(self.best) or (value < self.best if name == "loss" else value > self.best)
        if better:
            self.best = value
        return better


def _hits(out, label, binary: bool) -> Optional[int]:
    """How many samples `out` classifies right, or None when it is no classifier's: one score per class against one
    integer class per sample (the argmax), or a binary classifier's one logit per sample (`binary`: its loss is
    `nn.BCEWithLogitsLoss`) against labels 0 and 1 (a logit above 0 says 1)."""
    if not (isinstance(out, Tensor) and isinstance(label, Tensor)) or out.shape[:1] != label.shape[:1]:
        return None
    if binary and out.shape == label.shape and out.shape[1:] in ((), (1,)):
        return int(((out.asnumpy() > 0) == (label.asnumpy() > 0.5)).sum())
    if label.ndim == 1 and out.ndim == 2 and np.issubdtype(label.asnumpy().dtype, np.integer):
        return int((out.asnumpy().argmax(-1) == label.asnumpy()).sum())
    return None

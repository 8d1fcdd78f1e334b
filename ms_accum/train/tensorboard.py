"""Training figures for TensorBoard, written through tensorboardX (``pip install 'ms_accum[tensorboard]'``), as
MindFormers writes its own: an `on_step` callback of `LogOptions`."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from .._mindspore import LearningRateSchedule
from .._validation import ArgumentValueError, check_isinstance, check_writable_dir, door
from .records import StepRecord


def learning_rate_at(optimizer: nn.Optimizer, step: int) -> float:
    """The learning rate of `optimizer`'s update at optimizer step `step` (from 1): its schedule (a list of rates is
    one too) evaluated at the optimizer's step count before that update, else its fixed rate; the first group's with
    parameter groups."""
    rate = optimizer.learning_rate
    if isinstance(rate, (list, tuple, nn.CellList, ms.ParameterTuple)):
        rate = rate[0]
    if isinstance(rate, LearningRateSchedule):
        return float(rate(Tensor(step - 1, ms.int32)).asnumpy())
    return float(np.asarray(rate.asnumpy() if isinstance(rate, (Parameter, Tensor)) else rate).reshape(-1)[0])


class TensorBoardLog:
    r"""
    Writes each optimizer step's figures for TensorBoard: ``train/loss``, ``train/accumulate_step`` (K),
    ``train/samples_consumed``, ``train/learning_rate`` (given the optimizer), ``train/grad_norm`` and
    ``train/noise_scale`` (when measured), ``train/lr_scale`` (`AdaptiveK`'s factor), ``train/loss_scale``, and
    ``validation/<score>`` when scored; the x axis is the optimizer step. Give it as `LogOptions(on_step=...)`; in
    data parallel build it on rank 0 only.

    Args:
        logdir (str): The event files' directory (``tensorboard --logdir DIR`` shows them).
        optimizer (nn.Optimizer, optional): Its learning rate is written too. Default: ``None``.

    Inputs:
        - **record** (StepRecord) - One window's record.

    Outputs:
        None, so the run goes on.

    Raises:
        TypeError: If `logdir` is not a path or `optimizer` not an nn.Optimizer.
        ValueError: If `logdir` is not a writable directory (it is created if need be), or tensorboardX is not
            installed.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    @door("TensorBoardLog")
    def __init__(self, logdir: str, optimizer: Optional[nn.Optimizer] = None) -> None:
        check_writable_dir(logdir, "logdir")  # before training, not at its first step
        if optimizer is not None:
            check_isinstance(optimizer, "optimizer", nn.Optimizer)
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ArgumentValueError("writing for TensorBoard needs tensorboardX: pip install "
                                     "'ms_accum[tensorboard]'.") from None
        self.writer, self.optimizer = SummaryWriter(logdir), optimizer

    def __call__(self, record: StepRecord) -> None:
        figures = {"loss": record.loss, "accumulate_step": record.accumulate_step,
                   "samples_consumed": record.samples_consumed, "loss_scale": record.loss_scale,
                   "grad_norm": record.grad_norm, "noise_scale": record.noise_scale, "lr_scale": record.lr_scale}
        if self.optimizer is not None:
            figures["learning_rate"] = learning_rate_at(self.optimizer, record.step)
        for name, value in figures.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                self.writer.add_scalar(f"train/{name}", value, record.step)
        for name, value in (record.validation or {}).items():
            self.writer.add_scalar(f"validation/{name}", value, record.step)

    def close(self) -> None:
        """Writes what is pending and closes the event file (tensorboardX writes every 2 minutes until then)."""
        self.writer.close()

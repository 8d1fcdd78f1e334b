"""Learning rates for accumulated training: scaling a tuned rate to the effective batch.

Accumulating K micro-batches of B makes each update one step on a batch of K*B, and MindSpore's optimizers
count `global_step` per update, so a learning-rate schedule (a list or a `LearningRateSchedule`) advances
once per window, never per micro-batch. What changes is the batch the rate was tuned for.
"""
from __future__ import annotations

import math

from ._validation import check_positive_float, check_positive_int, check_value_in

RULES = ("linear", "sqrt")


def scale_lr(lr: float, accumulate_step: int, rule: str = "linear") -> float:
    r"""
    Scales a learning rate tuned for one micro-batch to a window of `accumulate_step` micro-batches.

    ``"linear"`` (Goyal et al., 2017, for SGD and Momentum) multiplies by K; ``"sqrt"`` (often used with
    Adam) multiplies by :math:`\sqrt{K}`. With K=1 the rate is unchanged.

    Args:
        lr (float): The rate tuned for batch B.
        accumulate_step (int): K.
        rule (str): ``"linear"`` or ``"sqrt"``. Default: ``"linear"``.

    Returns:
        float, the rate for batch K*B.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `lr` or `accumulate_step` is not positive, or `rule` is unknown.

    Examples:
        >>> from ms_accum.lr import scale_lr
        >>> scale_lr(0.01, 4)
        0.04
        >>> scale_lr(0.001, 4, "sqrt")
        0.002
    """
    lr = check_positive_float(lr, "lr", "scale_lr")
    accumulate_step = check_positive_int(accumulate_step, "accumulate_step", "scale_lr")
    rule = check_value_in(rule, "rule", RULES, "scale_lr")
    return lr * (accumulate_step if rule == "linear" else math.sqrt(accumulate_step))

"""Learning rates for accumulated training: scaling a tuned rate to the effective batch, and schedules that follow
the samples consumed.

Accumulating K micro-batches of B makes each update one step on a batch of K*B, and MindSpore's optimizers
count `global_step` per update, so a learning-rate schedule (a list or a `LearningRateSchedule`) advances
once per window, never per micro-batch. What changes is the batch the rate was tuned for. When K changes during
training (`ms_accum.train.schedule`), a step no longer holds a fixed number of samples: `SamplesLR` drives a schedule by
the samples consumed instead (docs/schedules.md).
"""
from __future__ import annotations

import math
from typing import Callable, Union

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from .._mindspore import LearningRateSchedule
from .._validation import ArgumentTypeError, ArgumentValueError, check_positive_float, check_positive_int, \
    check_value_in, door, wrong_type

RULES = ("linear", "sqrt")


@door("scale_lr")
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
        >>> from ms_accum.train.lr import scale_lr
        >>> scale_lr(0.01, 4)
        0.04
        >>> scale_lr(0.001, 4, "sqrt")
        0.002
    """
    lr = check_positive_float(lr, "lr")
    accumulate_step = check_positive_int(accumulate_step, "accumulate_step")
    rule = check_value_in(rule, "rule", RULES)
    return lr * (accumulate_step if rule == "linear" else math.sqrt(accumulate_step))


class SamplesLR(LearningRateSchedule):
    r"""
    A learning rate driven by the global samples consumed instead of the optimizer step.

    Give it to the optimizer as its `learning_rate`; `GradientAccumulation` calls `update` when each window opens, with
    the samples consumed before it (with the `Accumulator` or your own loop, call it yourself). The optimizer's graph
    reads the value from a Parameter, so nothing recompiles. A warm-up of N samples then lasts N samples whatever K is:
    MindSpore's own schedules count optimizer steps, which hold fewer samples early in a batch ramp-up.

    Args:
        schedule (Union[LearningRateSchedule, Callable[[int], float]]): The rate as a function of the samples consumed:
            one of MindSpore's schedules (e.g. ``nn.WarmUpLR(0.1, warmup_steps=N)``, its "steps" read as samples), or
            a plain callable.

    Inputs:
        - **global_step** (Tensor) - The optimizer's step, ignored.

    Outputs:
        Tensor, the rate for the samples last given to `update`, float32.

    Raises:
        TypeError: If `schedule` is neither a `LearningRateSchedule` nor callable, or is a class (not an instance).
        ValueError: If the schedule gives a rate that is not a finite number, naming the sample count.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import SamplesLR
        >>> lr = SamplesLR(nn.WarmUpLR(0.1, 4096))        # warm up over the first 4096 samples
        >>> # optimizer = nn.Momentum(net.trainable_params(), lr, 0.9)
    """

    @door("SamplesLR")
    def __init__(self, schedule: Union[LearningRateSchedule, Callable[[int], float]]) -> None:
        super().__init__()
        if isinstance(schedule, type):  # callable, but calling it would build one, with the samples as its argument
            made = ("an instance of it, e.g. " + f"{schedule.__name__}(...)"
                    if issubclass(schedule, LearningRateSchedule) else "an instance or a function")
            raise ArgumentTypeError("{@schedule:subject} must be a LearningRateSchedule or a callable lr(samples), but "
                                    "got the class {module}.{qualname}: give {made}.", module=schedule.__module__,
                                    qualname=schedule.__qualname__, made=made)
        if not callable(schedule):
            raise wrong_type(schedule, "schedule", "a LearningRateSchedule or a callable lr(samples)")
        self.schedule = schedule
        self._of_tensor = isinstance(schedule, LearningRateSchedule)
        self.samples = 0
        self.lr = Parameter(Tensor(self._evaluate(0), ms.float32), name="samples_lr", requires_grad=False)

    def update(self, samples: int, scale: float = 1.0) -> float:
        """Sets the rate for `samples` samples consumed, times `scale` (`AdaptiveK`'s rule); returns it."""
        value = self._evaluate(samples) * scale
        self.samples = samples
        ops.assign(self.lr, Tensor(value, ms.float32))  # in place: PyNative ignores set_data (docs/mindspore.md)
        return value

    def _evaluate(self, samples: int) -> float:
        value = self.schedule(Tensor(samples, ms.int32)) if self._of_tensor else self.schedule(samples)
        value = float(value.asnumpy()) if isinstance(value, Tensor) else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            # Found when built and whenever the rate is updated (by the executor's train_process too): either way
            # SamplesLR's own argument is at fault, so its name is fixed.
            raise ArgumentValueError("the schedule must give a finite learning rate, but at {samples} samples it gave "
                                     "{value!r}.", samples=samples, value=value).named("SamplesLR")
        return float(value)

    def construct(self, global_step):
        return self.lr


class RunRate:
    """
    The optimizer's learning rate as a run sets it when each window opens: a `SamplesLR` at the samples consumed, and
    a factor (`AdaptiveK`'s `lr_rule`) on it or on a rate held in a Parameter, the base being what the optimizer holds
    when the run starts; leaving the ``with`` block the run trains in puts that back, so the next run starts from it.
    The rate's value is assigned as MindSpore's own `LearningRateScheduler` callback assigns it (`ops.assign`: in
    place, as PyNative's compiled optimizer reads it; docs/mindspore.md); the optimizer is not otherwise changed.

    Args:
        optimizer (nn.Optimizer): The user's.
        scaled (bool): Whether a factor is applied.

    Raises:
        ValueError: If `scaled` and the rate is neither a number (one, or one per group) nor a `SamplesLR`.
    """

    def __init__(self, optimizer: nn.Optimizer, scaled: bool) -> None:
        rate = getattr(optimizer, "learning_rate", None)
        self.samples_lr = rate if isinstance(rate, SamplesLR) else None
        held = [rate] if isinstance(rate, Parameter) else list(rate) if isinstance(rate, ParameterTuple) else None
        if scaled and self.samples_lr is None and held is None:
            raise ArgumentValueError("{@mini_steps:subject} scales the learning rate with the batch, which needs the "
                                     "optimizer's rate to be a number (or one per group) or a SamplesLR, but it is "
                                     "{kind}: wrap a schedule as SamplesLR(schedule), which runs on samples, or give "
                                     "lr_rule='none'.", kind=type(rate).__name__)
        self.held = [(param, param.asnumpy().copy()) for param in held] if scaled and held else []

    def set(self, samples: int, scale: float) -> None:
        """The rate for the window that opens after `samples` samples consumed, times `scale`."""
        if self.samples_lr is not None:
            self.samples_lr.update(samples, scale)
        for param, base in self.held:
            ops.assign(param, Tensor(base * scale, param.dtype))

    def __enter__(self) -> "RunRate":
        return self

    def __exit__(self, *exc) -> None:
        """The rates held in Parameters back to their values when the run started."""
        for param, base in self.held:
            ops.assign(param, Tensor(base, param.dtype))

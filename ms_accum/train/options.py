"""The executor's options, one small frozen object per concern, each checked where the user builds it.

`GradientAccumulation` takes `WindowOptions` (how a window becomes one update), `GuardOptions` (what a non-finite
window does) and `StatisticsOptions` (gradient norms, noise scale, outliers); `train_process` takes `Checkpoints`
(saving and resuming) and `LogOptions` (what it says). The keywords they replace are still accepted until 2.0.0,
with a `DeprecationWarning` (`ms_accum.deprecation.EXECUTOR_KEYWORDS`).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Union

from .._choices import CHECKPOINT_FORMATS, OUTLIER_WARMUP, POLICIES, REDUCTIONS
from .._validation import (Argument, ArgumentTypeError, ArgumentValueError, check_callable, check_isinstance,
                           check_positive_float, check_positive_int, check_value_in, door, wrong_type)
from ..deprecation import EXECUTOR_KEYWORDS, deprecated, executor_key


@dataclass(frozen=True)
class WindowOptions:
    r"""
    How a window of micro-batches becomes one update.

    Args:
        reduction (str, optional): How the window combines its micro-batches (`AccumulationBuffer`): ``"mean"``
            (sample-weighted), ``"sum"``, or ``"weighted_mean"`` (`loss_fn` returns ``(loss, weight)``, e.g.
            `TokenCrossEntropy`). Default: ``None``, what `loss_fn` says it computes: ``"sum"`` for a MindSpore loss
            built with ``reduction="sum"``, else ``"mean"``.
        clip_norm (float, optional): Clip each window's gradient to this global norm. Default: ``None``.
        buffer_dtype (mindspore.dtype, optional): The accumulation buffer's dtype. Default: ``None``, float32 for
            float16 and bfloat16 parameters, else theirs.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `reduction` is unknown or `clip_norm` is not positive.
    """

    reduction: Optional[str] = None
    clip_norm: Optional[float] = None
    buffer_dtype: Any = None

    @door("WindowOptions")
    def __post_init__(self) -> None:
        from ..core.buffer import check_buffer_dtype  # MindSpore loads with the executor, not with the options
        if self.reduction is not None:
            check_value_in(self.reduction, "reduction", REDUCTIONS)
        object.__setattr__(self, "clip_norm", check_positive_float(self.clip_norm, "clip_norm", allow_none=True))
        check_buffer_dtype(self.buffer_dtype, "buffer_dtype")


@dataclass(frozen=True)
class GuardOptions:
    r"""
    What a window whose gradient or loss is not finite does: it is never applied (`ms_accum.core.guard`).

    Args:
        policy (str): ``"skip_window"`` (default) skips the whole window; ``"skip_microbatch"`` leaves out the bad
            micro-batches and takes the mean over the rest. Skips are counted, and warned about without a loss scaler.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler (mixed
            precision): the backward passes are scaled, each window is unscaled and checked once, and a dynamic scale
            is adjusted once per window. Overflowing windows are skipped and logged. Default: ``None``.
        stop_on_nonfinite (bool): Raise `NonFiniteError` at the first skipped window instead of going on.
            Default: ``False``.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `policy` is unknown.
    """

    policy: str = "skip_window"
    loss_scaler: Any = None
    stop_on_nonfinite: bool = False

    @door("GuardOptions")
    def __post_init__(self) -> None:
        check_value_in(self.policy, "policy", POLICIES)
        check_isinstance(self.stop_on_nonfinite, "stop_on_nonfinite", bool)


@dataclass(frozen=True)
class StatisticsOptions:
    r"""
    Gradient statistics measured in the graph (`ms_accum.core.statistics`, docs/statistics.md).

    Args:
        norms (bool): Measure each micro-batch's and each window's gradient norm, in `StepRecord.grad_norm` and
            `StepRecord.micro_batch_grad_norms`. Default: ``False``; on whenever `noise_scale` or `skip_outliers` is
            set.
        noise_scale (bool): Estimate the gradient noise scale B_simple (`NoiseScale`), in `StepRecord.noise_scale`.
            Default: ``False``.
        skip_outliers (float, optional): Leave out of its window a micro-batch whose loss or gradient norm lies beyond
            this many standard deviations of recent micro-batches (`OutlierFilter`). Default: ``None``.
        outlier_warmup (int): Micro-batches taken into the running statistics before any is judged (at least 8).
            Default: ``100``.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `skip_outliers` is not positive or `outlier_warmup` is below 8.
    """

    norms: bool = False
    noise_scale: bool = False
    skip_outliers: Optional[float] = None
    outlier_warmup: int = OUTLIER_WARMUP

    @door("StatisticsOptions")
    def __post_init__(self) -> None:
        from ..core.statistics import check_outliers
        check_isinstance(self.norms, "norms", bool)
        check_isinstance(self.noise_scale, "noise_scale", bool)
        check_outliers(self.skip_outliers, self.outlier_warmup)

    @property
    def measured(self) -> bool:
        """Whether the gradient norms are measured: asked for, or needed by the noise scale or the outliers."""
        return self.norms or self.noise_scale or self.skip_outliers is not None


@dataclass(frozen=True)
class Checkpoints:
    r"""
    Where `train_process` saves, how often, and what it resumes from.

    With `save_every`, the whole training state (parameters, optimizer state, the accumulation buffer and counters,
    the position in the data) is saved every `save_every` optimizer steps to ``{directory}/{name}-{step:09d}.ckpt``
    (``.safetensors`` with ``format="safetensors"``); a run killed at any point and resumed ends bit-identical to the
    uninterrupted one (docs/resume.md).

    Args:
        directory (str): Where checkpoints are saved. Default: ``"ckpt"``.
        name (str): File name of the final checkpoint (the network only), without its extension; also the prefix of
            the training-state files. Default: ``"gradient_accumulation"``.
        save_every (int, optional): Save the training state every this many optimizer steps. Default: ``None``, only
            the final checkpoint.
        keep_last (int, optional): Keep only the newest `keep_last` training-state files; ``None`` keeps them all. A
            state file holds the parameters, the optimizer's state and the buffer: about 4x the parameters with
            Adam or AdamW, 3x with Momentum. Default: ``2``, the newest and the one before it, so a long run cannot
            fill a disk unnoticed.
        metadata (dict, optional): Extra values stored in the checkpoints (ints, floats, strings).
        resume (Union[bool, str], optional): ``True`` resumes from the newest readable training-state file in
            `directory` (and starts afresh if there is none); a path resumes from that file. Default: ``None``.
        format (str): The files' format: ``"ckpt"``, MindSpore's own, or ``"safetensors"``, which MindFormers 2 and
            Hugging Face tools read too. Resuming reads either, whatever `format` says. Default: ``"ckpt"``.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `save_every` or `keep_last` is not positive, or `format` is unknown.
    """

    directory: Union[str, "os.PathLike"] = "ckpt"
    name: str = "gradient_accumulation"
    save_every: Optional[int] = None
    keep_last: Optional[int] = 2
    metadata: Optional[dict] = None
    resume: Union[bool, str, "os.PathLike", None] = None
    format: str = "ckpt"

    @door("Checkpoints")
    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not str(self.directory):
            raise wrong_type(self.directory, "directory", "a directory path")
        check_isinstance(self.name, "name", str)
        for arg_name in ("save_every", "keep_last"):
            if getattr(self, arg_name) is not None:
                check_positive_int(getattr(self, arg_name), arg_name)
        if self.metadata is not None:
            check_isinstance(self.metadata, "metadata", dict)
        if self.resume is not None:
            check_isinstance(self.resume, "resume", (bool, str, os.PathLike))
        check_value_in(self.format, "format", CHECKPOINT_FORMATS)


@dataclass(frozen=True)
class LogOptions:
    r"""
    What `train_process` says about each window.

    Args:
        every (int): Print every this many optimizer steps when `verbose`. Default: ``1``.
        verbose (bool): Print ``epoch: E step: S loss is L`` lines, L the window's loss over all ranks (rank 0 alone
            prints in data parallel). Default: ``True``.
        on_step (Callable, optional): Called with each `StepRecord` (progress bars, custom logging).

    Raises:
        TypeError: If `on_step` cannot be called or `verbose` is not a bool.
        ValueError: If `every` is not positive.
    """

    every: int = 1
    verbose: bool = True
    on_step: Optional[Callable] = None

    @door("LogOptions")
    def __post_init__(self) -> None:
        check_positive_int(self.every, "log_every")
        if self.on_step is not None:
            check_callable(self.on_step, "on_step")


QUIET = LogOptions(verbose=False)  # no log lines, no callback: what tests and benchmarks mostly want

_CLASSES = {"window": WindowOptions, "guard": GuardOptions, "statistics": StatisticsOptions,
            "checkpoints": Checkpoints, "log": LogOptions}


def with_deprecated(given: Dict[str, Any], keywords: Dict[str, Any], allowed: Sequence[str]) -> Dict[str, Any]:
    """The options objects `given` (option name -> object or None), with the deprecated `keywords` moved into them.

    A keyword that names no option of `allowed` is a TypeError, as Python's own for an unexpected keyword. The
    ``ckpt_dir=None`` of 0.3 means no checkpoints: `checkpoints` becomes None."""
    moved: Dict[str, Dict[str, Any]] = {option: {} for option in allowed}
    for keyword, value in keywords.items():
        option, field = EXECUTOR_KEYWORDS.get(keyword, (None, None))
        if option not in moved:
            raise ArgumentTypeError("got an unexpected keyword argument {keyword}.", keyword=Argument(keyword))
        deprecated(executor_key(keyword), stacklevel=4)  # this, the caller, its door, the user
        moved[option][field] = value
    result = {}
    for option in allowed:
        current = given.get(option, _CLASSES[option]())
        fields = moved[option]
        if option == "checkpoints" and fields.get("directory", "") is None:
            if any(fields.get(name) not in (None, False) for name in ("save_every", "resume")):
                needs = "save_every" if fields.get("save_every") is not None else "resume"
                raise ArgumentValueError("{needs:subject} needs {@ckpt_dir}, but {@ckpt_dir} is None.",
                                         needs=Argument(needs))
            result[option] = None
            continue
        if fields:
            current = dataclasses.replace(current if current is not None else _CLASSES[option](), **fields)
        result[option] = current
    return result

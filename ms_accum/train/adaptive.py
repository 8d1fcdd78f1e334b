"""K chosen in closed loop: the global batch follows the measured gradient noise scale (docs/adaptive-k.md).

The critical batch B_simple (`ms_accum.core.statistics.NoiseScale`) is small at the start of training and grows; a
global batch well below it wastes optimizer steps, one well above it wastes samples. `AdaptiveK` is passed where a
schedule goes (``train_process(mini_steps=AdaptiveK(2, 32))``): each window's K is decided when the window opens, as a
schedule's is, from the run's smoothed estimate, so that K x the global micro-batch tracks `fraction` x B_simple
within ``[k_min, k_max]``. `Controller` is one run's state of it, its `KPolicy` (`ms_accum.train.kpolicy`), saved with
every training-state file, so a resumed run decides as the uninterrupted one.
"""
from __future__ import annotations

import json
import math
from typing import Dict, Optional, Sequence, Tuple

from .._choices import LR_RULES
from .._validation import (ArgumentTypeError, ArgumentValueError, Term, check_positive_float, check_positive_int,
                           check_value_in, door)
from ..core.statistics import NoiseScale
from .kpolicy import Described, KPolicy
from .schedule import pairs_text

MIN_WINDOWS = 32  # default `min_samples`: this many windows of k_min, to average before the first decision
EVERY_WINDOWS = 8  # default `every`: this many windows of k_min between decisions
# `AdaptiveK`'s settings after its two bounds, in its signature's order.
OPTIONS = ("fraction", "lr_rule", "min_samples", "every", "threshold", "max_change", "beta")


class AdaptiveK:
    r"""
    K decided from the gradient noise scale: each window's global batch K·B·ranks tracks `fraction` x the smoothed
    estimate of B_simple, within ``[k_min, k_max]``. Pass it as `train_process`'s `mini_steps`; the executor must
    measure the gradient norms (``StatisticsOptions(noise_scale=True)``).

    Trustworthy on a noisy estimate: the estimate is a bias-corrected moving average (decay `beta` per window) of the
    noise scale's two terms; K starts at `k_min` and no decision is taken before `min_samples` global samples are
    consumed; decisions then come at a fixed cadence, every `every` samples, when a window opens; K moves only when the
    target lies at least `threshold` away from it (up when target >= K·(1 + threshold), to the target's floor; down
    when target <= K / (1 + threshold), to its ceiling), so it does not oscillate around a boundary; with `max_change`,
    by at most that factor in one decision.

    The learning rate follows the batch by `lr_rule`, the optimizer's rate being the one tuned for `k_min`'s batch
    (a number, or `SamplesLR`, whose schedule keeps running on samples): ``"none"`` leaves it; ``"linear"`` multiplies
    it by S = K / k_min (SGD and Momentum below the critical batch, Goyal et al. 2017); ``"sqrt"`` by √S (Adam, Malladi
    et al. 2022); ``"adascale"`` by AdaScale's gain r = (1 + B_simple/B0) / (1 + B_simple/(S·B0)), B0 being k_min's
    global batch: about S while the batch is well below B_simple, about 1 well above it (Johnson et al. 2020, its
    gain alone: the schedule is not stretched).

    Args:
        k_min (int): The smallest K, and the first.
        k_max (int): The largest K (the fused structure builds its graph for it).
        fraction (float): The global batch aimed at, as a fraction of B_simple. Default: ``1.0``.
        lr_rule (str): ``"none"``, ``"linear"``, ``"sqrt"`` or ``"adascale"``. Default: ``"none"``.
        min_samples (int, optional): Global samples consumed before the first decision. Default: ``None``, 32 windows
            of `k_min`.
        every (int, optional): Global samples between decisions. Default: ``None``, 8 windows of `k_min`.
        threshold (float): How far (relative) the target must lie from K to move it. Default: ``0.2``.
        max_change (float, optional): The most K is multiplied or divided by in one decision, above 1. Default:
            ``None``, as far as the target.
        beta (float): Decay of the estimate's moving averages per window, in (0, 1). Default: ``0.99``.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If a bound is not positive or `k_min` > `k_max`, `fraction` is not positive, `lr_rule` is unknown,
            `min_samples` is negative, `every` not positive, `threshold` negative, `max_change` not above 1 or `beta`
            outside (0, 1).

    Examples:
        >>> from ms_accum import AdaptiveK
        >>> AdaptiveK(2, 32, fraction=0.5, lr_rule="sqrt")
        AdaptiveK(2, 32, fraction=0.5, lr_rule='sqrt', min_samples=None, every=None, threshold=0.2, max_change=None, \
beta=0.99)
        >>> # executor.train_process(3, dataset, mini_steps=AdaptiveK(2, 32))
    """

    @door("AdaptiveK")
    def __init__(self, k_min: int, k_max: int, fraction: float = 1.0, lr_rule: str = "none", *,
                 min_samples: Optional[int] = None, every: Optional[int] = None, threshold: float = 0.2,
                 max_change: Optional[float] = None, beta: float = 0.99) -> None:
        self.k_min = check_positive_int(k_min, "k_min")
        self.k_max = check_positive_int(k_max, "k_max")
        if k_max < k_min:
            raise ArgumentValueError("{@k_max:subject} must be at least {@k_min} ({k_min}), but got {k_max}.",
                                     k_min=k_min, k_max=k_max)
        self.fraction = check_positive_float(fraction, "fraction")
        self.lr_rule = check_value_in(lr_rule, "lr_rule", LR_RULES)
        self.min_samples = None if min_samples is None else check_positive_int(min_samples, "min_samples", minimum=0)
        self.every = None if every is None else check_positive_int(every, "every")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ArgumentTypeError("{@threshold:subject} must be a non-negative float, but got {value!r}.",
                                    value=threshold)
        if not (math.isfinite(threshold) and threshold >= 0):
            raise ArgumentValueError("{@threshold:subject} must be a non-negative float, but got {value}.",
                                     value=threshold)
        self.threshold = float(threshold)
        if max_change is not None and check_positive_float(max_change, "max_change") <= 1:
            raise ArgumentValueError("{@max_change:subject} must be a float above 1, but got {value}.",
                                     value=max_change)
        self.max_change = None if max_change is None else float(max_change)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)):
            raise ArgumentTypeError("{@beta:subject} must be a float in (0, 1), but got {value!r}.", value=beta)
        if not 0 < beta < 1:
            raise ArgumentValueError("{@beta:subject} must be a float in (0, 1), but got {value}.", value=beta)
        self.beta = float(beta)

    @property
    def scales_lr(self) -> bool:
        """Whether the learning rate follows K (`KPolicy.scales_lr`): `lr_rule` is not ``"none"``."""
        return self.lr_rule != "none"

    def for_run(self, per_batch: int) -> "Controller":
        """A run's policy of these settings (`KPolicy.for_run`), over global micro-batches of `per_batch` samples, with
        its own noise-scale estimate."""
        return Controller(self, per_batch, NoiseScale(self.beta))

    def settings(self, per_batch: int) -> str:
        """The settings a training state records, as JSON, for a run over global micro-batches of `per_batch` samples;
        a resumed run must give the same (`ms_accum.train.resume`)."""
        return json.dumps({**self._arguments(), "global_micro_batch": per_batch})

    def _arguments(self) -> dict:
        return {"k_min": self.k_min, "k_max": self.k_max, **{name: getattr(self, name) for name in OPTIONS}}

    def __repr__(self) -> str:
        return _call(self._arguments())


def _call(settings: dict) -> str:
    """The call that builds an `AdaptiveK` of `settings` (its arguments by name): its repr, and how messages say it."""
    given = ", ".join(f"{name}={settings[name]!r}" for name in OPTIONS)
    return f"AdaptiveK({settings['k_min']}, {settings['k_max']}, {given})"


class AdaptiveSettings(Term):
    """An `AdaptiveK`'s settings as a training state records them (`AdaptiveK.settings`), inside a message."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings

    def __str__(self) -> str:
        return f"{_call(self.settings)} over global micro-batches of {self.settings['global_micro_batch']} samples"


class Controller(KPolicy):
    """
    One run's `AdaptiveK`, its `KPolicy`: K for each window that opens (`open_window`), the learning-rate factor for
    it, and what it has seen, saved with the training state. Looking ahead (`peek`) knows K up to the next decision
    point, and nothing beyond: what it decides there depends on the windows still to come.

    Args:
        adaptive (AdaptiveK): The settings.
        per_batch (int): Global samples in one micro-batch of every rank.
        noise (NoiseScale): The run's estimate, which the run updates after each window.

    Attributes:
        k (int): The K decided last (`k_min` before any decision).
        next_decision (int): The samples consumed from which the next decision is taken.
        decisions (int): Decisions taken so far (each may keep K).
        weight (float): The moving average of a global micro-batch's weight (samples, or tokens under
            ``"weighted_mean"``: the noise scale's unit), not yet bias-corrected; `windows` taken into it.
    """

    def __init__(self, adaptive: AdaptiveK, per_batch: int, noise: NoiseScale) -> None:
        self.adaptive, self.per_batch, self.noise = adaptive, per_batch, noise
        self.min_samples = (MIN_WINDOWS * adaptive.k_min * per_batch if adaptive.min_samples is None
                            else adaptive.min_samples)
        self.every = EVERY_WINDOWS * adaptive.k_min * per_batch if adaptive.every is None else adaptive.every
        self.load({})  # a fresh start

    @property
    def k_max(self) -> int:
        """The largest K it may decide (`KPolicy.k_max`)."""
        return self.adaptive.k_max

    @property
    def scales_lr(self) -> bool:
        """Whether the learning rate follows K (`KPolicy.scales_lr`)."""
        return self.adaptive.scales_lr

    def peek(self, samples: int) -> Optional[int]:
        """K of the window that opens after `samples` global samples consumed, if no decision is due before: the K
        decided last; None from the next decision point on. Changes nothing."""
        return self.k if samples < self.next_decision else None

    def open_window(self, samples: int) -> int:
        """K for the window that opens now, after `samples` global samples consumed: decided anew when a decision is
        due."""
        if samples >= self.next_decision:
            self.k = self.target_k()
            self.decisions += 1
            # The cadence is fixed in samples: the next decision point after this one, whatever the windows' sizes.
            self.next_decision += self.every * ((samples - self.next_decision) // self.every + 1)
        return self.k

    def target_k(self) -> int:
        """K for the smoothed estimate, moved from the current K only beyond the threshold; the current K while there
        is no estimate (early on, or |G|² not positive)."""
        aim = self.aim()
        if aim is None:
            return self.k
        a = self.adaptive
        change = a.max_change or math.inf  # None: as far as the target in one decision
        if aim >= self.k * (1.0 + a.threshold):
            return min(a.k_max, max(self.k, math.floor(min(aim, self.k * change))))
        if aim <= self.k / (1.0 + a.threshold):
            return max(a.k_min, min(self.k, math.ceil(max(aim, self.k / change))))
        return self.k

    def aim(self) -> Optional[float]:
        """The K, not rounded, whose global batch is `fraction` x the estimate; None without an estimate."""
        estimate, micro = self.noise.value, self.micro_weight
        if estimate is None or micro is None:
            return None
        return self.adaptive.fraction * estimate / micro

    @property
    def micro_weight(self) -> Optional[float]:
        """The bias-corrected average weight of a global micro-batch; None before any window."""
        if self.windows == 0:
            return None
        return self.weight / (1.0 - self.adaptive.beta ** self.windows)

    def observe(self, window_weight: float, micro_batches: int) -> None:
        """Takes a window into the averages: its total weight over all ranks, `micro_batches` per rank."""
        beta = self.adaptive.beta
        self.weight = beta * self.weight + (1.0 - beta) * window_weight / micro_batches
        self.windows += 1

    def lr_scale(self, k: int) -> float:
        """The factor on the learning rate for a window of `k` (`AdaptiveK`'s `lr_rule`)."""
        micro = self.micro_weight
        return lr_factor(self.adaptive.lr_rule, k / self.adaptive.k_min, self.noise.value,
                         None if micro is None else self.adaptive.k_min * micro)

    def describe(self, per_batch: int, opened: Optional[Sequence[Tuple[int, int]]] = None) -> Described:
        """What a checkpoint records of it (`KPolicy.describe`): K changes; its global batches, decided as the run
        goes, are ``"adaptive"`` before it and where they changed after it; its settings."""
        return {"accumulate_step": 0, "global_batches": "adaptive" if opened is None else pairs_text(opened),
                "adaptive_k": self.adaptive.settings(per_batch)}

    def state(self) -> Dict[str, float]:
        """What a training state saves, to resume the decisions exactly."""
        return {"controller_k": self.k, "controller_next": self.next_decision, "controller_decisions": self.decisions,
                "controller_weight": self.weight, "controller_windows": self.windows}

    def load(self, state: dict) -> None:
        """Restores what `state` saved (keys missing: a fresh start)."""
        self.k = int(state.get("controller_k", self.adaptive.k_min))
        self.next_decision = int(state.get("controller_next", self.min_samples))
        self.decisions = int(state.get("controller_decisions", 0))
        self.weight = float(state.get("controller_weight", 0.0))
        self.windows = int(state.get("controller_windows", 0))


def lr_factor(rule: str, scale: float, noise_scale: Optional[float], b0: Optional[float]) -> float:
    """The factor `rule` (`AdaptiveK`'s `lr_rule`) puts on the rate tuned for k_min, for a window of `scale` =
    K / k_min; ``"adascale"`` reads the noise scale and k_min's global batch `b0`, in one unit (None: no estimate yet,
    or |G|² not positive: noise dominates, and the gain is its limit, S)."""
    if rule == "none" or scale == 1.0:
        return 1.0
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if noise_scale is None or b0 is None:
        return scale
    ratio = noise_scale / b0  # B_simple / B0
    return (1.0 + ratio) / (1.0 + ratio / scale)


def check_adaptive(adaptive: AdaptiveK, structure: str, reduction: str, measured: bool, ranks: int) -> None:
    """Refuses, before anything compiles, a run where `adaptive` cannot measure what it decides from: the executor's
    `structure` and `reduction`, whether it `measured` the gradient norms, over `ranks` ranks."""
    if structure == "cached":
        raise ArgumentValueError("{@mini_steps:subject} must be a fixed K or a schedule with {structure=}: AdaptiveK "
                                 "decides from the gradient noise scale, and gradient caching measures no "
                                 "micro-batch's gradient on its own, but got {adaptive!r}.", structure="cached",
                                 adaptive=adaptive)
    if reduction == "sum":
        raise ArgumentValueError("{@mini_steps:subject} must be a fixed K or a schedule with a summing loss "
                                 "(reduction 'sum'): AdaptiveK decides from the gradient noise scale, which compares "
                                 "mean gradients, but got {adaptive!r}.", adaptive=adaptive)
    if not measured:
        raise ArgumentValueError("{@mini_steps:subject} is {adaptive!r}, which decides from the gradient noise scale, "
                                 "but the executor measures no gradient norm: build it with "
                                 "statistics=StatisticsOptions(noise_scale=True).", adaptive=adaptive)
    if ranks == 1 and adaptive.k_min < 2:
        raise ArgumentValueError("{@k_min:subject} must be at least 2 on one rank, but got {value}: the noise scale "
                                 "compares the micro-batch's gradient with the window's, and a window of one "
                                 "micro-batch has one batch size, so K would never move.", value=adaptive.k_min)

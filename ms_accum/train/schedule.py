"""The global batch as a schedule: K as a function of the samples consumed.

Large-model recipes grow the global batch during training (GPT-3's ramp-up, Megatron-LM's ``--rampup-batch-size``).
With a fixed micro-batch that is a schedule of K. As in Megatron-LM, K is derived from the samples consumed (global,
all ranks) when each window opens, never from a count of optimizer steps, so a resumed run recomputes it exactly and a
run on another number of ranks keeps the global batch.

Samples consumed are the batches read so far (all epochs, all ranks) times the global micro-batch: batches of a
dropped partial window count, and a dataset's smaller last batch counts as a full one, so the count is the same for
every rank and every resume.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .._validation import Argument, ArgumentTypeError, ArgumentValueError, check_positive_int, door
from ..deprecation import deprecated
from .kpolicy import Described, KPolicy

ScheduleLike = Union[int, Dict[int, int], Callable[[int], int]]


class AccumulationSchedule(KPolicy):
    """
    K as a function of the global samples consumed: a constant, a ``{samples: K}`` dict or a callable. A pure one, as
    the run looks ahead with it (`KPolicy`): a callable is evaluated at every window's opening before anything trains,
    again when each opens, and where a resume compares it; each time it must give the same K.

    Args:
        schedule (Union[int, dict, Callable]): A fixed K; a dict whose keys, the samples consumed from which each K
            holds, start at 0 and increase; or ``K(samples_consumed)``, checked when first evaluated at each value.
        arg_name (str): The argument that gave it. Default: ``"mini_steps"``.

    Attributes:
        table (list[tuple[int, int]], optional): ``(samples consumed, K)`` from each threshold on, sorted; None for a
            callable.

    Raises:
        TypeError: If `schedule` is none of these, or a key or K is not an int.
        ValueError: If the thresholds do not start at 0 or do not increase, or a K is not positive.

    Examples:
        >>> from ms_accum import AccumulationSchedule
        >>> k = AccumulationSchedule({0: 2, 4096: 4, 16384: 8})
        >>> k.peek(0), k.peek(4095), k.peek(4096)
        (2, 2, 4)
    """

    @door("AccumulationSchedule")
    def __init__(self, schedule: ScheduleLike, arg_name: str = "mini_steps") -> None:
        self.arg_name, self.table, self._function = arg_name, None, None
        if isinstance(schedule, dict):
            self.table = _check_table(schedule, arg_name)
        elif callable(schedule) and not isinstance(schedule, type):
            self._function = schedule
        else:
            self.table = [(0, check_positive_int(schedule, arg_name))]

    @property
    def fixed(self) -> Union[int, None]:
        """K when it never changes, else None."""
        return self.table[0][1] if self.table is not None and len(self.table) == 1 else None

    @door("AccumulationSchedule")
    def peek(self, samples: int) -> int:
        """K for the window that opens after `samples` samples consumed.

        Raises:
            TypeError, ValueError: If a callable schedule returns other than a positive int.
        """
        if self._function is not None:
            value = self._function(samples)
            return check_positive_int(value, f"{self.arg_name}({samples})")
        return next(k for start, k in reversed(self.table) if samples >= start)

    def open_window(self, samples: int) -> int:
        """K for the window that opens now, after `samples` samples consumed: what `peek` says."""
        return self.peek(samples)

    def __call__(self, samples: int) -> int:
        """`peek`, deprecated: no K policy is called, as calling a controller would decide."""
        deprecated("ms_accum.AccumulationSchedule.__call__")
        return self.peek(samples)

    def describe(self, per_batch: int, opened: Optional[Sequence[Tuple[int, int]]] = None) -> Described:
        """What a checkpoint records of it (`KPolicy.describe`): its fixed K or 0, its `global_batches`, known ahead
        (`opened` adds nothing)."""
        return {"accumulate_step": self.fixed or 0, "global_batches": self.global_batches(per_batch), "adaptive_k": ""}

    def global_batches(self, per_batch: int) -> str:
        """The table as ``samples:global_batch`` pairs for `per_batch` samples per micro-batch over all ranks, what a
        training state records (a callable's is known only where evaluated: ``"callable"``)."""
        if self.table is None:
            return "callable"
        return pairs_text((start, k * per_batch) for start, k in self.table)

    def __repr__(self) -> str:
        if self.table is None:
            return f"AccumulationSchedule({self._function!r})"
        return "AccumulationSchedule({" + ", ".join(f"{s}: {k}" for s, k in self.table) + "})"


def pairs_text(pairs) -> str:
    """``(samples, value)`` pairs as the command line and the training states write them: ``"0:2,4096:4"``."""
    return ",".join(f"{samples}:{value}" for samples, value in pairs)


@door("parse_schedule")
def parse_schedule(text: str, arg_name: str = "text") -> dict:
    """``"0:2,4096:4,16384:8"`` (samples:K) as a dict, checked as `AccumulationSchedule` checks it. Errors name its
    argument `arg_name` (the command line passes ``"--accumulate-schedule"``).

    Raises:
        ValueError: If `text` is not comma-separated ``samples:K`` pairs of ints, gives a threshold twice, or the pairs
            are not a schedule.
    """
    pairs = {}
    for item in text.split(","):
        start, colon, k = item.strip().partition(":")
        if not colon or not start.strip().isdigit() or not k.strip().lstrip("-").isdigit():
            raise ArgumentValueError("{arg_name:subject} must be comma-separated samples:K pairs such as "
                                     "'0:2,4096:4', but got '{text}'.", arg_name=Argument(arg_name), text=text)
        if int(start) in pairs:
            raise ArgumentValueError("{arg_name:subject} must give each threshold once, but got {value} twice "
                                     "in '{text}'.", arg_name=Argument(arg_name), value=int(start), text=text)
        pairs[int(start)] = int(k)
    _check_table(pairs, arg_name)
    return pairs


@door("rampup")
def rampup(start: int, increment: int, samples_per_increment: int, global_batch: int,
           batch_size: int) -> Dict[int, int]:
    """
    Megatron-LM's batch ramp-up as a schedule of K: the global batch starts at `start` and grows by `increment` every
    `samples_per_increment` samples consumed until it reaches `global_batch`.

    Args:
        start (int): The first global batch.
        increment (int): What the global batch grows by at each step of the ramp.
        samples_per_increment (int): Samples consumed between two steps of the ramp.
        global_batch (int): The global batch after the ramp; ``global_batch - start`` must divide by `increment`.
        batch_size (int): Samples per micro-batch over all ranks (the per-rank micro-batch times the ranks); every
            global batch of the ramp must divide by it.

    Returns:
        dict, ``{samples consumed: K}``, for ``train_process(mini_steps=...)``.

    Raises:
        TypeError: If an argument is not an int.
        ValueError: If an argument is not positive, the ramp does not reach `global_batch` in whole increments, or a
            global batch of the ramp does not divide by `batch_size`.

    Examples:
        >>> from ms_accum import rampup
        >>> rampup(start=32, increment=32, samples_per_increment=1000, global_batch=96, batch_size=16)
        {0: 2, 1000: 4, 2000: 6}
    """
    for arg_name, value in (("start", start), ("increment", increment),
                            ("samples_per_increment", samples_per_increment), ("global_batch", global_batch),
                            ("batch_size", batch_size)):
        check_positive_int(value, arg_name)
    if global_batch < start or (global_batch - start) % increment:
        raise ArgumentValueError("{@global_batch:subject} must be {@start} ({start}) plus a whole number of "
                                 "{@increment} ({increment}), but got {global_batch}.", start=start,
                                 increment=increment, global_batch=global_batch)
    schedule = {}
    for i, batch in enumerate(range(start, global_batch + 1, increment)):
        if batch % batch_size:
            raise ArgumentValueError("every global batch of the ramp must be divisible by {@batch_size} "
                                     "({batch_size}), but {batch} is not.", batch_size=batch_size, batch=batch)
        schedule[i * samples_per_increment] = batch // batch_size
    return schedule


def _check_table(schedule: dict, arg_name: str) -> List[Tuple[int, int]]:
    """`schedule`, a ``{samples: K}`` dict, as its sorted ``(samples, K)`` pairs, checked."""
    table = sorted(schedule.items()) if all(isinstance(key, int) for key in schedule) else None
    if not schedule or table is None or any(isinstance(key, bool) for key in schedule):
        raise ArgumentTypeError("{arg_name:subject} must be a positive int, a dict from samples consumed "
                                "(ints, the first 0) to K, or a callable K(samples), but got {schedule!r}.",
                                arg_name=Argument(arg_name), schedule=schedule)
    if list(schedule) != [start for start, _ in table] or table[0][0] != 0:
        raise ArgumentValueError("the thresholds of {arg_name} must start at 0 and increase, but got {value}.",
                                 arg_name=Argument(arg_name), value=list(schedule))
    for start, k in table:
        check_positive_int(k, f"{arg_name}[{start}]")
    return table

"""Data parallel on MindSpore's own launcher, msrun: joining the cluster, and the host's small collectives.

The window's own reduction is the core's (`ms_accum.core.parallel`): each window is all-reduced once. Here is what a
training run needs around it: `init_data_parallel` joins the cluster under msrun, `distributed_launch` tells whether a
launcher started this process, and the ranks agree on small host numbers (batch counts, resumed steps).
"""
from __future__ import annotations

import functools
import os
from typing import Callable, List, Mapping, Optional, TypeVar

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

from .._mindspore import world_group
from .._validation import ArgumentValueError, StateError, check_isinstance, door
from ..core.parallel import DataParallelInfo

# What msrun exports (measured with MindSpore 2.10 on CPU): to each worker MS_ROLE=MS_WORKER, MS_WORKER_NUM,
# MS_SCHED_HOST/PORT, MS_NODE_ID, RANK_ID, RANK_SIZE, DEVICE_ID. It also runs the same script once more as the
# cluster's scheduler, with MS_ROLE=MS_SCHED: there `init()` serves the cluster and never returns, so a script
# must call it before doing anything else (a scheduler that fails first leaves the workers waiting).
LAUNCHER_ROLES = ("MS_WORKER", "MS_SCHED")
T = TypeVar("T")  # what the check of `decided_together` returns


@door("distributed_launch")
def distributed_launch(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """
    The world size announced by a launcher (`msrun`) to this process, or None when no launcher started it.

    Args:
        environ (Mapping[str, str], optional): The environment to read. Default: ``None``, `os.environ`.

    Returns:
        int, the number of workers (`MS_WORKER_NUM`), or None when the process was not started by `msrun`.

    Raises:
        ValueError: If `MS_WORKER_NUM` is set by something else than a positive int.
    """
    environ = os.environ if environ is None else environ
    if environ.get("MS_ROLE") not in LAUNCHER_ROLES or "MS_WORKER_NUM" not in environ:
        return None
    text = environ["MS_WORKER_NUM"]
    if not text.isdigit() or int(text) <= 0:
        raise ArgumentValueError("the environment variable 'MS_WORKER_NUM' must be a positive int, but got '{text}'.",
                                 text=text)
    return int(text)


@door("init_data_parallel")
def init_data_parallel(gradients_mean: Optional[bool] = None) -> DataParallelInfo:
    """
    Joins the launcher's cluster for data parallelism: `mindspore.communication.init()`.

    Buffers built afterwards all-reduce their windows (`ms_accum.core.parallel.data_parallel_info`); nothing of
    MindSpore's parallel context is needed, which MindSpore 2.11 sunsets (docs/data-parallel.md). Call it first: msrun
    also runs the script as the cluster's scheduler, whose `init()` never returns, so anything before it runs there too.

    Args:
        gradients_mean (bool, optional): ``None`` (default): a ``"sum"`` window is the sum over the global batch, as
            one step on it; a ``"mean"`` window is always the exact mean over the global samples. ``True`` or
            ``False``: also sets MindSpore's context as ms_accum 0.3 did (``parallel_mode=DATA_PARALLEL``, this
            `gradients_mean`; ``True`` divides a ``"sum"`` window by the ranks), for code that relies on it.

    Returns:
        DataParallelInfo, this process's rank and the group size.

    Raises:
        TypeError: If `gradients_mean` is not a bool or None.
        RuntimeError: If no launcher started this process ("distributed mode requested without a launcher").
    """
    if gradients_mean is not None:
        check_isinstance(gradients_mean, "gradients_mean", bool)
    if distributed_launch() is None:
        raise StateError("distributed mode requested without a launcher: start it with msrun in front of its "
                         "command, e.g. 'msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True "
                         "<command>' (the environment variables MS_ROLE and MS_WORKER_NUM are not set).")
    init()
    if gradients_mean is not None:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=gradients_mean)
    return DataParallelInfo(get_rank(), get_group_size())


class _AllReduceSum(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, world_group())

    def construct(self, x):
        return self.all_reduce(x)


@functools.lru_cache(maxsize=None)
def _sum_cell() -> nn.Cell:
    """One Cell, built when first needed, so each shape compiles once."""
    return _AllReduceSum()


def check_same_on_all_ranks(value: int, what: str) -> int:
    """
    Checks that every rank of the data-parallel group passes the same int, with one small all-reduce.

    All ranks must call it together. They all raise, or none does, so no rank is left waiting in a later
    collective for a peer that gave up.

    Args:
        value (int): This rank's value, below 2**24.
        what (str): What the value is, for the message.

    Returns:
        int, `value`.

    Raises:
        ValueError: If the ranks' values differ.
    """
    values = gather_ints(value)
    if len(set(values)) > 1:
        raise ArgumentValueError("{what} must be the same on every rank, but got {values} on ranks 0 to {value}.",
                                 what=what, values=values, value=len(values) - 1)
    return value


def decided_together(check: Callable[[], T], parallel: Optional[DataParallelInfo], what: str) -> T:
    """
    Runs `check`, which decides whether the run may start, on every rank, and lets the ranks share their verdicts
    (one small all-reduce) before any of them waits in a collective: all raise, or none does. A rank whose check
    raised anything (a refusal, or an error no one foresaw: a file that cannot be read) raises its own error, so every
    worker's log says why; one whose check passed while another's raised (a path that differs between nodes) raises
    an error naming the ranks that refused. Stand-alone, `check` alone runs.

    Args:
        check (Callable[[], T]): Raises to refuse the run (a `MessageError` for an argument or a checkpoint).
        parallel (DataParallelInfo, optional): This rank and the group's size; None stand-alone.
        what (str): What `check` checks, for the message of the ranks that did not refuse.

    Returns:
        T, what `check` returned.

    Raises:
        Exception: This rank's own, or a ValueError naming the ranks that refused.
    """
    if parallel is None:
        return check()
    try:
        result, refused = check(), None
    except Exception as err:  # noqa: BLE001  (whatever it is, the other ranks must hear of it before it is raised)
        result, refused = None, err
    verdicts = gather_ints(int(refused is not None))
    if refused is not None:
        raise refused
    if any(verdicts):
        raise ArgumentValueError("{what} was refused on rank(s) {ranks}, whose log says why: no rank starts.",
                                 what=what, ranks=[rank for rank, no in enumerate(verdicts) if no])
    return result


def gather_ints(value: int) -> List[int]:
    """Every rank's `value` (an int below 2**24), in rank order, with one small all-reduce; all ranks must call it."""
    # On CPU, AllReduce sums float32 only (measured: MAX and int32 are refused), so each rank writes its value in
    # its own slot and the sum gathers them all; float32 holds ints below 2**24 exactly.
    slots = np.zeros(get_group_size(), np.float32)
    slots[get_rank()] = value
    return [int(v) for v in all_reduce_sum(ms.Tensor(slots)).asnumpy()]


def all_reduce_sum(value: ms.Tensor) -> ms.Tensor:
    """float32 `value` summed over the world's ranks (all ranks must call it)."""
    return _sum_cell()(value)

"""Data-parallel accumulation: micro-batches accumulate locally, and each window is all-reduced once.

MindSpore's `nn.DistributedGradReducer` all-reduces every step's gradients: K times per update when accumulating.
Here the buffer is all-reduced once, when the window is full, with its sample count, so the global sum over the
global count is the gradient of the concatenated global batch even when ranks saw different numbers of samples.
Data parallel is read when a buffer is built (`data_parallel_info`: msrun's processes joined by
`mindspore.communication.init()`, no parallel context needed); `ms_accum.train.distributed` joins msrun's cluster.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank

from .._mindspore import communication_initialized, world_group
from .._validation import ArgumentValueError, door


_hyper_map = ops.HyperMap()
_all_reduce_op = ops.MultitypeFuncGraph("ms_accum_all_reduce")


@_all_reduce_op.register("Function", "Tensor")
def _all_reduce_in_place(all_reduce, grad_sum):
    ops.assign(grad_sum, all_reduce(grad_sum))  # for its effect (docs/mindspore.md, Assign's return value)


@dataclass(frozen=True)
class DataParallelInfo:
    """This process's place in a data-parallel job: `rank` in [0, `group_size`)."""

    rank: int
    group_size: int

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one process that writes files and prints."""
        return self.rank == 0


@door("data_parallel_info")
def data_parallel_info() -> Optional[DataParallelInfo]:
    """
    This process's rank and group size when it trains data parallel, else None.

    Data parallel is ms_accum's own once `mindspore.communication.init()` has joined more than one process
    (`ms_accum.init_data_parallel` under msrun): it needs none of MindSpore's parallel context, which MindSpore 2.11
    sunsets. A context set to ``DATA_PARALLEL`` by the user is honoured as well.

    Returns:
        DataParallelInfo, or None for one process.

    Raises:
        ValueError: If the parallel mode is neither stand-alone nor data parallel (semi-auto and auto parallel
            shard the gradients themselves), or is data parallel before `mindspore.communication.init()`.
    """
    mode = ms.get_auto_parallel_context("parallel_mode")
    if mode not in (ms.ParallelMode.STAND_ALONE, ms.ParallelMode.DATA_PARALLEL):
        raise ArgumentValueError("the parallel mode must be '{STAND_ALONE}' or '{DATA_PARALLEL}', but got '{mode}'.",
                                 STAND_ALONE=ms.ParallelMode.STAND_ALONE, DATA_PARALLEL=ms.ParallelMode.DATA_PARALLEL,
                                 mode=mode)
    # Without init(), get_rank() and get_group_size() answer 0 and 1 rather than fail (measured), so the
    # collectives would be compiled for a group that does not exist: check the flag init() sets.
    if not communication_initialized():
        if mode == ms.ParallelMode.STAND_ALONE:
            return None
        raise ArgumentValueError("the parallel mode is '{mode}', which needs mindspore.communication.init() first, "
                                 "but it was not called.", mode=mode)
    if mode == ms.ParallelMode.STAND_ALONE and get_group_size() == 1:
        return None
    return DataParallelInfo(get_rank(), get_group_size())


def sum_divisor(group: str) -> float:
    """What a ``"sum"`` window all-reduced over `group` is divided by: 1, so it is the sum over the global batch, as
    one step on it would be; the group's size only when the user set MindSpore's ``DATA_PARALLEL`` context with
    ``gradients_mean=True`` (what `nn.DistributedGradReducer` then does)."""
    mean_over_ranks = (ms.get_auto_parallel_context("parallel_mode") == ms.ParallelMode.DATA_PARALLEL
                       and bool(ms.get_auto_parallel_context("gradients_mean")))
    return float(get_group_size(group)) if mean_over_ranks else 1.0


@ms.jit_class
class LocalSums:
    r"""
    The window's sums on one process: the buffer and its sample count as they are.

    A `jit_class`, not a Cell: graph code inlines it, and `Accumulator.flush` called from Python runs it eagerly
    (docs/mindspore.md, a Cell returning its input Parameters).

    Inputs:
        - **grad_sum** (tuple[Tensor]) - The window's buffer.
        - **num_samples** (Tensor) - float32 scalar, the samples (or micro-batches) it holds.

    Outputs:
        Tuple of (tuple[Tensor], Tensor): both inputs, untouched.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    sum_divisor = 1.0  # what a "sum" window is divided by: nothing

    def __call__(self, grad_sum, num_samples):
        return grad_sum, num_samples

    def total(self, value):
        """`value` summed over the ranks: here, one rank, `value` itself."""
        return value

    def totals(self, first, second):
        """Two float32 scalars summed over the ranks: here, as they are (no kernel runs)."""
        return first, second


@ms.jit_class
class AllReduceSums:
    r"""
    The window's sums over all ranks: one all-reduce (sum) per buffer tensor, written back into the buffer, and one
    of the sample count.

    Each rank's buffer holds its sample-weighted gradient sum, so the global sum divided by the global sample
    count is the gradient of the concatenated global batch, however the samples were spread over the ranks. A
    ``"sum"`` window is the sum over the global batch (see `sum_divisor`).

    Args:
        group (str): The communication group. Default: ``None``, the world group of the backend in use.

    Inputs:
        - **grad_sum** (tuple[Tensor]) - This rank's window buffer.
        - **num_samples** (Tensor) - float32 scalar, this rank's samples (or micro-batches) in the window.

    Outputs:
        Tuple of (tuple[Tensor], Tensor): the buffer's Parameters, which now hold the sums over the ranks (so a graph
        launched afterwards, `TrainOptim` after `TrainForwardBackward`'s windows say, reads the global window), and
        the sample count summed over the ranks.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, group: Optional[str] = None) -> None:
        # init() names the backend's group (mccl_world_group on CPU); reading it here, not as a default argument,
        # picks that name up.
        self.group = world_group() if group is None else group
        self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, self.group)
        self.sum_divisor = sum_divisor(self.group)

    def __call__(self, grad_sum, num_samples):
        _hyper_map(ops.partial(_all_reduce_op, self.all_reduce), grad_sum)
        # The buffer's Parameters, read after the writes: auto-monad orders them.
        return grad_sum, self.all_reduce(num_samples)

    def total(self, value):
        """float32 `value` summed over the ranks (window counters every rank must agree on)."""
        return self.all_reduce(value)

    def totals(self, first, second):
        """Two float32 scalars summed over the ranks, in one all-reduce."""
        # `* 1.0` reads a Parameter's value: PyNative refuses to stack a Parameter (a Ref) with a Tensor.
        both = self.all_reduce(ops.stack([first * 1.0, second * 1.0]))
        return both[0], both[1]


@ms.jit_class
class CountSums(AllReduceSums):
    r"""`AllReduceSums` for a buffer already all-reduced in buckets, each in its own graph launch, before the graph that
    closes the window (`InPlaceAllReduce`, the executor's way): the graph sums the sample count alone.

    A graph that all-reduces the whole buffer holds every reduced copy until it ends: MindSpore keeps the outputs of a
    graph's communication kernels apart from the memory it reuses (docs/data-parallel.md, communication)."""

    def __call__(self, grad_sum, num_samples):
        return grad_sum, self.all_reduce(num_samples)


# The most a graph launch of `InPlaceAllReduce` sums: such a graph holds its reduced copies until it ends, so a bucket
# costs about its size, while a launch per tensor costs small networks a collective's latency per tensor
# (docs/data-parallel.md, communication).
BUCKET_BYTES = 4 * 2 ** 20


class InPlaceAllReduce(nn.Cell):
    """Tensors summed over the ranks and written back in place, in one graph launch: a bucket of `in_buckets`
    (`CountSums`)."""

    def __init__(self, group: Optional[str] = None) -> None:
        super().__init__()
        self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, world_group() if group is None else group)

    def construct(self, *tensors):
        for tensor in tensors:
            ops.assign(tensor, self.all_reduce(tensor))


def in_buckets(tensors: Sequence, cap: int = BUCKET_BYTES) -> List[tuple]:
    """`tensors` in buckets, each one launch of `InPlaceAllReduce`, the same on every rank: a tensor of `cap` bytes or
    more alone, the smaller ones in order, as many as fit in `cap` bytes together."""
    buckets = [(tensor,) for tensor in tensors if tensor.nbytes >= cap]
    small: List[list] = [[]]
    for tensor in (tensor for tensor in tensors if tensor.nbytes < cap):
        if sum(other.nbytes for other in small[-1]) + tensor.nbytes > cap:
            small.append([])
        small[-1].append(tensor)
    return buckets + [tuple(bucket) for bucket in small if bucket]


def sums_reducer(reduce_on_host: bool = False) -> Union[LocalSums, AllReduceSums]:
    """
    The window's communication for the current parallel mode: in data parallel `AllReduceSums`, or `CountSums` when
    the buffer is all-reduced from the host (`reduce_on_host`); else `LocalSums`.

    Called when an `AccumulationBuffer` is built, so the choice is made once, outside the graph.

    Returns:
        A `LocalSums`, an `AllReduceSums` or a `CountSums`.

    Raises:
        ValueError: As :func:`data_parallel_info` raises.
    """
    if data_parallel_info() is None:
        return LocalSums()
    return CountSums() if reduce_on_host else AllReduceSums()

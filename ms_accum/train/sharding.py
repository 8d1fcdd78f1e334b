"""The optimizer state sharded across data-parallel ranks (ZeRO stage 1): each rank keeps the state of its own part of
the parameters and steps only that part; the updated parameters are then gathered (docs/data-parallel.md, sharding).

The partition is of whole parameters, balanced by size, as PyTorch's `ZeroRedundancyOptimizer` makes it: a rank's part
is then a list of Parameters, so its optimizer is the user's own class built over them, with each parameter's learning
rate, weight decay and schedule, and every update is the unsharded one bit for bit. Flat slices would need the
optimizer to run on views of a flat buffer, which a MindSpore optimizer, built over Parameters, cannot.
"""
from __future__ import annotations

import gc
import inspect
from typing import Dict, List, Sequence, Tuple

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn

from .._validation import ArgumentValueError
from ..core.buffer import AccumulationBuffer
from ..core.parallel import DataParallelInfo, in_buckets
from ..graphs.cells import TrainingState, _BufferCell
from .distributed import all_reduce_sum
from .structures.base import Closer, Parts


# The optimizers ms_accum rebuilds over a rank's part, each checked to step exactly as the whole one
# (tests/test_sharding.py). Another class may keep state across parameters or arguments it cannot read back.
SHARDABLE = (nn.Momentum, nn.SGD, nn.Adam, nn.AdamWeightDecay)
_OWN_ARGS = ("params", "learning_rate", "weight_decay")  # rebuilt from the optimizer's per-parameter state


class ShardedCloser(Closer):
    """
    The closer of a data-parallel rank that keeps the optimizer state of its own part of the parameters only
    (``GradientAccumulation(..., shard_optimizer=True)``): the window is reduced and checked as everywhere, then this
    rank's optimizer, the user's class built over its part (`local_optimizer`), steps that part while the parameters
    of the other parts are zeroed, and every parameter is all-reduced in place, in buckets as the buffer was: the
    sum is its owner's value, exactly (x + 0 = x). The gather reuses the reduction's graphs and memory, where a
    broadcast's outputs cost more (measured, docs/data-parallel.md).

    Args:
        parts (Parts): What the executor trains.
        parallel (DataParallelInfo): This rank and the number of ranks.
    """

    def __init__(self, parts: Parts, parallel: DataParallelInfo) -> None:
        self.owners = partition([p.size for p in parts.optimizer.parameters], parallel.group_size)
        self.owned = tuple(i for i, owner in enumerate(self.owners) if owner == parallel.rank)
        self.rank = parallel.rank
        self.part = local_optimizer(parts.optimizer, self.owned)
        super().__init__(parts)
        self.param_buckets = in_buckets(parts.optimizer.parameters)

    def step_cell(self, parts: Parts) -> nn.Cell:
        return _StepPart(self.part, parts.buffer, self.owned, parts.optimizer.parameters)

    def training_state(self, parts: Parts) -> nn.Cell:
        return ShardedState(TrainingState(parts.net_with_loss, parts.optimizer, parts.buffer, parts.dropout), self)

    def apply(self) -> None:
        """This rank's part stepped and the others' zeroed, then every parameter summed over the ranks."""
        self.step()
        self.all_reduce(self.param_buckets)


class _StepPart(_BufferCell):
    """The buffer's `step_part`: this rank's optimizer on its part of the window, the other parts' parameters zeroed
    for the gather, and the window closed."""

    def __init__(self, part: nn.Optimizer, buffer: AccumulationBuffer, owned: Sequence[int],
                 params: Sequence[Parameter]) -> None:
        super().__init__(buffer)
        self.optimizer = part
        self.slots = ParameterTuple([buffer.grad_sum[i] for i in owned])
        self.to_params = buffer.dtypes_of(owned, part.parameters)
        self.others = ParameterTuple([p for i, p in enumerate(params) if i not in owned])

    def construct(self):
        return self.buffer.step_part(self.optimizer, self.to_params(self.slots), self.others)


class ShardedState(nn.Cell):
    """
    The training state of a rank whose optimizer state is sharded, in the one format of `TrainingState`'s files.

    It holds what the rank keeps: the network, its part's optimizer state, the buffer. A file of any run, sharded or
    not, on any number of ranks, loads into it (the other parts' optimizer state is skipped as training state);
    `contents` gives what a file holds, every part's optimizer state gathered from its owner, all ranks taking part.

    Args:
        whole (TrainingState): The unsharded state, whose names and order files keep (nothing of it is read but what
            this rank holds).
        closer (ShardedCloser): This rank's part.
    """

    def __init__(self, whole: TrainingState, closer: ShardedCloser) -> None:
        super().__init__(auto_prefix=False)
        self.network, self.optimizer, self.window_state = whole.network, closer.part, whole.window_state
        self.dropout = whole.dropout
        owner = {id(state[i]): closer.owners[i] for state in _per_parameter(whole.optimizer)
                 for i in range(len(state))}
        # (name, the Parameter, its owner, or None for what every rank holds), in the files' order.
        self.entries = [(param.name, param, owner.get(id(param))) for param in whole.get_parameters()]
        self.rank = closer.rank

    def contents(self) -> List[dict]:
        """What a training-state file holds, ``[{"name", "data"}]``, each part's optimizer state taken from its owner
        by an all-reduce per tensor (the others give zeros): every rank must call it, and rank 0, which writes the
        file, keeps what it gathers (the others get an empty list)."""
        self.dropout.pull()
        saved = []
        for name, param, owner in self.entries:
            if owner is not None and owner != self.rank:  # another part's: its owner's value (this rank's is zeros)
                param = all_reduce_sum(Tensor(np.zeros(param.shape, np.float32))).astype(param.dtype)
            elif owner is not None:  # this rank's part: given to the others, kept as it is (no copy)
                all_reduce_sum(param.astype(np.float32))
            if self.rank == 0:
                saved.append({"name": name, "data": param})
        return saved


def _per_parameter(optimizer: nn.Optimizer) -> List[ParameterTuple]:
    """The optimizer's state tuples that hold one tensor per parameter (moments), beside the parameters themselves."""
    trained = {id(p) for p in optimizer.parameters}
    return [value for name, value in vars(optimizer).items() if isinstance(value, ParameterTuple)
            and name != "learning_rate" and len(value) == len(trained) and not any(id(p) in trained for p in value)]


def partition(sizes: Sequence[int], ranks: int) -> Tuple[int, ...]:
    """The rank that owns each parameter, from the parameters' `sizes`: the largest first, each to the rank that holds
    the fewest elements so far (the lowest such rank on a tie), so every rank computes the same partition."""
    loads = [0] * ranks
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(ranks), key=lambda r: (loads[r], r))
        owners[index] = rank
        loads[rank] += sizes[index]
    return tuple(owners)


def check_shardable(optimizer: nn.Optimizer, ranks: int) -> None:
    """Refuses, with the reason, an optimizer that ms_accum cannot rebuild over a rank's part of the parameters."""
    kind = type(optimizer)
    if kind not in SHARDABLE:
        names = ", ".join(f"nn.{k.__name__}" for k in SHARDABLE)
        raise ArgumentValueError(f"the argument 'optimizer' cannot be sharded with shard_optimizer=True: ms_accum "
                                 f"rebuilds {names} over each rank's parameters, but got {kind.__name__}, which may "
                                 f"keep state across parameters or take arguments it cannot read back.")
    for flag in ("use_lazy", "use_offload"):
        if getattr(optimizer, flag, False):
            raise ArgumentValueError(f"the argument 'optimizer' cannot be sharded with shard_optimizer=True: it was "
                                     f"built with {flag}=True, whose state does not live in its Parameters.")
    if len(optimizer.parameters) < ranks:
        raise ArgumentValueError(f"the argument 'optimizer' cannot be sharded with shard_optimizer=True over {ranks} "
                                 f"ranks: it updates {len(optimizer.parameters)} parameters, and a rank would own "
                                 f"none (whole parameters are shared out).")


def local_optimizer(optimizer: nn.Optimizer, owned: Sequence[int]) -> nn.Optimizer:
    """`optimizer`'s class built over the parameters at `owned` (indices into `optimizer.parameters`), with their
    learning rates, weight decays and schedules, and holding `optimizer`'s own state Parameters for them (moments,
    step count, learning rate): the part steps as the whole would, its state is saved under the same names, and the
    state of the other parameters, never touched, is never resident."""
    kind = type(optimizer)
    params = [optimizer.parameters[i] for i in owned]
    arguments = {name: value for name, value in _hyperparameters(optimizer).items() if name not in _OWN_ARGS}
    if optimizer.is_group:
        (learning_rate, params), weight_decay = _groups(optimizer, owned), 0.0
    else:
        learning_rate, weight_decay = _rate(optimizer.learning_rate), _decay(optimizer, optimizer.weight_decay)
    part = kind(params, learning_rate=learning_rate, weight_decay=weight_decay, **arguments)
    built = {id(param) for param in part.get_parameters()}
    _share_state(part, optimizer, owned)
    _forget_clones([optimizer.parameters[i] for i in owned], built - {id(param) for param in part.get_parameters()})
    return part


def _hyperparameters(optimizer: nn.Optimizer) -> Dict[str, object]:
    """The optimizer's constructor arguments: as MindSpore recorded them (`init_args`), else read back from the
    attributes of the same names (`AdamWeightDecay` records none)."""
    recorded = getattr(optimizer, "init_args", None)
    if recorded is not None:
        arguments = dict(recorded)
        arguments.update(arguments.pop("kwargs", {}))  # Adam's **kwargs, recorded as one argument
        return arguments
    arguments = {}
    for name in inspect.signature(inspect.unwrap(type(optimizer).__init__)).parameters:
        if name in ("self", *_OWN_ARGS):
            continue
        value = getattr(optimizer, name)
        arguments[name] = value.asnumpy().item() if isinstance(value, Tensor) else value
    return arguments


def _rate(rate):
    """A built learning rate (a Parameter, a Tensor schedule or the user's `LearningRateSchedule`) as the constructor
    takes it: a float, a 1-D Tensor, or the same schedule."""
    inner = getattr(rate, "learning_rate", None)  # MindSpore's wrappers of a value or a Tensor of per-step values
    if isinstance(rate, Parameter):
        return float(rate.asnumpy())
    if type(rate).__name__ in ("_ConvertToCell", "_IteratorLearningRate") and isinstance(inner, Parameter):
        array = inner.asnumpy()
        return float(array) if array.ndim == 0 else Tensor(array)
    return rate


def _decay(optimizer: nn.Optimizer, decay):
    """A built weight decay (pre-multiplied by the loss scale, or MindSpore's wrapper of a schedule) as given."""
    if isinstance(decay, nn.Cell):
        return decay.weight_decay
    value = decay.asnumpy().item() if isinstance(decay, Tensor) else decay
    return float(value) / optimizer.loss_scale


def _groups(optimizer: nn.Optimizer, owned: Sequence[int]) -> Tuple[object, List[dict]]:
    """The owned parameters in groups of one learning rate and weight decay each, in their order (`order_params`),
    with the default learning rate to give beside them."""
    groups: Dict[Tuple[int, object], dict] = {}
    for i in owned:
        rate, decay = optimizer.group_lr[i], optimizer.group_weight_decay[i]
        key = (id(rate), id(decay) if isinstance(decay, nn.Cell) else float(decay))
        group = groups.setdefault(key, {"params": [], "lr": _rate(rate), "weight_decay": _decay(optimizer, decay),
                                        "grad_centralization": optimizer.group_grad_centralization[i]})
        group["params"].append(optimizer.parameters[i])
    first = next(iter(groups.values()))["lr"]
    return first, [*groups.values(), {"order_params": [optimizer.parameters[i] for i in owned]}]


def _forget_clones(params: Sequence[Parameter], replaced: set) -> None:
    """Takes the part's own state Parameters that `_share_state` replaced off MindSpore's record of each parameter's
    clones (`Parameter.clone` appends every clone to its source's ``param_info.cloned_obj``), which would keep them
    alive, and resident, for the whole run."""
    for param in params:
        info = param.param_info
        clones = getattr(info, "cloned_obj", None)
        if clones is not None:
            info.cloned_obj = [clone for clone in clones if id(clone) not in replaced]
            param.param_info = info  # as `Parameter.clone` sets it back
    gc.collect()  # a clone and its `param_info` refer to each other: freed now, not at a later collection


def _share_state(part: nn.Optimizer, whole: nn.Optimizer, owned: Sequence[int]) -> None:
    """Makes `part` hold `whole`'s own state Parameters: the per-parameter ones of the owned parameters, and the
    others (step count, learning rates, momentum, powers of the betas)."""
    trained = {id(p) for p in whole.parameters}
    held = part._params  # pylint: disable=protected-access  (a Cell's Parameters by name, which its attributes read)
    for name, value in list(vars(part).items()):
        theirs = vars(whole).get(name)
        if isinstance(value, ParameterTuple) and isinstance(theirs, ParameterTuple) and len(theirs) == len(trained):
            for param in value:  # its own, replaced: their names may be whole's too
                if id(param) not in trained:
                    held.pop(param.name, None)
            del vars(part)[name]  # a tuple named as one of its Parameters ('learning_rate') could not be set again
            setattr(part, name, ParameterTuple([theirs[i] for i in owned]))
    for name, value in list(held.items()):
        theirs = whole._params.get(name)  # pylint: disable=protected-access
        if theirs is not None and theirs is not value and id(value) not in trained:
            setattr(part, name, theirs)
    rate = whole.learning_rate
    if isinstance(rate, nn.CellList):
        part.learning_rate = nn.CellList([rate[i] for i in owned], auto_prefix=False)
    elif isinstance(rate, nn.Cell):
        part.learning_rate = rate

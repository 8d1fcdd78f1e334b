"""The optimizer state sharded across data-parallel ranks (ZeRO stage 1): each rank keeps the state of its own part of
the parameters and steps only that part; the updated parameters are then gathered (docs/data-parallel.md, sharding).

The partition is of whole parameters, balanced by size, as PyTorch's `ZeroRedundancyOptimizer` makes it: a rank's part
is then a list of Parameters, and its optimizer is the user's own class built over them, by the user's factory
(``shard_optimizer=params -> optimizer``) or, for the classes of `REBUILT`, by ms_accum from their public attributes.
That optimizer keeps its own state, named as the user's optimizer names it, so every update is the unsharded one bit
for bit and the files are the unsharded ones. Flat slices would need the optimizer to run on views of a flat buffer,
which a MindSpore optimizer, built over Parameters, cannot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple, Union

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn

from .._mindspore import LearningRateSchedule, optimizer_attribute
from .._validation import ArgumentTypeError, ArgumentValueError
from ..core.buffer import AccumulationBuffer
from ..core.parallel import DataParallelInfo, in_buckets
from ..graphs.cells import TrainingState, _BufferCell
from .distributed import all_reduce_sum
from .structures.base import Closer, Parts

OptimizerFactory = Callable[[List[Parameter]], nn.Optimizer]

# The optimizers ms_accum rebuilds over a rank's part without a factory, each checked to step exactly as the whole one
# (tests/test_sharding.py): their constructor arguments beside the parameters, the learning rate and the weight decay,
# read back from the public attributes of the same names (a Tensor or Parameter as its number).
REBUILT: Dict[type, Tuple[str, ...]] = {
    nn.Momentum: ("momentum", "use_nesterov", "loss_scale"),
    nn.SGD: ("momentum", "dampening", "nesterov", "loss_scale"),
    nn.Adam: ("beta1", "beta2", "eps", "use_locking", "use_nesterov", "use_amsgrad", "loss_scale"),
    nn.AdamWeightDecay: ("beta1", "beta2", "eps"),
}


@dataclass(frozen=True)
class RankPart:
    """
    This rank's part of the optimizer (`rank_part`).

    Args:
        owners (tuple[int]): The rank that owns each of the optimizer's parameters (`partition`).
        owned (tuple[int]): The indices of this rank's.
        rank (int): This rank.
        optimizer (nn.Optimizer): The rank's optimizer over its parameters (`local_optimizer`).
    """

    owners: Tuple[int, ...]
    owned: Tuple[int, ...]
    rank: int
    optimizer: nn.Optimizer


def rank_part(optimizer: nn.Optimizer, parallel: DataParallelInfo, factory: OptimizerFactory) -> RankPart:
    """This rank's part of `optimizer`, its optimizer built by `factory` (`check_shardable` gives it)."""
    owners = partition([p.size for p in optimizer.parameters], parallel.group_size)
    owned = tuple(i for i, owner in enumerate(owners) if owner == parallel.rank)
    return RankPart(owners, owned, parallel.rank, local_optimizer(optimizer, owned, factory))


class ShardedCloser(Closer):
    """
    The closer of a data-parallel rank that keeps the optimizer state of its own part of the parameters only
    (``GradientAccumulation(..., shard_optimizer=...)``): the window is reduced and checked as everywhere, then this
    rank's optimizer, the user's class built over its part (`local_optimizer`), steps that part while the parameters
    of the other parts are zeroed, and every parameter is all-reduced in place, in buckets as the buffer was: the
    sum is its owner's value, exactly (x + 0 = x). The gather reuses the reduction's graphs and memory, where a
    broadcast's outputs cost more (measured, docs/data-parallel.md).

    Args:
        parts (Parts): What the executor trains.
        shard (RankPart): This rank's part of the optimizer.
    """

    def __init__(self, parts: Parts, shard: RankPart) -> None:
        self.owners, self.owned, self.rank, self.part = shard.owners, shard.owned, shard.rank, shard.optimizer
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
        whole (TrainingState): The unsharded state, whose names and order files keep. Of its optimizer's state, only
            what no part holds is read (another group's learning rate, the same on every rank).
        closer (ShardedCloser): This rank's part.
    """

    def __init__(self, whole: TrainingState, closer: ShardedCloser) -> None:
        super().__init__(auto_prefix=False)
        self.network, self.optimizer, self.window_state = whole.network, closer.part, whole.window_state
        self.dropout, self.rank = whole.dropout, closer.rank
        owner_of = {param.name: owner for param, owner in zip(whole.optimizer.parameters, closer.owners)}
        state = _state(whole.optimizer)
        held = {param.name: param for param in closer.part.get_parameters()}
        # (name, the Parameter, its owner, or None for what every rank holds), in the files' order: of the optimizer's
        # state, the part's own under the same name, the per-parameter state owned as its parameter is.
        self.entries = []
        for param in whole.get_parameters():
            owner = None
            if id(param) in state:
                owner = owner_of.get(param.name.partition(".")[2])
                param = held.get(param.name, param)
            self.entries.append((param.name, param, owner))

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


def partition(sizes: Sequence[int], ranks: int) -> Tuple[int, ...]:
    """The rank that owns each parameter, from the parameters' `sizes`: the largest first, each to the rank that holds
    the fewest elements so far (the lowest such rank on a tie), so every rank computes the same partition."""
    loads = [0] * ranks
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = loads.index(min(loads))
        owners[index] = rank
        loads[rank] += sizes[index]
    return tuple(owners)


def check_shardable(optimizer: nn.Optimizer, ranks: int,
                    shard_optimizer: Union[bool, OptimizerFactory]) -> OptimizerFactory:
    """What builds each rank's optimizer: `shard_optimizer` itself if it is a factory, else (True) ms_accum's rebuild
    of `optimizer`'s class (`REBUILT`); refuses, with the reason, an optimizer that cannot be sharded so."""
    for flag in ("use_lazy", "use_offload"):  # nn.Adam's; other classes have neither
        if optimizer_attribute(optimizer, flag, False):
            raise ArgumentValueError("{@optimizer:subject} cannot be sharded with {@shard_optimizer}: it was built "
                                     "with {flag}=True, whose state does not live in its Parameters.", flag=flag)
    if len(optimizer.parameters) < ranks:
        raise ArgumentValueError("{@optimizer:subject} cannot be sharded with {@shard_optimizer} over {ranks} ranks: "
                                 "it updates {parameters} parameters, and a rank would own none (whole parameters are "
                                 "shared out).", ranks=ranks, parameters=len(optimizer.parameters))
    steps = optimizer.global_step.asnumpy().item()
    if steps:  # each rank's optimizer starts from a new state, as `optimizer` was built
        raise ArgumentValueError("{@optimizer:subject} cannot be sharded with {@shard_optimizer} after it has stepped "
                                 "({steps} steps): each rank's optimizer starts from a new state; resume from the "
                                 "run's training-state file instead.", steps=steps)
    if shard_optimizer is not True:
        return shard_optimizer
    kind = type(optimizer)
    if kind not in REBUILT:
        names = ", ".join(f"nn.{k.__name__}" for k in REBUILT)
        raise ArgumentValueError("{@shard_optimizer:subject} must be a factory params -> optimizer that builds your "
                                 "{name} over a rank's parameters: ms_accum rebuilds {names} by itself, but got True.",
                                 name=kind.__name__, names=names)
    if optimizer_attribute(optimizer, "dynamic_weight_decay"):
        raise ArgumentValueError("{@shard_optimizer:subject} must be a factory params -> optimizer that builds your "
                                 "{name} over a rank's parameters when its weight decay is a Cell (a schedule, which "
                                 "ms_accum does not read back), but got True.", name=kind.__name__)
    arguments = {name: _number(optimizer_attribute(optimizer, name)) for name in REBUILT[kind]}
    return lambda params: _rebuild(optimizer, params, arguments)


def local_optimizer(optimizer: nn.Optimizer, owned: Sequence[int], factory: OptimizerFactory) -> nn.Optimizer:
    """`factory`'s optimizer over the parameters at `owned` (indices into `optimizer.parameters`), checked to hold
    state of `optimizer`'s only, under the same names: each file then holds the unsharded state and loads into it."""
    params = [optimizer.parameters[i] for i in owned]
    part = factory(list(params))
    if not isinstance(part, nn.Optimizer):
        raise ArgumentTypeError("{@shard_optimizer:subject} must return an nn.Optimizer, but returned {part!r} of type "
                                "{name}.", part=part, name=type(part).__name__)
    if [id(param) for param in part.parameters] != [id(param) for param in params]:
        raise ArgumentValueError("{@shard_optimizer:subject} must build an optimizer over the parameters it is given, "
                                 "in their order, but it was given {given} and built one over {built}.",
                                 given=[p.name for p in params], built=[p.name for p in part.parameters])
    theirs = {param.name: param for param in optimizer.get_parameters()}
    held = {param.name: param for param in part.get_parameters()}
    own = {param.name for param in params}
    for name in sorted(held.keys() - own):
        mine, given = held[name], theirs.get(name)
        if given is None or given.shape != mine.shape or given.dtype != mine.dtype:
            raise ArgumentValueError("{@shard_optimizer:subject} must build the optimizer's class with its settings, "
                                     "but the optimizer it built holds '{name}', which {@optimizer:subject} does not "
                                     "hold (with shape {shape}, {dtype}).", name=name, shape=mine.shape,
                                     dtype=mine.dtype)
        if mine is not given and mine.size == 1 and given.asnumpy().item() != mine.asnumpy().item():
            raise ArgumentValueError("{@shard_optimizer:subject} must build the optimizer's class with its settings, "
                                     "but the optimizer it built holds '{name}' = {built} where {@optimizer:subject} "
                                     "holds {given}.", name=name, built=mine.asnumpy().item(),
                                     given=given.asnumpy().item())
    state = _state(optimizer)
    missing = [p.name for p in optimizer.get_parameters() if id(p) in state and p.name.partition(".")[2] in own
               and p.name not in held]
    if missing:
        raise ArgumentValueError("{@shard_optimizer:subject} must build the optimizer's class with its settings, but "
                                 "the optimizer it built does not hold '{value}', which {@optimizer:subject} keeps for "
                                 "that parameter.", value=missing[0])
    return part


def _state(optimizer: nn.Optimizer) -> set:
    """The ids of the optimizer's own Parameters: its state (moments, step count, learning rates), not those it
    trains. MindSpore names the state of a parameter ``<slot>.<parameter name>`` (`ParameterTuple.clone`)."""
    trained = {id(param) for param in optimizer.parameters}
    return {id(param) for param in optimizer.get_parameters() if id(param) not in trained}


def _rebuild(optimizer: nn.Optimizer, params: List[Parameter], arguments: Dict[str, object]) -> nn.Optimizer:
    """`optimizer`'s class over `params` (some of its parameters), with `arguments` and each parameter's learning
    rate, weight decay and gradient centralization: the rates themselves (`_rate`), the weight decays as numbers."""
    position = {id(param): i for i, param in enumerate(optimizer.parameters)}
    rates = optimizer.learning_rate  # one per parameter with groups of their own rates, else one for all
    per_parameter = isinstance(rates, (tuple, nn.CellList))
    loss_scale = optimizer_attribute(optimizer, "loss_scale")
    if not optimizer_attribute(optimizer, "is_group"):
        return type(optimizer)(params, learning_rate=_rate(rates), weight_decay=_number(
            optimizer_attribute(optimizer, "weight_decay")) / loss_scale, **arguments)
    decays = optimizer_attribute(optimizer, "group_weight_decay")
    centralizations = optimizer_attribute(optimizer, "group_grad_centralization")
    groups: Dict[tuple, dict] = {}
    for param in params:
        i = position[id(param)]
        rate = rates[i] if per_parameter else rates
        decay = decays[i] / loss_scale
        centralized = centralizations[i]
        key = (id(rate), decay, centralized)
        if key not in groups:
            groups[key] = {"params": [], "lr": _rate(rate), "weight_decay": decay, "grad_centralization": centralized}
        groups[key]["params"].append(param)
    first = next(iter(groups.values()))["lr"]
    return type(optimizer)([*groups.values(), {"order_params": params}], learning_rate=first, **arguments)


def _rate(rate: Union[Parameter, nn.Cell]) -> LearningRateSchedule:
    """A built learning rate as a rank's optimizer takes it: the same schedule Cell, or a rate held in a Parameter
    read from that Parameter (`_HeldRate`)."""
    return _HeldRate(rate) if isinstance(rate, Parameter) else rate


def _number(value):
    """A constructor argument as given: a number for a Tensor or Parameter of one element."""
    return value.asnumpy().item() if isinstance(value, Tensor) else value


class _HeldRate(LearningRateSchedule):
    """
    The learning rate that the user's optimizer holds in a Parameter, as a schedule for a rank's optimizer: the rank
    steps with that Parameter itself (its name in the files, any value set into it), not a copy of its own.

    Args:
        rate (Parameter): The user's optimizer's learning rate.
    """

    def __init__(self, rate: Parameter) -> None:
        super().__init__()
        self.rate = rate

    def construct(self, global_step):
        return self.rate

"""Dropout whose masks are a function of a seed and of how many values the op has drawn: the same in every run, on any
number of threads, saved with the training state, and never stored: the backward draws the mask again.

MindSpore 2.10's CPU `Dropout` kernel keeps a random engine of its own, seeded from the op's ``Seed0``/``Seed1`` when
the graph compiles, which its threads share while its launch search runs: which value lands where depends on their
timing, and no API reads or sets the engine (docs/mindspore.md, dropout's kernel and its threads). `SeededDropout`
computes the mask as SplitMix64 (the generator that seeds Java's `SplittableRandom`) of the op's seed and of the count
of words it has drawn, in a C++ kernel of ms_accum's (`kernels/seeded_dropout.cc`, built by `ms_accum.core.native`);
like FlashAttention's dropout it keeps no mask for the backward, which draws it again from the offset the forward drew
from.

`DropoutStreams` is that state for a whole network, kept beside it (ms_accum saves it with the training state): the
network keeps its classes, cells and Parameters. While `DropoutStreams.drawing()` is open, each `nn.Dropout` of the
network calls its `SeededDropout` primitive instead of MindSpore's (set with `setattr`, MindSpore's public way of giving
a Cell another primitive, and set back when it closes). `uncovered_random_ops` names the random ops it does not reach.
"""
from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import inspect
import textwrap
import warnings
import weakref
from typing import Iterator, List, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from .._mindspore import (DROPOUT_OP, RANDOM_EFFECT_ATTR, RANDOM_SEED_ATTRS, aot_primitive, dropout_op,
                          dropout_settings, mark_random, prim_attrs, primitives, random_functions)
from .._validation import StateError
from ..deprecation import module_getattr
from . import native

# 0.3's seeding functions (seed_dropout, ...) fail with the deprecation table's line, naming the streams.
__getattr__ = module_getattr(__name__)

_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's step: 2^64 / the golden ratio
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_SHIFTS = (30, 27, 31)
_MASK64 = (1 << 64) - 1
_LANE_BITS = 16  # four 16-bit draws from each 64-bit word
_STATE_FLAG = "ms_accum_random_state"  # marks the Parameters that are a random op's state, not weights
STATE_PREFIX = "dropout_stream."  # the streams' Parameter names in a training-state file


def splitmix64(value: int) -> int:
    """SplitMix64's output function on a 64-bit value (what the kernel computes per word, here for one int)."""
    z = value & _MASK64
    z = ((z ^ (z >> _SHIFTS[0])) * _MIX[0]) & _MASK64
    z = ((z ^ (z >> _SHIFTS[1])) * _MIX[1]) & _MASK64
    return z ^ (z >> _SHIFTS[2])


def op_seed(seed0: int, seed1: int) -> int:
    """The seed of a `SeededDropout` drawing for a MindSpore op seeded with `(Seed0, Seed1)`: both mixed into 63 bits
    (an int64 Parameter), so that `mindspore.set_seed` and the order the ops were built in decide it, as they decided
    the op's. An unseeded op (0, 0) gets a seed from the operating system: its run is not reproducible, as MindSpore's
    would not be, but it resumes exactly, since the seed is saved with the state."""
    if not seed0 and not seed1:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0]) >> 1
    return splitmix64(splitmix64((seed0 << 32) ^ seed1) + _GOLDEN) >> 1


SLOTS = 1024  # dropout ops alive at once in a process: the kernel library's entry points (kernels/seeded_dropout.cc)
_FREE = list(range(SLOTS - 1, -1, -1))  # slots no op holds, the lowest last (taken first)
KERNEL = "seeded_dropout"  # kernels/seeded_dropout.cc
ENTRIES = "".join(f"MS_ACCUM_ENTRY({slot})\n" for slot in range(SLOTS))  # the source appended to it
# What this module and the primitives look up in the library: a library without them (another kernel's, renamed into
# the cache) is built again rather than loaded.
SYMBOLS = ("ms_accum_slot_set", "ms_accum_slot_offset", "SeededDropoutGrad", "SeededDropout0",
           f"SeededDropout{SLOTS - 1}")


@functools.lru_cache(maxsize=None)
def _library() -> Tuple[str, ctypes.CDLL]:
    """The kernel library's path and, through ctypes, its slot functions (the same library MindSpore loads: a path
    opened twice is one library).

    Raises:
        KernelBuildError: If it cannot be built or loaded here (`ms_accum.core.native.library`).
    """
    path = native.library(KERNEL, ENTRIES, SYMBOLS)
    lib = native.load(path)
    lib.ms_accum_slot_set.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_double]
    lib.ms_accum_slot_offset.argtypes = [ctypes.c_int]
    lib.ms_accum_slot_offset.restype = ctypes.c_int64
    return path, lib


def kernel_available() -> bool:
    """Whether `SeededDropout` can run here: on CPU, with its kernel built (`ms_accum.core.native`)."""
    return ms.get_context("device_target") == "CPU" and _built()


@functools.lru_cache(maxsize=None)
def _built() -> bool:
    """Whether the kernel library is built; the first time it cannot be, says why, once per process."""
    try:
        _library()
    except native.KernelBuildError as err:
        warnings.warn(f"{err} nn.Dropout keeps MindSpore's kernel: runs may differ and a resumed run draws other "
                      f"masks (docs/resume.md).", UserWarning, stacklevel=4)
        return False
    return True


def _wait() -> None:
    """Waits for the work launched before, whose kernels may still be drawing: PyNative mode queues its ops and runs
    them in order, and `asnumpy` waits for the op it reads (on CPU graph mode runs a graph to its end before the call
    returns; `mindspore.runtime.synchronize` serves GPU and Ascend only)."""
    (Tensor(0, ms.int32) + 0).asnumpy()


def _primitive(path: str, slot: int) -> ops.Custom:
    """The forward primitive of `slot`, whose backward calls the grad kernel on ``dout`` with the offset the forward
    drew from. Built here, not in a method: graph mode parses the function that encloses a `bprop`."""
    grad = aot_primitive(path, "SeededDropoutGrad", out_shape=lambda dout, *_: dout, out_dtype=lambda dout, *_: dout)
    slot_tensor = Tensor(slot, ms.int64)

    def bprop(x, out, dout):
        return (grad(dout[0], slot_tensor, out[1]),)

    primitive = aot_primitive(path, f"SeededDropout{slot}", out_shape=lambda x: (x, []),
                              out_dtype=lambda x: (x, ms.int64), bprop=bprop)
    # A random op, as MindSpore marks its own: never merged with another call, nor its dropped output a lost side
    # effect; and not run again in a recomputed forward, which would draw further on.
    mark_random(primitive)
    primitive.recompute(False)
    return primitive


class SeededDropout:
    r"""
    One dropout op of ms_accum's: a primitive that takes the place of `ops.Dropout` in an `nn.Dropout`, ``(x) ->
    (output, offset)``, each value kept with probability `keep_prob` (rounded to a multiple of 2^-16) and scaled by
    ``1 / keep_prob``, the rest zeroed; its second output is the offset it drew from (where `ops.Dropout` returns a
    mask, which `nn.Dropout` drops). One C++ kernel (``ms_accum/core/kernels/seeded_dropout.cc``, through MindSpore's
    `ops.Custom`) computes the output in one pass, and the backward calls it again on the output's gradient with that
    offset: the mask is never stored.

    A call draws ``n = ceil(x.size / 4)`` 64-bit words, word ``i`` being ``splitmix64(seed + (offset + 1 + i) *
    0x9E3779B97F4A7C15)`` (mod 2^64), and adds `n` to `offset`; value ``k * n + i`` of `x` (row-major) is kept when the
    ``k``-th 16-bit lane of word ``i``, from the top, is below ``keep_prob * 2^16``. So its masks depend on the seed
    and on how many words the op has drawn, never on threads, graphs or processes. The seed and the offset live in
    the kernel's slot for the op (like MindSpore's own dropout kernel, whose engine lives in the kernel), which
    `seed` and `offset` read and set; `DropoutStreams` saves them.

    Args:
        keep_prob (float): The probability of keeping a value, in (0, 1].
        seed (int): The op's seed, in [0, 2^63).

    Raises:
        RuntimeError: If `SLOTS` ops are alive in the process already.

    Supported Platforms:
        ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> from ms_accum.core.dropout import SeededDropout
        >>> dropout = SeededDropout(0.7, seed=1234)
        >>> out, offset = dropout.primitive(Tensor(np.ones((2, 3), np.float32)))
        >>> dropout.offset  # 6 values, 2 words
        2
    """

    def __init__(self, keep_prob: float, seed: int) -> None:
        self.keep_prob = float(keep_prob)
        path, self._lib = _library()
        if not _FREE:
            raise StateError("ms_accum's dropout kernel has {slots} slots per process, and {slots} seeded dropout ops "
                             "are alive in this process: a new one needs an earlier one gone (its network deleted).",
                             slots=SLOTS)
        self.slot = _FREE.pop()
        weakref.finalize(self, _FREE.append, self.slot)  # the slot serves another op once this one is gone
        # Nothing can be drawing from the slot: its last op's streams stopped drawing, and waited, before it went.
        self._write(int(seed), 0)
        self.primitive = _primitive(path, self.slot)

    @property
    def seed(self) -> int:
        """The op's seed."""
        return self._seed

    @property
    def offset(self) -> int:
        """The words drawn so far; waits for the work launched before."""
        _wait()
        return self._drawn()

    def set(self, seed: int, offset: int) -> None:
        """Sets the seed and the words drawn; waits for the work launched before."""
        _wait()
        self._write(seed, offset)

    # Without the wait, for a caller that reads or sets many ops after one `_wait()`.
    def _drawn(self) -> int:
        return int(self._lib.ms_accum_slot_offset(self.slot))

    def _write(self, seed: int, offset: int) -> None:
        self._seed = int(seed)
        # The kernel keeps a lane whose random bits fall below this: keep_prob of the lane's range, at least one value.
        threshold = min(max(round(self.keep_prob * (1 << _LANE_BITS)), 1), 1 << _LANE_BITS)
        self._lib.ms_accum_slot_set(self.slot, self._seed, int(offset), threshold, 1.0 / self.keep_prob)


def _dropout_layers(network: nn.Cell) -> Iterator[Tuple[str, nn.Cell, ops.Dropout]]:
    """(path, cell, primitive) of each `nn.Dropout` of `network` whose construct is `nn.Dropout`'s (it calls its
    ``dropout`` primitive and drops the mask)."""
    for path, cell in network.cells_and_names():
        if isinstance(cell, nn.Dropout) and type(cell).construct is nn.Dropout.construct:
            prim = dropout_op(cell)
            if prim is not None:
                yield path, cell, prim


class DropoutStreams(nn.Cell):
    r"""
    The dropout state of a network, kept beside it: one `SeededDropout` per `nn.Dropout` of the network, seeded from
    its op's ``Seed0``/``Seed1``, and their seeds and offsets as Parameters to save.

    While `drawing()` is open, those `nn.Dropout` cells call the `SeededDropout` primitives instead of MindSpore's
    (set with `setattr`, MindSpore's public way of giving a Cell another primitive) and it sets MindSpore's back when it
    closes. The network keeps its classes, its cells and its Parameters throughout. The Parameters, named
    ``dropout_stream.{cell}.seed`` and ``.offset``, are this Cell's: a training state that holds it holds them, and a
    resumed run continues the masks where the saved run was. They are read from the kernel by `pull` (the training
    state does it before each save) and when `drawing()` closes, and written to it by `push`, which `drawing()` does
    when it opens.

    Build the network after `mindspore.set_seed`: its ops' seeds are given when they are built.

    Args:
        network (nn.Cell): The network; not changed.

    Supported Platforms:
        ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from ms_accum.core.dropout import DropoutStreams
        >>> ms.set_seed(0)
        >>> net = nn.SequentialCell([nn.Dense(4, 4), nn.Dropout(p=0.1)])
        >>> streams = DropoutStreams(net)
        >>> step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params()))
        >>> with streams.drawing():
        ...     pass  # step(x, y) here draws the masks from the streams
        >>> [p.name for p in streams.get_parameters()]
        ['dropout_stream.1.seed', 'dropout_stream.1.offset']
    """

    def __init__(self, network: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self._swaps = []  # (cell, MindSpore's primitive, the SeededDropout drawn instead)
        state = []
        for path, cell, prim in _dropout_layers(network):
            keep_prob, seed0, seed1 = dropout_settings(prim)
            op = SeededDropout(keep_prob, op_seed(seed0, seed1))
            self._swaps.append((cell, prim, op))
            name = f"{STATE_PREFIX}{path}"
            state += [Parameter(Tensor(op.seed, ms.int64), name=f"{name}.seed", requires_grad=False),
                      Parameter(Tensor(0, ms.int64), name=f"{name}.offset", requires_grad=False)]
        for param in state:
            setattr(param, _STATE_FLAG, True)
        self.state = ParameterTuple(state)
        self._open = 0

    @property
    def ops(self) -> List[SeededDropout]:
        """Each `nn.Dropout`'s op, in the order the network's cells are visited."""
        return [op for _, _, op in self._swaps]

    def covers(self, prim: ops.Primitive) -> bool:
        """Whether `prim` is one that `drawing()` replaces."""
        return any(prim is swapped for _, swapped, _ in self._swaps)

    def pull(self) -> None:
        """The kernel's seeds and offsets into the Parameters (to save them), once the work launched before is done."""
        _wait()
        for op, seed, offset in zip(self.ops, self.state[0::2], self.state[1::2]):
            seed.set_data(Tensor(op.seed, ms.int64))
            offset.set_data(Tensor(op._drawn(), ms.int64))  # pylint: disable=protected-access

    def push(self) -> None:
        """The Parameters' seeds and offsets into the kernel (after they were loaded), once the work launched before
        is done."""
        _wait()
        for op, seed, offset in zip(self.ops, self.state[0::2], self.state[1::2]):
            op._write(int(seed.asnumpy()), int(offset.asnumpy()))  # pylint: disable=protected-access

    @contextlib.contextmanager
    def drawing(self) -> Iterator["DropoutStreams"]:
        """The network's `nn.Dropout` cells draw from the streams inside; nested calls are one."""
        if self._open == 0:
            self.push()
            for cell, _, op in self._swaps:
                setattr(cell, DROPOUT_OP, op.primitive)
        self._open += 1
        try:
            yield self
        finally:
            self._open -= 1
            if self._open == 0:
                for cell, prim, _ in self._swaps:
                    setattr(cell, DROPOUT_OP, prim)
                self.pull()

    def __len__(self) -> int:
        return len(self._swaps)

    def construct(self):
        return ()


def seeded_layers(network: nn.Cell) -> List[ops.Dropout]:
    """The primitives of `network` that a `DropoutStreams` draws for here (none where `kernel_available` is false)."""
    return [prim for _, _, prim in _dropout_layers(network)] if kernel_available() else []


def dropout_streams(network: nn.Cell) -> DropoutStreams:
    """The `DropoutStreams` of `network` where `SeededDropout` runs (`kernel_available`: on CPU, where MindSpore's
    dropout kernel was measured to race); elsewhere an empty one, and the network keeps MindSpore's dropout. What the
    executor and `TrainCachedWindowCell` build."""
    return DropoutStreams(network if kernel_available() else nn.Cell())


def is_random_state(param: Parameter) -> bool:
    """Whether `param` is a random op's seed or offset: training state, not a weight."""
    return bool(getattr(param, _STATE_FLAG, False))


def _is_random_primitive(prim) -> bool:
    attrs = prim_attrs(prim)
    return bool(attrs.get(RANDOM_EFFECT_ATTR)) or "dropout" in type(prim).__name__.lower() or \
        any(key in attrs for pair in RANDOM_SEED_ATTRS for key in pair)


def _random_calls(cls: type) -> List[str]:
    """MindSpore random functions that `cls.construct`'s source calls other than through ``self`` (``ops.dropout``,
    ``ops.uniform``, ...): a Cell's own attributes are looked at as objects instead."""
    construct = getattr(cls, "construct", None)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(construct)))
    except (OSError, TypeError, SyntaxError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
                name, shown = func.attr, ast.unparse(func)
            elif isinstance(func, ast.Name):
                name, shown = func.id, func.id
            else:
                continue
            # MindSpore's dropout functions and `bernoulli` draw from kernels' engines as its random functions do.
            if name in random_functions() or name == "bernoulli" or "dropout" in name:
                found.append(shown)
    return sorted(set(found))


def uncovered_random_ops(network: nn.Cell, streams: DropoutStreams) -> List[str]:
    """What in `network` draws randomness that `streams` does not: a random primitive held by a Cell (``Dropout2D``,
    ``StandardNormal``, ...) or a MindSpore random function called in a Cell's `construct` (``ops.dropout``,
    ``ops.uniform``, ...); one line per Cell, naming it and what it calls. An `nn.Dropout` that the streams would
    draw for on CPU but cannot, its kernel not built here, is left out: that was said once, with what is lost
    (`kernel_available`)."""
    return [f"'{path or 'the network'}' ({type(cell).__name__}): {what}"
            for path, cell, what in _uncovered(network, streams)]


def uncovered_cells(network: nn.Cell, streams: DropoutStreams) -> List[str]:
    """The paths of the Cells `uncovered_random_ops` names (the network itself as its class name)."""
    return [path or type(cell).__name__ for path, cell, _ in _uncovered(network, streams)]


def _uncovered(network: nn.Cell, streams: DropoutStreams) -> Iterator[Tuple[str, nn.Cell, str]]:
    said = {id(prim) for _, _, prim in _dropout_layers(network)} \
        if ms.get_context("device_target") == "CPU" and not _built() else set()
    for path, cell in network.cells_and_names():
        prims = [f"{attribute} ({type(value).__name__})" for attribute, value in primitives(cell).items()
                 if not streams.covers(value) and id(value) not in said and _is_random_primitive(value)]
        calls = _random_calls(type(cell))
        if prims or calls:
            what = [*(f"primitive {p}" for p in prims), *(f"{c}(...) in construct" for c in calls)]
            yield path, cell, ", ".join(what)


def warn_uncovered(network: nn.Cell, streams: DropoutStreams, stacklevel: int = 3) -> None:
    """Warns once, at build time, naming each Cell whose randomness `streams` does not draw: its masks or noise come
    from MindSpore's kernels, whose state no API reads or sets, so two runs may differ and a resumed run starts them
    afresh (docs/resume.md)."""
    found = uncovered_random_ops(network, streams)
    if found:
        warnings.warn("these random ops draw from MindSpore's kernels, not from ms_accum's seeded streams, so two runs "
                      "may differ and a resumed run starts them afresh (docs/resume.md, dropout and other random "
                      "ops): " + "; ".join(found) + ".", UserWarning, stacklevel=stacklevel)


class DrawMarks:
    """Where a network's streams are, marked and gone back to, so that a forward run again drops the same values:
    gradient caching runs each micro-batch's forward twice (`TrainCachedWindowCell`).

    `mark` notes the offsets before the first forward, `rewind` notes where it ended and sets them back, `restore`
    sets them to where the first forward ended, whatever the second forward left. Each waits once for the work
    launched before it.

    Args:
        streams (DropoutStreams): The network's streams.
    """

    def __init__(self, streams: DropoutStreams) -> None:
        self.ops = streams.ops
        self.start: List[int] = []
        self.end: List[int] = []

    def mark(self) -> None:
        """Notes every op's offset, before the first forward."""
        _wait()
        self.start = [op._drawn() for op in self.ops]  # pylint: disable=protected-access

    def rewind(self) -> None:
        """Notes where the first forward left the offsets and sets them back to the marked ones."""
        _wait()
        self.end = [op._drawn() for op in self.ops]  # pylint: disable=protected-access
        self._set(self.start)

    def restore(self) -> None:
        """Sets the offsets to where the first forward left them, after the second."""
        _wait()
        self._set(self.end)

    def _set(self, offsets: List[int]) -> None:
        for op, offset in zip(self.ops, offsets):
            op._write(op.seed, offset)  # pylint: disable=protected-access

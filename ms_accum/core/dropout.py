"""Dropout whose masks are a function of a seed and of how many values the op has drawn: the same in every run, on any
number of threads, and saved with the training state.

MindSpore 2.10's CPU `Dropout` kernel keeps a random engine of its own, seeded from the op's ``Seed0``/``Seed1`` when
the graph compiles, which its threads share while its launch search runs (each kernel's 6th to 15th launches on 2
cores): which value lands where depends on their timing, and no API reads or sets the engine (docs/mindspore.md,
dropout's kernel and its threads). `SeededDropout` takes the op's place: its mask is SplitMix64 (the generator that
seeds Java's `SplittableRandom`) of the op's seed and of the count of words it has drawn, written with graph ops that
give the same result on any number of threads, and the seed and the count are Parameters of the network, saved
wherever the network is. `seed_dropout` puts it in a network's `nn.Dropout` cells; `DrawMarks` sets the counts back
for a forward that must run again with the same masks.
"""
from __future__ import annotations

from typing import List

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's step: 2^64 / the golden ratio
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_SHIFTS = (30, 27, 31)
_MASK64 = (1 << 64) - 1
_LANES, _LANE_BITS = 4, 16  # four 16-bit values from each 64-bit word
_STATE_FLAG = "ms_accum_random_state"  # marks the Parameters that are a random op's state, not weights


def splitmix64(value: int) -> int:
    """SplitMix64's output function on a 64-bit value (what the graph computes per element, here for one int)."""
    z = value & _MASK64
    z = ((z ^ (z >> _SHIFTS[0])) * _MIX[0]) & _MASK64
    z = ((z ^ (z >> _SHIFTS[1])) * _MIX[1]) & _MASK64
    return z ^ (z >> _SHIFTS[2])


def op_seed(seed0: int, seed1: int) -> int:
    """The seed of a `SeededDropout` replacing a MindSpore op seeded with `(Seed0, Seed1)`: both mixed into 63 bits (an
    int64 Parameter), so that `mindspore.set_seed` and the order the ops were built in decide it, as they decided the
    op's. An unseeded op (0, 0) gets a seed from the operating system: its run is not reproducible, as MindSpore's
    would not be, but it resumes exactly, since the seed is saved with the state."""
    if not seed0 and not seed1:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0]) >> 1
    return splitmix64(splitmix64((seed0 << 32) ^ seed1) + _GOLDEN) >> 1


class SeededDropout(nn.Cell):
    r"""
    A drop-in for the `ops.Dropout` primitive (what `nn.Dropout` calls): ``(x) -> (output, mask)``, each value kept
    with probability `keep_prob` (rounded to a multiple of 2^-16) and scaled by ``1 / keep_prob``, the rest zeroed.

    A call draws ``n = ceil(x.size / 4)`` 64-bit words, word ``i`` being ``splitmix64(seed + (offset + 1 + i) *
    0x9E3779B97F4A7C15)`` (mod 2^64), and adds `n` to `offset`; value ``k * n + i`` of `x` (row-major) is kept when the
    ``k``-th 16-bit lane of word ``i``, from the top, is below ``keep_prob * 2^16``. So its masks depend on the seed
    and on how many words the op has drawn, never on threads, graphs or processes: a second graph that calls the op
    (another structure, a recomputed forward) draws the same masks from the same `offset`. `seed` and `offset` are
    int64 Parameters of the Cell, not trained: a checkpoint of the network holds them, and loading them continues the
    masks where they were.

    Args:
        keep_prob (float): The probability of keeping a value, in (0, 1].
        seed (int): The op's seed, in [0, 2^63).
        name (str): The Parameters' name prefix (their names are ``{name}.seed`` and ``{name}.offset``).
        with_mask (bool): Return the mask too, as `ops.Dropout` does. Default: ``True``.

    Inputs:
        - **x** (Tensor) - float16, float32 or float64.

    Outputs:
        Tuple of 2 Tensors, the output and the mask (1 where kept), both of `x`'s shape and dtype; the output alone
        without `with_mask`.

    Supported Platforms:
        ``CPU`` (measured there; its uint64 graph ops were not tried on GPU or Ascend)

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> from ms_accum.core.dropout import SeededDropout
        >>> dropout = SeededDropout(0.7, seed=1234)
        >>> out, mask = dropout(Tensor(np.ones((2, 3), np.float32)))
        >>> int(dropout.offset.asnumpy())  # 6 values, 2 words
        2
    """

    def __init__(self, keep_prob: float, seed: int, name: str = "dropout", with_mask: bool = True) -> None:
        super().__init__(auto_prefix=False)
        self.keep_prob = float(keep_prob)
        self.with_mask = with_mask
        self.scale = 1.0 / self.keep_prob
        self.seed = Parameter(Tensor(int(seed), ms.int64), name=f"{name}.seed", requires_grad=False)
        self.offset = Parameter(Tensor(0, ms.int64), name=f"{name}.offset", requires_grad=False)
        for param in (self.seed, self.offset):
            setattr(param, _STATE_FLAG, True)
        self.golden = Tensor(np.array(_GOLDEN, np.uint64))
        self.mix = [Tensor(np.array(m, np.uint64)) for m in _MIX]
        self.shifts = [Tensor(np.array(s, np.uint64)) for s in _SHIFTS]
        # Multiplying a word by 2^(16 k) (mod 2^64) brings its k-th lane to the top: the product is at most `highest`
        # exactly when that lane is below keep_prob * 2^16 (the lanes under it add less than 2^48).
        self.lanes = [Tensor(np.array(1 << (_LANE_BITS * k), np.uint64)) for k in range(_LANES)]
        self.one = Tensor(np.array(1, np.uint64))
        threshold = min(max(round(self.keep_prob * (1 << _LANE_BITS)), 1), 1 << _LANE_BITS)
        self.highest = Tensor(np.array((threshold << (64 - _LANE_BITS)) - 1, np.uint64))
        self.right_shift = ops.RightShift()
        # MindSpore 2.10's CPU Mul and Add kernels keep memory of their own at every integer call site (about twice the
        # output's, never reused); MulNoNan and AddN wrap around alike and keep none (docs/mindspore.md, dropout's
        # kernel and its threads).
        self.mul, self.add = ops.MulNoNan(), ops.AddN()
        # Read and advanced once per call, even inside a recomputed Cell (`Cell.recompute`): the recomputed forward
        # then draws its mask again from the offset the forward read (a scalar kept), not from the advanced one.
        self.read = ops.Cast().recompute(False)
        self.advance = ops.AssignAdd().recompute(False)

    def construct(self, x):
        size = x.size
        words = (size + _LANES - 1) // _LANES
        offset = self.read(self.offset, ms.uint64)
        # SplitMix64's states after offset + 1, ..., offset + words steps, summed up from the first: Add, Mul and
        # `arange` would each keep memory of their own at every call site (docs/mindspore.md, dropout's kernel ...).
        start = ops.reshape(self.add((ops.cast(self.seed, ms.uint64), self.mul(offset + self.one, self.golden))), (1,))
        z = start if words == 1 else ops.cumsum(ops.concat((start, ops.broadcast_to(self.golden, (words - 1,)))), 0)
        z = self.mul(ops.bitwise_xor(z, self.right_shift(z, self.shifts[0])), self.mix[0])
        z = self.mul(ops.bitwise_xor(z, self.right_shift(z, self.shifts[1])), self.mix[1])
        z = ops.bitwise_xor(z, self.right_shift(z, self.shifts[2]))
        # Lane k of every word, then lane k + 1 of every word: blocks laid end to end (interleaving them costs more).
        keep = ops.concat([self.mul(z, lane) <= self.highest for lane in self.lanes], 0)
        if words * _LANES != size:
            keep = keep[:size]
        mask = ops.stop_gradient(ops.cast(ops.reshape(keep, x.shape), x.dtype))
        advanced = self.advance(self.offset, ops.cast(words, ms.int64))
        # One product with a constant factor: `x * mask * scale` would keep `x * mask` for the backward too.
        out = ops.depend(x * ops.stop_gradient(mask * ops.cast(self.scale, x.dtype)), advanced)
        if self.with_mask:
            return out, mask
        return out

    def extend_repr(self) -> str:
        return f"keep_prob={self.keep_prob}"


class _SeededDropoutLayer(nn.Dropout):
    """An `nn.Dropout` whose op is a `SeededDropout` returning the output alone: `nn.Dropout.construct` unpacks the op's
    (output, mask) and drops the mask, and MindSpore 2.10 warns at compile time when a result of a call with side
    effects is dropped (docs/mindspore.md, discarded results of functions with side effects)."""

    def construct(self, x):
        if not self.training or self.keep_prob == 1 or self.p == 0:
            return x
        return self.dropout(x)


def seed_dropout(network: nn.Cell) -> List[SeededDropout]:
    """
    Replaces every `ops.Dropout` primitive that a Cell of `network` holds (each `nn.Dropout`'s) by a `SeededDropout`
    seeded from the primitive's ``Seed0``/``Seed1``; returns every `SeededDropout` of `network`, those it already had
    included. Its Parameters are named after the Cell that holds it (``{cell}.{attribute}.seed``, ``.offset``). An
    `nn.Dropout` stays an `nn.Dropout` (its class becomes a subclass that calls the new op).

    `GradientAccumulation` and `TrainCachedWindowCell` call it on CPU when they are built, so that two runs with
    `mindspore.set_seed` draw the same masks and a resumed run continues them (docs/resume.md). Call it yourself for a
    network that the other Cells (`TrainAccumulationCell`, ...) or `nn.TrainOneStepCell` train. Build the network after
    `mindspore.set_seed`: its ops' seeds are given when they are built.

    Args:
        network (nn.Cell): The network; changed in place.

    Returns:
        list[SeededDropout], the network's, in the order `cells_and_names` visits them.
    """
    for path, cell in list(network.cells_and_names()):
        for attribute, prim in list(getattr(cell, "_primitives", {}).items()):
            if isinstance(prim, ops.Dropout):
                attrs = prim.attrs
                layer = type(cell) is nn.Dropout and attribute == "dropout"
                replacement = SeededDropout(attrs["keep_prob"], op_seed(int(attrs["Seed0"]), int(attrs["Seed1"])),
                                            f"{path}.{attribute}" if path else attribute, with_mask=not layer)
                del cell._primitives[attribute]  # pylint: disable=protected-access
                object.__delattr__(cell, attribute)
                cell.insert_child_to_cell(attribute, replacement)
                if layer:
                    cell.__class__ = _SeededDropoutLayer
    return seeded_ops(network)


def seed_dropout_on_cpu(network: nn.Cell) -> List[SeededDropout]:
    """`seed_dropout` when MindSpore runs on CPU, where its dropout kernel was measured to race and `SeededDropout` to
    run; elsewhere the network is left as it is (and `[]` returned). What `GradientAccumulation` and
    `TrainCachedWindowCell` call."""
    if ms.get_context("device_target") != "CPU":
        return []
    return seed_dropout(network)


def seeded_ops(network: nn.Cell) -> List[SeededDropout]:
    """Every `SeededDropout` of `network`, in the order `cells_and_names` visits them."""
    return [cell for _, cell in network.cells_and_names() if isinstance(cell, SeededDropout)]


def is_random_state(param: Parameter) -> bool:
    """Whether `param` is a `SeededDropout`'s seed or offset: training state, not a weight."""
    return bool(getattr(param, _STATE_FLAG, False))


class _Copy(nn.Cell):
    """Assigns, pair after pair, each Parameter of a pair's sources to its twin among its targets, in one graph."""

    def __init__(self, *pairs) -> None:
        super().__init__(auto_prefix=False)
        self.pairs = pairs

    def construct(self):
        done = True
        for sources, targets in self.pairs:
            for source, target in zip(sources, targets):
                done = ops.depend(done, ops.assign(target, ops.depend(source, done)))
        return done


class DrawMarks:
    """Where a network's `SeededDropout` ops are in their streams, marked and gone back to, so that a forward run again
    drops the same values: gradient caching runs each micro-batch's forward twice (`TrainCachedWindowCell`).

    `mark` notes the offsets before the first forward, `rewind` notes where it ended and sets them back, `restore`
    sets them to where the first forward ended: the second forward does not move them in PyNative mode (measured: its
    `GradOperation` drew the first forward's masks without advancing the offsets), and in graph mode ends there anyway.
    Each is a graph, launched in order with the graphs that draw, so nothing waits on the host; a network without
    `SeededDropout` ops launches nothing.

    Args:
        network (nn.Cell): The network, after `seed_dropout`.
    """

    def __init__(self, network: nn.Cell) -> None:
        offsets = [op.offset for op in seeded_ops(network)]
        self._mark = self._rewind = self._restore = None
        if offsets:
            offsets = ParameterTuple(offsets)
            start = offsets.clone(prefix="ms_accum_start", init="zeros")
            end = offsets.clone(prefix="ms_accum_end", init="zeros")
            self._mark = _Copy((offsets, start))
            self._rewind = _Copy((offsets, end), (start, offsets))
            self._restore = _Copy((end, offsets))

    def mark(self) -> None:
        """Notes every op's offset, before the first forward."""
        if self._mark is not None:
            self._mark()

    def rewind(self) -> None:
        """Notes where the first forward left the offsets and sets them back to the marked ones."""
        if self._rewind is not None:
            self._rewind()

    def restore(self) -> None:
        """Sets the offsets to where the first forward left them, after the second."""
        if self._restore is not None:
            self._restore()

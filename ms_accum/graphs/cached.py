"""Gradient caching (Gao et al. 2021, "GradCache"): exact windows for losses that couple the samples of a batch.

A contrastive loss (InfoNCE, CLIP's, supervised contrastive) compares every sample with every other one of its batch,
so K micro-batches accumulated one by one are not one K-times larger batch. A cached window is: pass 1 runs every
micro-batch's forward without a backward (no activations kept) and keeps its outputs (embeddings, small);
one small graph runs the loss on the window's concatenated outputs and its gradient with respect to them; pass 2 runs
each micro-batch's forward again with its backward, its slice of that gradient as the sensitivity, adding the parameter
gradients into the `AccumulationBuffer`. By the chain rule the buffer then holds the gradient of the one window loss,
so the buffer's ``"sum"`` rule (weight 1, divisor 1) makes the update that of one step on the concatenated batch, and
the window's check, step and clear are the executor's (guard, clipping, loss scaling, data parallel).

Memory: one micro-batch's activations, plus the window's inputs and outputs, plus the buffer. Time: two forwards and
one backward per micro-batch.
"""
from __future__ import annotations

import inspect
from typing import Iterable, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, nn, ops

from .._mindspore import RANDOM_SEED_ATTRS, prim_attrs, primitives, world_group
from .._validation import ArgumentTypeError, ArgumentValueError, check_isinstance, check_positive_float, door
from ..core.buffer import AccumulationBuffer
from ..core.dropout import DrawMarks, DropoutStreams, dropout_streams, seeded_layers
from ..core.guard import LossScaler
from ..core.inference import in_inference
from ..core.parallel import AllReduceSums, data_parallel_info
from .cells import TrainClear, _BufferCell, _CheckWindow, _StepWindow, own_buffer

CACHED_REDUCTION = "sum"  # the window's gradient is that of its one loss: weight 1 per micro-batch, divisor 1


def check_cached_options(reduction: str, policy: str, statistics: bool, noise_scale: bool, skip_outliers) -> str:
    """The buffer's reduction for a cached window, ``"sum"``, after refusing the options that cannot be exact.

    The user's ``"mean"`` (the default) and ``"sum"`` both mean "the window's loss is what `loss_fn` returns on the
    whole window"; the buffer must not divide it again."""
    if reduction == "weighted_mean":
        raise ArgumentValueError("{@reduction:subject} must be 'mean' or 'sum' with {structure=} (the window's one "
                                 "loss is its loss_fn's value on the whole window), but got 'weighted_mean'.",
                                 structure='cached')
    check_cached_policy(policy)
    if skip_outliers is not None:
        raise ArgumentValueError("{@skip_outliers:subject} must {_none} with {structure=}, but got {skip_outliers!r}: "
                                 "a micro-batch left out would still be in the loss that made the others' gradients, "
                                 "so the update would equal no large-batch step.", skip_outliers=skip_outliers,
                                 structure='cached')
    if statistics or noise_scale:
        raise ArgumentValueError("the arguments {@statistics} and {@noise_scale} must {_false} with {structure=}, but "
                                 "got {statistics=}, {noise_scale=}: a micro-batch's gradient here is its share of one "
                                 "window loss, not a gradient of a loss of its own, and its norm says nothing about "
                                 "the gradient noise.", statistics=statistics, noise_scale=noise_scale,
                                 structure='cached')
    return CACHED_REDUCTION


def check_cached_policy(policy: str) -> None:
    """Refuses ``"skip_microbatch"``, which no cached window can make exact."""
    if policy == "skip_microbatch":
        raise ArgumentValueError("{@policy:subject} must be 'skip_window' with {structure=}, but got "
                                 "'skip_microbatch': every micro-batch's gradient is its share of the one window "
                                 "loss, in which its samples are the other samples' negatives, so no update without "
                                 "it equals a step on the remaining batch.", structure='cached')


def check_loss_signature(loss_fn: nn.Cell) -> None:
    """Refuses a loss that cannot be called as ``loss_fn(outputs, labels)``, before anything compiles."""
    try:
        inspect.signature(loss_fn.construct).bind(None, None)
    except (TypeError, ValueError):
        raise ArgumentTypeError("{@loss_fn:subject} must take (outputs of the whole window, labels of the whole "
                                "window) with {structure=}, but its construct is {name}{value}.",
                                name=type(loss_fn).__name__, value=inspect.signature(loss_fn.construct),
                                structure='cached') from None


def check_same_masks(network: nn.Cell) -> None:
    """Refuses a network whose random ops would draw other values in pass 2 than in pass 1.

    On CPU `nn.Dropout` is not one of them: `TrainCachedWindowCell` draws its masks through ms_accum's dropout streams
    (`ms_accum.core.dropout`) and sets them back between the passes. Another random primitive (`ops.StandardNormal`,
    `ops.UniformReal`, `ops.Dropout` elsewhere) keeps its state in its kernel: in graph mode each call site in a
    compiled graph is a kernel of its own, seeded from the op's seeds, and the pass-1 and pass-2 branches of
    `_CachedPass` call theirs once per micro-batch in the same order, so seeded kernels draw the same values in both.
    Unseeded kernels, and PyNative (one kernel shared by both passes), draw other values."""
    seeded = seeded_layers(network)
    random_ops = [(name or type(cell).__name__, type(prim).__name__, [prim_attrs(prim)[a] for a in pair])
                  for name, cell in network.cells_and_names()
                  for prim in primitives(cell).values() if not any(prim is drawn for drawn in seeded)
                  for pair in RANDOM_SEED_ATTRS if all(a in prim_attrs(prim) for a in pair)]
    if not random_ops:
        return
    where, kind, _ = random_ops[0]
    if ms.get_context("mode") != ms.GRAPH_MODE:
        raise ArgumentValueError("{@network:subject} must have no random ops drawing in their kernels in PyNative mode "
                                 "with {structure=}, but its cell '{where}' has a {kind}: both passes would share its "
                                 "kernel and draw other values. Use graph mode (with seeded ops), or drop the op.",
                                 where=where, kind=kind, structure='cached')
    unseeded = [(name, kind) for name, kind, seeds in random_ops if not any(seeds)]
    if unseeded:
        raise ArgumentValueError("{@network:subject} must have seeded random ops with {structure=}, but its cell "
                                 "'{cell}' has an unseeded {op}: pass 2 would draw other values than pass 1. Give the "
                                 "op its seeds.", cell=unseeded[0][0], op=unseeded[0][1], structure='cached')


class _CachedLossGrad(nn.Cell):
    """The window's loss on its concatenated outputs (all ranks' in data parallel) and the gradient with respect to
    them, scaled by the loss scale (and by what the buffer's reducer will divide by), in one small graph.

    The outputs are a tuple of fields (the network's output, or its one Tensor); `single` says whether the loss takes
    the one field itself. In data parallel the fields and labels are all-gathered, as CLIP gathers its embeddings, and
    the gradient is of the gathered outputs: each rank takes its rows on the host. No gradient flows back through the
    gather (its backward would be a reduce-scatter summing the ranks' identical copies)."""

    def __init__(self, loss_fn: nn.Cell, buffer: AccumulationBuffer, single: bool) -> None:
        super().__init__(auto_prefix=False)
        self.loss_fn = loss_fn
        self.single = single
        self.scaling = buffer.guard.scaling
        self.loss_scale = buffer.guard.loss_scale  # a Parameter read by the graph, registered for it
        # The "sum" rule divides the window by the reducer's divisor (the group size under gradients_mean): the
        # sensitivity carries it, so the applied gradient is that of the one loss (exact for a power of two).
        self.divisor = float(buffer.reducer.sum_divisor)
        self.gathered = isinstance(buffer.reducer, AllReduceSums)
        if self.gathered:
            self.all_gather = ops.AllGather(world_group())
        self.grad = ops.GradOperation(get_all=True, sens_param=True)

    def _loss(self, labels, *fields):
        if self.single:
            return self.loss_fn(fields[0], labels)
        return self.loss_fn(fields, labels)

    def construct(self, labels, *fields):
        # The fields are positional inputs, not one tuple: GradOperation differentiates positional Tensors.
        if self.gathered:
            fields = tuple([self.all_gather(field) for field in fields])
            labels = self.all_gather(labels)
        loss = self._loss(labels, *fields)
        sens = ops.fill(ops.dtype(loss), ops.shape(loss), 1.0) * ops.cast(self.scaling.sens(self.divisor),
                                                                          ops.dtype(loss))
        grads = self.grad(self._loss)(labels, *fields, sens)
        return loss, grads[1:]


class _CachedPass(_BufferCell):
    """Both passes of one micro-batch in one graph, chosen by a tensor flag: pass 1 (`backward` False) returns the
    network's outputs and runs no backward, so it keeps no activations; pass 2 runs the forward and the backward with
    its slice of the cached output gradient `sens` as the sensitivity, adding the parameter gradients into the buffer
    (weight 1: the ``"sum"`` rule).

    One graph, not two: on CPU a graph keeps the activation memory it planned, and a second graph of the network would
    keep its own (docs/mindspore.md, each graph's memory; measured for this Cell in docs/cached.md).
    Each branch calls the network's random primitives through its own kernels, which `check_same_masks` relies on;
    its `nn.Dropout` cells draw from the streams that `TrainCachedWindowCell` sets back before pass 2."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, buffer: AccumulationBuffer) -> None:
        super().__init__(buffer)
        self.network = network
        self.network.set_grad()
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, backward, *inputs):
        data, sens, loss = inputs[:-2], inputs[-2], inputs[-1]
        if backward:
            grads = self.grad(self.network, self.weights)(*data, sens)
            # The window's loss goes to the guard with every micro-batch: a non-finite loss marks the window.
            out = ops.depend(sens, self.buffer.add(loss, grads, 1.0))
        else:
            out = self.network(*data)
        return out


class TrainCachedWindowCell(nn.Cell):
    r"""
    One window of gradient caching (Gao et al. 2021): the update of one step on the window's concatenated
    micro-batches with a loss that couples them (in-batch negatives), in the memory of one micro-batch.

    Pass 1 runs each micro-batch's forward without a backward and keeps its outputs; the loss runs once, on the
    outputs concatenated along the batch axis (all ranks' in data parallel), with its gradient with respect to them;
    pass 2 runs each micro-batch's forward and backward with its slice of that gradient, adding into the buffer. The
    window is then checked (non-finite guard, loss scale, clipping, one all-reduce in data parallel) and the optimizer
    steps, or it is cleared, as the executor's other structures close theirs. A call is a few graph launches from the
    host, not one graph: one graph would keep every micro-batch's activations (docs/mindspore.md).

    On CPU its `nn.Dropout` cells draw from ms_accum's dropout streams (`ms_accum.core.dropout.DropoutStreams`) while
    a window trains, set back before pass 2: both passes drop the same values, in graph and PyNative mode. Other random
    primitives need seeds and graph mode (`check_same_masks`).

    Args:
        network (nn.Cell): Maps one micro-batch's data to its outputs (a Tensor or a tuple of Tensors, each with the
            micro-batch's batch axis first), e.g. embeddings.
        loss_fn (nn.Cell): ``loss_fn(outputs, labels)`` of the whole window, a scalar: the outputs concatenated
            along the batch axis (the same tuple structure as the network's), the labels likewise.
        optimizer (nn.Optimizer): The optimizer over `network`'s parameters.
        clip_norm (float, optional): Clip the window's gradient to this global norm. Default: ``None``.
        buffer (AccumulationBuffer, optional): The window's state, with ``reduction="sum"``; a new one by default.
        policy (str): Only ``"skip_window"`` (default): see `check_cached_options`.
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler, when the
            buffer is new. Default: ``None``.
        dropout (DropoutStreams, optional): The network's dropout streams, when a training state saves them
            (`GradientAccumulation` passes its own); new ones by default.

    Inputs:
        - **\*inputs** (Tensor) - The window: every input of the network, then the labels, each stacked on a leading
          axis of K micro-batches, :math:`(K, B, ...)`. `train_window` takes the micro-batches one by one instead.

    Outputs:
        Tensor, the window's loss (of all ranks' outputs in data parallel).

    Raises:
        TypeError: If an argument has the wrong type, or `loss_fn` does not take ``(outputs, labels)``.
        ValueError: If `buffer` does not fit the optimizer or its reduction is not ``"sum"``, `policy` is not
            ``"skip_window"``, the network has random primitives drawing in their kernels that are unseeded, or any
            in PyNative mode; at the first call, before anything compiles, if an output's batch axis is not the
            micro-batch's or the loss is not a scalar.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor, nn, ops
        >>> from ms_accum import TrainCachedWindowCell
        >>> class InfoNCE(nn.Cell):
        ...     def construct(self, emb, labels):
        ...         q, d = emb[:, 0], emb[:, 1]
        ...         logits = ops.matmul(q, d.T) / 0.1
        ...         return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")(
        ...             logits, ops.arange(q.shape[0]).astype(labels.dtype))
        >>> net = nn.Dense(8, 4)   # (B, 2, 8) -> (B, 2, 4): a shared tower for queries and documents
        >>> cell = TrainCachedWindowCell(net, InfoNCE(), nn.SGD(net.trainable_params(), 0.1))
        >>> # loss = cell(Tensor(np.zeros((4, 16, 2, 8), np.float32)), Tensor(np.zeros((4, 16), np.int32)))
    """

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer, clip_norm: Optional[float] = None,
                 buffer: Optional[AccumulationBuffer] = None, policy: str = "skip_window",
                 loss_scaler: Optional[LossScaler] = None, dropout: Optional[DropoutStreams] = None) -> None:
        super().__init__(auto_prefix=False)
        with door("TrainCachedWindowCell"):
            self.network = check_isinstance(network, "network", nn.Cell)
            self.loss_fn = check_isinstance(loss_fn, "loss_fn", nn.Cell)
            check_loss_signature(loss_fn)
            clip_norm = check_positive_float(clip_norm, "clip_norm", allow_none=True)
            if buffer is None:
                check_cached_policy(policy)
            buffer = own_buffer(network, optimizer, buffer, policy, loss_scaler, CACHED_REDUCTION if buffer is None
                                else None)
            if buffer.reduction.name != CACHED_REDUCTION or buffer.leaves_out or buffer.statistics.parameters():
                raise ArgumentValueError("{@buffer:subject} must have reduction 'sum', no micro-batch left out and no "
                                         "statistics (the window's gradient is that of its one loss), but got "
                                         "reduction '{name}'.", name=buffer.reduction.name)
            # Both passes of a micro-batch then drop the same values, in either mode.
            dropout = dropout_streams(network) if dropout is None else check_isinstance(dropout, "dropout",
                                                                                         DropoutStreams)
            check_same_masks(network)
        self.buffer = buffer
        self.parallel = data_parallel_info()
        self.optimizer = optimizer
        self.passes = _CachedPass(network, optimizer, buffer)
        self.check = _CheckWindow(buffer, clip_norm)
        self.step = _StepWindow(optimizer, buffer)
        self.clear = TrainClear(buffer)
        self._loss_grads = {}  # single output field or not -> the loss graph; decided by the first window's outputs
        self.checked = False
        self.fields = []  # each output field's (shape after the batch axis, dtype), from the first micro-batch
        self.tuple_output = False
        self._zeros = {}  # micro-batch size -> pass 1's placeholders
        self._pass1, self._pass2 = Tensor(False), Tensor(True)
        self.dropout = dropout
        self.draws = DrawMarks(dropout)  # pass 2 draws the masks pass 1 drew, and the next window goes on

    def set_train(self, mode: bool = True):
        super().set_train(mode)
        for cell in (self.passes, self.check, self.step, self.clear, *self._loss_grads.values()):
            cell.set_train(mode)
        return self

    def check_micro_batch(self, inputs: Sequence[Tensor]) -> None:
        """Before anything compiles: one eager pass, in inference mode, of the network on the first two samples of
        the micro-batch `inputs` (its data, then its labels) and of the loss on their outputs. Refuses outputs whose
        batch axis is not the micro-batch's and a loss that is not a scalar.

        Two samples, not the micro-batch: PyNative keeps the memory its pass took (docs/mindspore.md, an eager
        pass's memory)."""
        if self.checked:
            return
        mode = ms.get_context("mode")
        inputs = [x[:2].copy() if isinstance(x, Tensor) and x.ndim else x for x in inputs]
        with in_inference(self.network) as hold:
            hold()
            ms.set_context(mode=ms.PYNATIVE_MODE)
            try:
                out = self.network(*inputs[:-1])
                self.tuple_output = isinstance(out, (tuple, list))
                fields = out if self.tuple_output else (out,)
                batch = inputs[0].shape[0]
                shapes = [tuple(f.shape) if isinstance(f, Tensor) else type(f).__name__ for f in fields]
                if not all(isinstance(f, Tensor) and f.ndim >= 1 and f.shape[0] == batch for f in fields):
                    raise ArgumentValueError("{@network:subject} must return Tensors whose first axis is its input's "
                                             "batch axis with {structure=}, so the window's outputs concatenate along "
                                             "it, but for {batch} samples it returned {shapes}.", batch=batch,
                                             shapes=shapes, structure='cached')
                loss = self.loss_fn(out, inputs[-1])
            finally:
                ms.set_context(mode=mode)
        if not isinstance(loss, Tensor) or loss.ndim != 0 and loss.size != 1:
            got = f"a Tensor of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
            raise ArgumentValueError("{@loss_fn:subject} must return a scalar loss of the window's outputs with "
                                     "{structure=}, but for {value} samples it returned {got}.",
                                     value=inputs[0].shape[0], got=got, structure='cached')
        self.fields = [(tuple(f.shape[1:]), f.dtype) for f in fields]  # pass 1's placeholders for `sens`
        self.checked = True

    def __call__(self, *inputs):
        if not inputs:
            with door(type(self).__name__):
                raise ArgumentTypeError("the inputs must be the window's data and labels, stacked on a leading axis of "
                                        "micro-batches, but got none.")
        count = inputs[0].shape[0]
        # Copies, not views of the stacked window (see `train_window`).
        return self.train_window([tuple(x[i].copy() for x in inputs) for i in range(count)])[0]

    def train_window(self, window: Iterable[Sequence[Tensor]]) -> Tuple[Tensor, bool]:
        """Trains one window of micro-batches, each the tuple ``(*data, labels)``; returns `(its loss, whether the
        optimizer stepped)`."""
        loss = self.accumulate_window(window)
        applied = bool(self.check().asnumpy())
        (self.step if applied else self.clear)()
        return loss, applied

    def accumulate_window(self, window: Iterable[Sequence[Tensor]]) -> Tensor:
        """Both passes over one window of micro-batches, each the tuple ``(*data, labels)``, into the buffer, which
        is left to be closed; returns the window's loss.

        The window's inputs are held until pass 2 has run them again (their memory, not their activations')."""
        with self.dropout.drawing():
            return self._both_passes(window)

    def _both_passes(self, window: Iterable[Sequence[Tensor]]) -> Tensor:
        micro_batches: List[Sequence[Tensor]] = []
        outputs = []
        self.draws.mark()
        for inputs in window:
            self.check_micro_batch(inputs)
            micro_batches.append(inputs)
            outputs.append(self.passes(self._pass1, *inputs[:-1], *self._placeholders(inputs[0].shape[0])))
        if not micro_batches:
            raise ArgumentValueError("the window must hold at least one micro-batch, but got none.")
        single = not self.tuple_output
        fields = tuple(ops.concat([out if single else out[i] for out in outputs]) for i in range(len(self.fields)))
        labels = ops.concat([inputs[-1] for inputs in micro_batches])
        loss, grads = self._loss_grad(single)(labels, *fields)
        loss32 = ops.cast(loss, ms.float32)  # the placeholder's dtype: one graph for both passes
        # This rank's rows of the (gathered) window: ranks hold equal windows, in rank order.
        offset = 0 if self.parallel is None else self.parallel.rank * fields[0].shape[0]
        self.draws.rewind()
        for inputs in micro_batches:  # pass 2
            size = inputs[0].shape[0]
            # A copy, not a view: MindSpore 2.10 reads a view passed into this graph (it has control flow) from its
            # storage's start, whatever its offset (measured: every micro-batch but the first got the first's rows).
            sens = tuple(g[offset:offset + size].copy() for g in grads)
            # A tuple argument of Tensors is a graph constant unless mutable: each window would compile anew.
            self.passes(self._pass2, *inputs[:-1], sens[0] if single else ms.mutable(sens), loss32)
            offset += size
        self.draws.restore()
        return loss

    def _placeholders(self, size: int) -> Tuple[Tensor, Tensor]:
        """Pass 1's `sens` and `loss` arguments, which it does not read: zeros of the outputs' shapes, made once per
        micro-batch size."""
        if size not in self._zeros:
            zeros = tuple(ops.zeros((size, *shape), dtype) for shape, dtype in self.fields)
            sens = ms.mutable(zeros) if self.tuple_output else zeros[0]
            self._zeros[size] = (sens, Tensor(0.0, ms.float32))
        return self._zeros[size]

    def _loss_grad(self, single: bool) -> nn.Cell:
        if single not in self._loss_grads:
            self._loss_grads[single] = _CachedLossGrad(self.loss_fn, self.buffer, single).set_train(self.training)
        return self._loss_grads[single]

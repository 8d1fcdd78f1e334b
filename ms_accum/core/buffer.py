"""The window: its named state, its reduction, and the rules every graph applies to it (add, check, step, clear)."""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, ops
from mindspore.common.initializer import initializer

from . import _ops
from .._choices import OUTLIER_WARMUP, REDUCTIONS
from .._validation import Argument, ArgumentTypeError, check_isinstance, check_value_in, door
from .guard import LossScaler, WindowGuard
from .parallel import CountSums, sums_reducer
from .statistics import NoStatistics, OutlierFilter, Statistics, check_outliers

HALF = (ms.float16, ms.bfloat16)


def _scalar_sens(out, scale):
    # A constant `scale` (a sample count, no loss scaler) makes a constant sensitivity: nothing runs for it.
    return ops.fill(ops.dtype(out), ops.shape(out), scale)


@ms.jit_class
class Reduction:
    """
    How a window combines its micro-batches: the protocol every ``reduction`` rule implements.

    A rule answers, in the graph, what a micro-batch weighs and what the window is divided by, and on the host, how
    the executor reads the micro-batches' losses back. The defaults are those of a network whose output is its scalar
    loss; a rule overrides what differs. The rule is chosen once, when the `AccumulationBuffer` is built, never by a
    flag in the graph (docs/mindspore.md, a constant if/else).

    Attributes:
        name (str): The ``reduction`` argument that names the rule.
    """

    name = ""

    def weight(self, samples):
        """What a micro-batch of `samples` samples weighs (the backward pass's sensitivity in the Cells)."""
        raise NotImplementedError

    def given_weight(self, num_samples):
        """What a micro-batch weighs when its caller gives `num_samples` (the Accumulator's input; None: nothing
        given, the micro-batch is accumulated unweighted and counts 1)."""
        return num_samples

    def split(self, out, batch):
        """`(loss, weight)` of a micro-batch from the network's output and its first input."""
        return out, self.weight(ops.shape(batch)[0])

    def sens(self, out, scale):
        """The backward pass's sensitivity for the network's output: `scale` for the loss."""
        return _scalar_sens(out, scale)

    def divisor(self, samples, sum_divisor):
        """What the window's sum is divided by, given the weights it holds (all ranks') and the ranks' divisor for
        sums (1, or the group size)."""
        return samples

    def window_output(self, losses, weights):
        """What `TrainWindowCell` returns from its micro-batches' losses and weights, both of shape (K,)."""
        return losses

    def loss_weights(self, outputs, samples):
        """Host side: `(loss, weight)` of each micro-batch from the outputs of its graph calls and its sample
        count; the logged window loss is the weighted mean."""
        return list(zip(outputs, samples))

    def unstack(self, output):
        """Host side: `TrainWindowCell`'s output split into one output per micro-batch."""
        return list(output.asnumpy())


@ms.jit_class
class SampleMean(Reduction):
    """``reduction="mean"``: a micro-batch weighs its samples; the window is divided by the samples it holds."""

    name = "mean"

    def weight(self, samples):
        return samples


@ms.jit_class
class Sum(Reduction):
    """``reduction="sum"``: a micro-batch weighs 1; the window is divided by `sum_divisor` (1, or the ranks)."""

    name = "sum"

    def weight(self, samples):
        return 1.0

    def given_weight(self, num_samples):
        return None  # a sample count changes nothing here

    def divisor(self, samples, sum_divisor):
        return sum_divisor


@ms.jit_class
class WeightedMean(Reduction):
    """``reduction="weighted_mean"``: the network with its loss returns `(loss, weight)`, the loss a mean over `weight`
    items (the micro-batch's non-padding tokens, say); the window is divided by the weights it holds, so it is the
    mean over all its items, however they are spread over micro-batches (and ranks). The Accumulator, which sees no
    network, weighs a micro-batch by the `num_samples` given (its token count)."""

    name = "weighted_mean"

    def split(self, out, batch):
        return out[0], ops.cast(out[1], ms.float32)

    def sens(self, out, scale):
        return _scalar_sens(out[0], scale), ops.zeros_like(out[1])

    def window_output(self, losses, weights):
        return losses, weights

    def loss_weights(self, outputs, samples):
        return list(outputs)

    def unstack(self, output):
        return list(zip(output[0].asnumpy(), output[1].asnumpy()))


RULES = {"mean": SampleMean, "sum": Sum, "weighted_mean": WeightedMean}


@ms.jit_class
class _SameDtype:
    """The buffer has the parameters' dtypes: the window's gradient goes to the optimizer as it is."""

    def __call__(self, grads):
        return grads


@ms.jit_class
class _ToParamDtype:
    """A float32 buffer for half-precision parameters: the window is cast to their dtypes for the optimizer."""

    def __init__(self, params) -> None:
        self.params = params

    def __call__(self, grads):
        return _ops.cast_like(grads, self.params)


def check_buffer_dtype(dtype, arg_name: str) -> None:
    """Refuses a buffer dtype that is not a float `mindspore.dtype` (or None)."""
    if dtype is not None and dtype not in (ms.float16, ms.bfloat16, ms.float32, ms.float64):
        raise ArgumentTypeError("{arg_name:subject} must be a float mindspore.dtype (mindspore.float32, "
                                "float16, bfloat16 or float64) or None, but got {dtype!r}.",
                                arg_name=Argument(arg_name), dtype=dtype)


def _buffer_dtype(param_dtype, dtype):
    return (ms.float32 if param_dtype in HALF else param_dtype) if dtype is None else dtype


@ms.jit_class
class AccumulationBuffer:
    r"""
    One accumulation window: a zero-initialised gradient buffer per parameter, two counters, the `WindowGuard`,
    and the reduction. Every Cell and the `Accumulator` go through its rules, written once here:

    - `add` — one micro-batch: the guard's policy, then its gradient and weight into the window;
    - `check` — the window, in place: reduce (all ranks in data parallel), divide, unscale, clip, and the guard's
      verdict; then `step` (the optimizer, and zero the window) or `clear` (zero it, whatever it holds);
    - `close` is `check` then `step` or `clear` in one graph; `apply` is `check` then the optimizer alone.

    Cells built on one buffer share its Parameters, so they can be mixed freely, and its reduction decides for all
    of them. Its memory is that of the trainable parameters plus a few scalars (no all-zeros copy).

    Args:
        params (Union[ParameterTuple, list[Parameter]]): The parameters to accumulate gradients for,
            usually `optimizer.parameters`.
        prefix (str): Name prefix of the state's Parameters. Default: ``"accumulate"``.
        policy (str): What a non-finite micro-batch does to its window: ``"skip_window"`` (default) or
            ``"skip_microbatch"`` (see `ms_accum.core.guard`).
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler for
            the backward passes. Default: ``None``.
        reduction (str): ``"mean"`` (default): each micro-batch weighs its samples and the window is divided by the
            samples it holds, so an update equals one step on the concatenated batch; ``"sum"``: the plain sum;
            ``"weighted_mean"``: the network with its loss returns ``(loss, weight)`` and micro-batches weigh
            `weight` (e.g. their non-padding tokens: see `ms_accum.TokenCrossEntropy`).
        dtype (mindspore.dtype, optional): The buffer's dtype. Default: ``None``, float32 for float16 and bfloat16
            parameters (their window is summed in float32 and cast back for the optimizer), else the parameter's.
        statistics (bool): Measure each micro-batch's and each window's gradient norm (`ms_accum.core.statistics`):
            the Cells then return ``(output, [squared norm, left out])``. Default: ``False``.
        skip_outliers (float, optional): Leave out a micro-batch whose loss or gradient norm lies beyond this many
            standard deviations of the running statistics (`ms_accum.core.statistics.OutlierFilter`; implies
            `statistics`). Default: ``None``.
        outlier_warmup (int): Micro-batches taken into the running statistics before any is judged (at least 8).
            Default: ``100``.
        reduce_on_host (bool): In data parallel, the buffer is all-reduced from the host in buckets before the
            window's `check` (`ms_accum.core.parallel.InPlaceAllReduce`, as the executor does), so graphs sum only the
            counts (`CountSums`): a bucket's reduced copy is alive at a time instead of the whole buffer's.
            Default: ``False``, `check` all-reduces the buffer in its graph.

    Attributes:
        grad_sum (ParameterTuple): The buffers, named ``<prefix>.<parameter name>``.
        micro_batch_count (Parameter): int32, micro-batches in the open window (not optimizer steps); saved as
            ``<prefix>.mini_step``, the name of MindSpore's gradient-accumulation page.
        mini_step (Parameter): `micro_batch_count` under that page's name.
        num_samples (Parameter): float32, the sum of their weights, the divisor of the mean.
        guard (WindowGuard): The non-finite check and loss scale.
        reduction (Reduction): The rule `reduction` names (`SampleMean`, `Sum` or `WeightedMean`): what a
            micro-batch weighs and what the window is divided by.
        reducer (Union[LocalSums, AllReduceSums, CountSums]): The window's communication, chosen from MindSpore's
            parallel mode when the buffer is built.
        reduced_on_host (bool): Whether the buffer is all-reduced from the host before `check` (data parallel with
            `reduce_on_host`).
        statistics (Union[NoStatistics, Statistics, OutlierFilter]): What each micro-batch's graph measures of its
            gradient (`ms_accum.core.statistics`), chosen from `statistics` and `skip_outliers`.
        leaves_out (bool): Whether a micro-batch may be left out of its window (``"skip_microbatch"`` or
            `skip_outliers`): its gradient is then added behind a tensor `if` on its weight.

    Raises:
        TypeError: If `params` is not a sequence of Parameters, or `loss_scaler` is not a MindSpore loss scaler.
        ValueError: If `policy` or `reduction` is unknown, or MindSpore's parallel mode is neither stand-alone nor
            data parallel.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import AccumulationBuffer
        >>> net = nn.Dense(3, 2)
        >>> buffer = AccumulationBuffer(net.trainable_params())
        >>> [p.name for p in buffer.parameters()][:4]
        ['accumulate.weight', 'accumulate.bias', 'accumulate.mini_step', 'accumulate.num_samples']
    """

    @door("AccumulationBuffer")
    def __init__(self, params, prefix: str = "accumulate", policy: str = "skip_window",
                 loss_scaler: Optional[LossScaler] = None, reduction: str = "mean", dtype=None,
                 statistics: bool = False, skip_outliers: Optional[float] = None,
                 outlier_warmup: int = OUTLIER_WARMUP, reduce_on_host: bool = False) -> None:
        check_isinstance(params, "params", (ParameterTuple, list, tuple))
        if not params or not all(isinstance(p, Parameter) for p in params):
            raise ArgumentTypeError("{@params:subject} must be a non-empty sequence of Parameters, but got {params!r}.",
                                    params=params)
        self.reduction = RULES[check_value_in(reduction, "reduction", REDUCTIONS)]()
        check_buffer_dtype(dtype, "dtype")
        self.reducer = sums_reducer(check_isinstance(reduce_on_host, "reduce_on_host", bool))
        self.reduced_on_host = isinstance(self.reducer, CountSums)
        self.grad_sum = ParameterTuple([
            Parameter(initializer("zeros", p.shape, _buffer_dtype(p.dtype, dtype)), name=f"{prefix}.{p.name}")
            for p in params])
        self.to_params = self.dtypes_of(range(len(params)), params)
        # The micro-batches of the open window, never the optimizer's steps; its Parameter keeps the page's name
        # ("mini_step"), which checkpoints hold.
        self.micro_batch_count = Parameter(Tensor(0, ms.int32), name=f"{prefix}.mini_step", requires_grad=False)
        self.mini_step = self.micro_batch_count  # the public name of MindSpore's page, kept
        self.num_samples = Parameter(Tensor(0.0, ms.float32), name=f"{prefix}.num_samples", requires_grad=False)
        check_isinstance(statistics, "statistics", bool)
        check_outliers(skip_outliers, outlier_warmup)
        measured = statistics or skip_outliers is not None
        self.guard = WindowGuard(policy, loss_scaler, prefix, [b.dtype for b in self.grad_sum], measured)
        self.in_place = _ops.in_place_arithmetic()  # the mode when the buffer is built
        if skip_outliers is not None:
            self.statistics = OutlierFilter(float(skip_outliers), outlier_warmup, self.guard.skipped_micro_batches,
                                            prefix)
        else:
            self.statistics = Statistics(prefix) if statistics else NoStatistics()
        self.leaves_out = policy == "skip_microbatch" or skip_outliers is not None
        # Chosen here, not by a flag in the graph (docs/mindspore.md, a constant if/else).
        self.adds = _ops.accumulate_unless_left_out if self.leaves_out else _ops.accumulate

    def dtypes_of(self, indices, params):
        """What casts the buffer's tensors at `indices` to the dtypes of `params` (theirs), for the optimizer."""
        differs = any(self.grad_sum[i].dtype != p.dtype for i, p in zip(indices, params))
        return _ToParamDtype(ParameterTuple(params)) if differs else _SameDtype()

    def parameters(self) -> list:
        """All Parameters of the window's state: the gradient buffers, the two counters, the guard's, then the running
        statistics of an outlier filter."""
        return [*self.grad_sum, self.micro_batch_count, self.num_samples, *self.guard.parameters(),
                *self.statistics.state()]

    def __len__(self) -> int:
        return len(self.grad_sum)

    def add(self, loss, grads, weight):
        """Adds one micro-batch whose `grads` already carry its `weight`; returns the micro-batches in the window.

        The guard's policy decides first: a non-finite micro-batch is counted, and left out under ``"skip_microbatch"``.
        """
        grads, weight = self.guard.micro_batch(loss, grads, self.in_place.weight(weight))
        return self.adds(self.grad_sum, self.micro_batch_count, self.num_samples, grads, weight)

    def _window(self, clip_norm):
        """The window's gradient, made ready in the buffer, and whether the guard lets it be applied."""
        grad_sum, samples = self.reducer(self.grad_sum, self.num_samples)
        divisor = self.reduction.divisor(samples, self.reducer.sum_divisor)
        # A tensor divisor: an in-place multiplication by a Python constant leaves MindSpore 2.10 unable to infer the
        # buffer's type (the "sum" rule's divisor is one).
        grads, sq_norm = _ops.window_grads(grad_sum, ops.cast(self.guard.scaling.unscale(divisor), ms.float32),
                                           clip_norm, self.statistics)
        grads = self.in_place(self.grad_sum, grads)
        return grads, self.guard.close(grads, self.reducer, self.micro_batch_count, sq_norm)

    def check(self, clip_norm):
        """Makes the window's gradient ready in the buffer and judges it; returns whether it may be applied.

        In place: the buffer is reduced over the ranks, divided, unscaled and clipped, and the guard adjusts the loss
        scale and counts a skip. Then exactly one of `step` (if True) or `clear` must follow, before the next
        micro-batch: the executor's three graphs choose between them on the host, so no graph holds a tensor `if`
        (docs/structures.md)."""
        grads, applied = self._window(clip_norm)
        # The verdict waits for the in-place writes: no output would need them otherwise (the guard judges the norm
        # clipping measured, not the buffer), and the graph would leave the clipping out.
        return ops.depend(applied, grads)

    def step(self, optimizer):
        """Steps `optimizer` on the gradient `check` left in the buffer and closes the window; returns the
        micro-batch count (0)."""
        self._step(optimizer, self.grad_sum)
        return self._closed()

    def step_part(self, optimizer, grads, others):
        """`step` for a rank that owns part of the parameters (`ms_accum.train.sharding`): `optimizer`, built over
        them, steps on `grads`, their part of the window as `check` left it; the parameters it does not own, `others`,
        are zeroed for the gather (each then all-reduced to its owner's value: x + 0 = x, exactly), and the window is
        closed."""
        optimizer(grads)
        _ops.zero_finite(others)
        _ops.zero_finite(self.grad_sum)
        return self._closed()

    def _step(self, optimizer, grads):
        # An applied window is finite, so subtracting the buffer from itself zeroes it with no temporary.
        optimizer(self.to_params(grads))
        _ops.zero_finite(self.grad_sum)

    def _closed(self):
        """Zeroes the window's counters: it is closed. Returns the micro-batch count (0), the Parameter read after its
        write (docs/mindspore.md, Assign's return value)."""
        _ops.zero_counters((self.micro_batch_count, self.num_samples, self.guard.window_bad))
        return self.micro_batch_count

    def apply(self, optimizer, clip_norm):
        """`check`, and `optimizer` on the window if it may be applied; the window stays open until `clear`.

        Returns whether the optimizer ran."""
        grads, applied = self._window(clip_norm)
        if applied:
            optimizer(self.to_params(grads))
        return applied

    def clear(self):
        """Zeroes the buffer, whatever it holds, the counters and the guard's open-window count; returns the
        micro-batch count (0)."""
        return _ops.clear_window(self.grad_sum, self.micro_batch_count, (self.num_samples, self.guard.window_bad))

    def close(self, optimizer, clip_norm):
        """`check`, then `step` or `clear`, in one graph: returns whether the optimizer ran.

        The guard's verdict also says how to zero the buffer (an applied window is finite), so closing in a graph
        needs one tensor `if`, not two."""
        grads, applied = self._window(clip_norm)
        if applied:
            self._step(optimizer, grads)
        else:
            _ops.zero_any(self.grad_sum)
        self._closed()
        return applied

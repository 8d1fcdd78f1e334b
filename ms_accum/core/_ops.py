"""Per-parameter graph math of the window (`AccumulationBuffer` calls it).

Each operation is a module-level `MultitypeFuncGraph` mapped over the parameters with `HyperMap`, the way
MindSpore's own `nn/wrap` code does it, registered for dense `Tensor` and sparse `RowTensor` gradients.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, ops

_hyper_map = ops.HyperMap()
# In the backward's order, last layer first, as MindSpore's optimizers map: each gradient is added and freed as soon
# as it is made; mapped forward, every gradient waited for the first layer's (docs/mindspore.md, gradients in the
# backward's order).
_reverse_map = ops.HyperMap(reverse=True)

_accumulate_op = ops.MultitypeFuncGraph("ms_accum_accumulate")
_weigh_op = ops.MultitypeFuncGraph("ms_accum_weigh")
_cast_like_op = ops.MultitypeFuncGraph("ms_accum_cast_like")
_scale_in_place_op = ops.MultitypeFuncGraph("ms_accum_scale_in_place")
_clear_op = ops.MultitypeFuncGraph("ms_accum_clear")
_zero_in_place_op = ops.MultitypeFuncGraph("ms_accum_zero_in_place")
_finite_probe_op = ops.MultitypeFuncGraph("ms_accum_finite_probe")
_half_sum_of_squares_op = ops.MultitypeFuncGraph("ms_accum_half_sum_of_squares")
_clip_in_place_op = ops.MultitypeFuncGraph("ms_accum_clip_in_place")
_assign_op = ops.MultitypeFuncGraph("ms_accum_assign")
_dense_shape_op = ops.MultitypeFuncGraph("ms_accum_dense_shape")
_count_op = ops.MultitypeFuncGraph("ms_accum_count")
_l2_loss = ops.L2Loss()
_dot = ops.MatMul(transpose_b=True)  # x @ x.T of a (1, n) row: its dot product with itself

SMALL_TENSOR = 1 << 13  # elements: up to this a tensor is summed by L2Loss (a buffer) or concatenated (gradients)


def _densify(grad):
    # A sparse gradient (nn.EmbeddingLookup(sparse=True)) is a RowTensor; the buffer is dense, so its rows are
    # summed into a dense tensor first, inside a registered dispatch function (docs/mindspore.md, sparse gradients).
    return ops.unsorted_segment_sum(grad.values, grad.indices, grad.dense_shape[0])


@_dense_shape_op.register("Tensor")
def _tensor_shape(grad):
    return ops.shape(grad)


@_dense_shape_op.register("RowTensor")
def _row_tensor_shape(grad):
    # A RowTensor has no `.shape` in graph mode: the shape of its parameter is its dense_shape.
    return grad.dense_shape


def dense_shape(grad):
    """The shape of the parameter `grad` is the gradient of, whether `grad` is a Tensor or a RowTensor."""
    return _dense_shape_op(grad)


def shape_matches(shape, expected) -> bool:
    """Compares a gradient's shape with a parameter's element by element (docs/mindspore.md, sparse gradients:
    with sparse gradients among them, shape tuples compare wrongly)."""
    if len(shape) != len(expected):
        return False
    for k in range(len(expected)):
        if shape[k] != expected[k]:
            return False
    return True


@_accumulate_op.register("Tensor", "Tensor")
def _accumulate_dense(grad_sum, grad):
    # In the buffer's dtype: a half-precision gradient is summed in float32 (a cast to the same dtype is a no-op).
    # For its effect alone, as every Assign here (docs/mindspore.md, Assign's return value).
    ops.assign_add(grad_sum, ops.cast(grad, ops.dtype(grad_sum)))


@_accumulate_op.register("Tensor", "RowTensor")
def _accumulate_row_tensor(grad_sum, grad):
    ops.assign_add(grad_sum, ops.cast(_densify(grad), ops.dtype(grad_sum)))


@_weigh_op.register("None", "Tensor")
def _unweighted_dense(weight, grad):
    return grad


@_weigh_op.register("None", "RowTensor")
def _unweighted_row_tensor(weight, grad):
    return _densify(grad)


@_weigh_op.register("Tensor", "Tensor")
@_weigh_op.register("Number", "Tensor")
def _weigh_dense(weight, grad):
    return grad * ops.cast(weight, grad.dtype)


@_weigh_op.register("Tensor", "RowTensor")
@_weigh_op.register("Number", "RowTensor")
def _weigh_row_tensor(weight, grad):
    return _weigh_dense(weight, _densify(grad))


@_scale_in_place_op.register("Tensor", "Tensor")
def _scale_in_place(scale, grad):
    # In place, so no second copy of the window's gradient; the result is used (docs/mindspore.md,
    # in-place operations).
    return grad.mul_(ops.cast(scale, grad.dtype))


@_zero_in_place_op.register("Tensor")
def _zero_in_place(grad_sum):
    # x - x is exactly 0 for finite x, in place in both modes; inf or nan become nan, see clear_window.
    ops.assign_sub(grad_sum, grad_sum)


@_clear_op.register("Tensor")
def _clear(grad_sum):
    # A broadcast zero copied in place: no all-zeros tuple as MindSpore's documentation keeps, no `zeros_like`.
    grad_sum.copy_(ops.zeros((1,), grad_sum.dtype))


@_finite_probe_op.register("Tensor")
def _finite_probe(grad_sum):
    return _l2_loss(grad_sum)  # one kernel, a quarter of ReduceSum's time on CPU: only finiteness is read


def _counted(micro_batch_count, num_samples, weight):
    """Count one micro-batch of float32 `weight` into the window; returns the micro-batches in it."""
    ops.assign_add(num_samples, weight)
    ops.assign_add(micro_batch_count, ops.ones((), ms.int32))
    # Read after the write: graph mode's auto-monad orders a read of a Parameter after the writes before it.
    return micro_batch_count


def accumulate(grad_sum, micro_batch_count, num_samples, grads, weight):
    """Add one micro-batch's `grads`, which already carry its weight, and count `weight`; returns the micro-batches
    in the window."""
    _reverse_map(_accumulate_op, grad_sum, grads)
    return _counted(micro_batch_count, num_samples, ops.cast(weight, ms.float32))


def accumulate_unless_left_out(grad_sum, micro_batch_count, num_samples, grads, weight):
    """`accumulate` for a micro-batch that a filter may have left out by zeroing its weight: its `grads`, which may
    not be finite, are added only if it weighs something (one that weighs nothing adds nothing anyway).

    A tensor `if`, not a `select` of each gradient against zeros, which held copies of the gradients
    (docs/mindspore.md, masking a gradient)."""
    if weight > 0:
        _reverse_map(_accumulate_op, grad_sum, grads)
    return _counted(micro_batch_count, num_samples, ops.cast(weight, ms.float32))


@_cast_like_op.register("Tensor", "Tensor")
def _cast_like(grad, param):
    return ops.cast(grad, ops.dtype(param))


def cast_like(grads, params):
    """`grads` in the dtypes of `params` (a float32 window handed to a half-precision optimizer)."""
    return _hyper_map(_cast_like_op, grads, params)


@_count_op.register("None")
def _count_unweighted(weight):
    return 1.0


@_count_op.register("Number")
@_count_op.register("Tensor")
def _count_weight(weight):
    return weight


def count(weight):
    """What a micro-batch of `weight` adds to the window's divisor: `weight`, or 1 for an unweighted one (None)."""
    return _count_op(weight)


def weigh(grads, weight):
    """`grads` times `weight` (a sparse gradient comes back dense); with `weight` None, `grads` as they are."""
    return _hyper_map(ops.partial(_weigh_op, weight), grads)


def _row(tensor):
    return ops.reshape(ops.cast(tensor, ms.float32), (1, -1))


@_half_sum_of_squares_op.register("Tensor")
def _half_sum_of_squares(grad):
    grad = ops.cast(grad, ms.float32)
    # One kernel either way, no temporary (`Mul` then `ReduceSum` would hold a copy of the tensor;
    # docs/mindspore.md, small reductions). L2Loss (sum(x²) / 2) adds element after element: the cheaper up to
    # `SMALL_TENSOR`, it drifts above (3.5e-3 relative at 4M elements), where the tensor's dot product with itself,
    # one MatMul, is faster and accurate.
    if ops.size(grad) <= SMALL_TENSOR:
        return _l2_loss(grad)
    row = _row(grad)
    return ops.reshape(_dot(row, row), ()) * 0.5


@_half_sum_of_squares_op.register("RowTensor")
def _half_sum_of_squares_row_tensor(grad):
    return _half_sum_of_squares(_densify(grad))  # rows may repeat: their sum is the gradient


def half_squared_norm(tensors):
    """Half the squared global norm of dense `tensors` (a buffer's), in float32: one sum of squares per tensor, added
    by one `AddN` (a caller multiplies by 2 together with its own factor, one kernel)."""
    return ops.addn(_hyper_map(_half_sum_of_squares_op, tensors))


_norm_terms_op = ops.MultitypeFuncGraph("ms_accum_norm_terms")
_norm_weights_op = ops.MultitypeFuncGraph("ms_accum_norm_weights")
_after_op = ops.MultitypeFuncGraph("ms_accum_after")


@_after_op.register("Tensor", "Tensor")
def _after(grad, measured):
    return ops.depend(grad, measured)


@_after_op.register("RowTensor", "Tensor")
def _after_row_tensor(grad, measured):
    return grad


def after_each(grads, measures):
    """`grads`, each after its own measure: the buffer's `assign_add` of a gradient then follows that gradient's sum
    of squares, not the whole norm, and the gradient is freed by whichever comes last (docs/mindspore.md, gradients in
    the backward's order)."""
    return _hyper_map(_after_op, grads, measures)


@_norm_terms_op.register("Tensor")
def _norm_terms(grad):
    row = _row(grad)
    if ops.size(grad) <= SMALL_TENSOR:
        return row
    return _dot(row, row)


@_norm_weights_op.register("Tensor", "Tensor")
def _norm_weights(grad, terms):
    if ops.size(grad) <= SMALL_TENSOR:
        return terms
    return ops.ones((1, 1), ms.float32)


def grads_squared_norm(grads):
    """The squared global norm of a micro-batch's dense gradients, in float32, in few kernels: one dot of two rows.

    The first row holds the small tensors' elements (up to `SMALL_TENSOR` each) and each large tensor's sum of squares,
    its own dot; the second the same small elements and a 1 for each large sum. Two `Concat`s copy only the small
    tensors. LeNet5's 8 gradients take 5 kernels, 11 as `half_squared_norm` sums them (MindSpore's profiler, counting a
    micro-batch's kernels; docs/mindspore.md, every launch counts). For intermediate tensors only: flattening a
    Parameter (a buffer's tensor) is a copy kernel in MindSpore 2.10's graphs, so a buffer is summed by
    `half_squared_norm`, which flattens only its large tensors."""
    return _terms_norm(grads, _reverse_map(_norm_terms_op, grads))


def _terms_norm(grads, terms):
    weights = _hyper_map(_norm_weights_op, grads, terms)
    return ops.reshape(_dot(ops.concat(terms, 1), ops.concat(weights, 1)), ())


@ms.jit_class
class DenseGradsNorm:
    """The squared norm of a micro-batch's dense gradients: `grads_squared_norm`."""

    def __call__(self, grads):
        return grads_squared_norm(grads)

    def measure(self, grads):
        """`(the squared norm, grads each after its own term)`: mapped in the backward's order, each gradient's term
        is taken as it is made, and the buffer may add it right after (`after_each`)."""
        terms = _reverse_map(_norm_terms_op, grads)
        return _terms_norm(grads, terms), after_each(grads, terms)


@ms.jit_class
class SparseGradsNorm:
    """The squared norm of a micro-batch's gradients with a sparse one among them: the sums added one by one."""

    def __call__(self, grads):
        # A RowTensor among them makes the sums' types undetermined: `AddN` refuses them, `Add`s take them. Over an
        # unrolled list `AddN` compiles, but it raised the graph's peak (docs/mindspore.md, small reductions, measures
        # the sparse path's sums).
        return self.measure(grads)[0]

    def measure(self, grads):
        """`(the squared norm, grads each after its own sum)`, as `DenseGradsNorm.measure`."""
        halves = _reverse_map(_half_sum_of_squares_op, grads)
        total = halves[0]
        for value in halves[1:]:
            total = total + value
        return total * 2.0, after_each(grads, halves)


def squared_norm(tensors):
    """The squared global norm of `tensors`, in float32."""
    return half_squared_norm(tensors) * 2.0


@_clip_in_place_op.register("Tensor", "Tensor", "Tensor")
def _clip_in_place(clip_norm, global_norm, grad):
    # MindSpore's clip_by_global_norm computes `x * clip_norm / global_norm`: the same two roundings, in place.
    return grad.mul_(ops.cast(clip_norm, grad.dtype)).div_(ops.cast(global_norm, grad.dtype))


def clip_measured(grads, clip_norm: float, sq_norm=None):
    """`(grads clipped to the global norm clip_norm in place, their squared global norm before clipping)`, clipped as
    `ops.clip_by_global_norm` clips.

    The global norm is summed without a temporary (`squared_norm`): `clip_by_global_norm` squares each tensor into a
    copy first (docs/mindspore.md, small reductions). Its sums differ from ours by float32 rounding only. `sq_norm`,
    the squared global norm already measured (by statistics), is not summed again."""
    if sq_norm is None:
        sq_norm = squared_norm(grads)
    clip = ops.scalar_to_tensor(clip_norm, ms.float32)
    global_norm = ops.sqrt(sq_norm)
    global_norm = ops.select(global_norm >= clip, global_norm, clip)
    return _hyper_map(ops.partial(_clip_in_place_op, clip, global_norm), grads), sq_norm


def window_grads(grad_sum, divisor, clip_norm, statistics):
    """The gradient a window applies: `grad_sum` divided by `divisor` and clipped to `clip_norm` if given, both in
    place, so the buffer holds it afterwards (a graph launched next can apply it); and its squared norm before
    clipping if it was measured, by `statistics` or for the clipping (else None).

    Clipping measures the window's norm anyway, between the division and its own writes: the guard then tests that
    norm for finiteness rather than reading the clipped buffer again, which made MindSpore copy the buffer's large
    tensors (docs/mindspore.md, in-place operations). With statistics on, clipping reuses their norm."""
    grads, sq_norm = statistics.window(_hyper_map(ops.partial(_scale_in_place_op, 1.0 / divisor), grad_sum))
    if clip_norm is not None:
        grads, sq_norm = clip_measured(grads, clip_norm, sq_norm)
    return grads, sq_norm


@_assign_op.register("Tensor", "Tensor")
def _assign(param, value):
    ops.assign(param, value)
    return value  # what the Parameter now holds


@ms.jit_class
class InPlace:
    """Graph mode: `Tensor.mul_` and `div_` on the buffer's Parameters write them, so its window arithmetic needs no
    copy; a micro-batch's weight stays what it is (a sample count is a graph constant: nothing runs for it)."""

    def __call__(self, params, values):
        return values

    def weight(self, weight):
        return weight


@ms.jit_class
class WrittenBack:
    """PyNative mode: `Tensor.mul_` on a Parameter returns a new tensor and leaves the Parameter as it was (measured
    with MindSpore 2.10), so the results are assigned back."""

    def __call__(self, params, values):
        return _hyper_map(_assign_op, params, values)

    def weight(self, weight):
        # A Python number handed to a MultitypeFuncGraph makes MindSpore 2.10 look its type up through its own
        # deprecated `pytype_to_dtype`, which logs a warning at every call: once per micro-batch. A tensor does not.
        return weight if isinstance(weight, Tensor) else Tensor(weight, ms.float32)


def in_place_arithmetic():
    """How the current mode's in-place arithmetic reaches the buffer's Parameters, chosen once (`InPlace` in graph
    mode, else `WrittenBack`)."""
    return InPlace() if ms.get_context("mode") == ms.GRAPH_MODE else WrittenBack()


def sums_finite(tensors):
    """Whether every element of float32 `tensors` is finite, from one L2Loss (half the sum of squares) per tensor: it
    is finite exactly when the elements are, unless they square past float32's range (an element beyond about
    1.8e19, which no clipping survives either: the global norm would be infinite)."""
    return ops.isfinite(ops.addn(_hyper_map(_finite_probe_op, tensors)))


def zero_finite(grad_sum):
    """Zero a buffer known to be finite, in place: subtracting it from itself needs no temporary (inf or nan would
    stay nan)."""
    _hyper_map(_zero_in_place_op, grad_sum)


def zero_any(grad_sum):
    """Zero a buffer that may hold inf or nan, in place: a broadcast zero copied in, which costs a temporary per
    tensor."""
    _hyper_map(_clear_op, grad_sum)


def zero_counters(counters):
    """Zero the scalar `counters` (int32 or float32) in place."""
    for counter in counters:
        ops.assign(counter, ops.zeros((), ops.dtype(counter)))


def clear_window(grad_sum, micro_batch_count, counters):
    """Zero the buffer, whatever it holds, `micro_batch_count` and the other scalar `counters`: the window is closed.
    Returns `micro_batch_count` (0), read after its write.

    Subtracting the buffer from itself zeroes every finite value; a buffer that held inf or nan then sums to nan
    and is overwritten with zeros. The test is a tensor `if` (docs/structures.md: a graph with control flow costs
    more per call), so a window closed by the optimizer step, which knows whether it was finite, avoids it. The test
    reads the buffer's Parameters after the subtraction, which auto-monad orders after it; no copy is made."""
    zero_finite(grad_sum)
    if not sums_finite(grad_sum):
        zero_any(grad_sum)
    zero_counters((micro_batch_count,) + counters)
    # A value, not None: MindSpore turns a None returned after a tensor `if` into a Python call at run time
    # (a PyExecute kernel).
    return micro_batch_count

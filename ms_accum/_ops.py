"""Per-parameter graph math shared by the Accumulator and the Cells.

Each operation is a module-level `MultitypeFuncGraph` mapped over the parameters with `HyperMap`, the way
MindSpore's own `nn/wrap` code does it, so one definition serves every graph that needs it. The window
logic (`accumulate`, `apply_window`, `clear_window`) is written once here as plain functions that graph
mode inlines into whichever `construct` or `@jit` function calls them.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops

_hyper_map = ops.HyperMap()

_accumulate_op = ops.MultitypeFuncGraph("ms_accum_accumulate")
_accumulate_scaled_op = ops.MultitypeFuncGraph("ms_accum_accumulate_scaled")
_scale_in_place_op = ops.MultitypeFuncGraph("ms_accum_scale_in_place")
_clear_op = ops.MultitypeFuncGraph("ms_accum_clear")
_zero_in_place_op = ops.MultitypeFuncGraph("ms_accum_zero_in_place")
_sum_op = ops.MultitypeFuncGraph("ms_accum_sum")
_dense_shape_op = ops.MultitypeFuncGraph("ms_accum_dense_shape")


def _densify(grad):
    # A sparse gradient (nn.EmbeddingLookup(sparse=True)) is a RowTensor; the buffer is dense, so its rows
    # are summed into a dense tensor first. This must live inside a registered dispatch function: the same
    # conversion written outside one crashed the 2.10 compiler.
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
    """Compares a gradient's shape with a parameter's element by element.

    When a network has sparse gradients, MindSpore 2.10 compares its gradients' shape tuples wrongly (a (5,)
    gradient's `shape == (5,)` is False, and `tuple(shape)` fails with "Not support the type: Undetermined"),
    while comparing lengths and elements works (measured).
    """
    if len(shape) != len(expected):
        return False
    for k in range(len(expected)):
        if shape[k] != expected[k]:
            return False
    return True


@_accumulate_op.register("Tensor", "Tensor")
def _accumulate_dense(grad_sum, grad):
    return ops.assign_add(grad_sum, grad)


@_accumulate_op.register("Tensor", "RowTensor")
def _accumulate_row_tensor(grad_sum, grad):
    return ops.assign_add(grad_sum, _densify(grad))


@_accumulate_scaled_op.register("Tensor", "Tensor", "Tensor")
def _accumulate_scaled_dense(weight, grad_sum, grad):
    return ops.assign_add(grad_sum, grad * ops.cast(weight, grad.dtype))


@_accumulate_scaled_op.register("Tensor", "Tensor", "RowTensor")
def _accumulate_scaled_row_tensor(weight, grad_sum, grad):
    dense = _densify(grad)
    return ops.assign_add(grad_sum, dense * ops.cast(weight, dense.dtype))


@_scale_in_place_op.register("Tensor", "Tensor")
def _scale_in_place(scale, grad):
    # In place in graph mode: `grad * scale` would hold a second copy of the window's gradient (README,
    # "Memory"). PyNative returns a new tensor instead; callers use the result and clear the buffer after.
    return grad.mul_(ops.cast(scale, grad.dtype))


@_zero_in_place_op.register("Tensor")
def _zero_in_place(grad_sum):
    # x - x is exactly 0 for finite x, with no temporary; inf or nan become nan, see clear_window. (Tensor.mul_
    # would do in graph mode, but in PyNative MindSpore 2.10 it returns a new tensor and leaves the buffer as is.)
    return ops.assign_sub(grad_sum, grad_sum)


@_clear_op.register("Tensor")
def _clear(grad_sum):
    # A broadcast zero copied in place, not a second all-zeros ParameterTuple as MindSpore's documentation keeps
    # (2x the memory), nor `zeros_like` (a temporary copy of the whole buffer, README "Memory").
    return grad_sum.copy_(ops.zeros((1,), grad_sum.dtype))


@_sum_op.register("Tensor")
def _sum(grad_sum):
    return ops.cast(ops.reduce_sum(grad_sum), ms.float32)


def accumulate(grad_sum, mini_step, num_samples, grads, weight):
    """Add one micro-batch's `grads` to the window, as they are, and count `weight` samples.

    Graph code calling these helpers avoids Python-level if/else ahead of the tensor `if` that closes a
    window: in MindSpore 2.10 such a constant branch makes graph mode silently drop the side effects
    (optimizer step, clear) of the tensor `if` that follows (measured; a plain `if` without `else` that only
    raises is harmless). Switches between modes are therefore arithmetic (see `mean_divisor`).

    Use it where the gradients already carry the weight (the Cells fold it into the backward pass's
    sensitivity, which costs nothing). Returns the window's micro-step count after this one.
    """
    done = _hyper_map(_accumulate_op, grad_sum, grads)
    ops.assign_add(num_samples, ops.depend(ops.cast(weight, ms.float32), done))
    return ops.assign_add(mini_step, ops.ones((), ms.int32))


def accumulate_weighted(grad_sum, mini_step, num_samples, grads, weight):
    """Add `weight * grads` to the window and count `weight` samples; returns the micro-step count."""
    weight = ops.cast(weight, ms.float32)
    done = _hyper_map(ops.partial(_accumulate_scaled_op, weight), grad_sum, grads)
    ops.assign_add(num_samples, ops.depend(weight, done))
    return ops.assign_add(mini_step, ops.ones((), ms.int32))


def window_grads(grad_sum, divisor, clip_norm):
    """The gradient a window applies: `grad_sum` divided by `divisor` in place, clipped to `clip_norm` if given.

    Callers pass the samples seen for a mean and 1 for a sum (dividing by 1.0 is exact), so no Python
    if/else has to choose between them: see `accumulate`'s note on MindSpore 2.10's tensor-`if` bug.
    """
    grads = _hyper_map(ops.partial(_scale_in_place_op, 1.0 / divisor), grad_sum)
    if clip_norm is not None:
        grads = ops.clip_by_global_norm(grads, clip_norm)
    return grads


def mean_divisor(num_samples, mean: float):
    """`num_samples` when `mean` is 1.0, else 1.0: an arithmetic switch with no Python branch."""
    return num_samples * mean + (1.0 - mean)


def clear_window(grad_sum, mini_step, num_samples):
    """Zero the buffer and both counters: the window is closed.

    Subtracting the buffer from itself needs no temporary and zeroes every finite value; a buffer that held inf
    or nan (a skipped window) then sums to nan and is overwritten with zeros, which costs a temporary.
    """
    done = _hyper_map(_zero_in_place_op, grad_sum)
    if not ops.isfinite(ops.addn(_hyper_map(_sum_op, done))):
        done = _hyper_map(_clear_op, grad_sum)
    zero = ops.depend(ops.zeros((), ms.int32), done)
    ops.assign(num_samples, ops.cast(zero, ms.float32))
    return ops.assign(mini_step, zero)

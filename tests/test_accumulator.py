"""Accumulator: exact arithmetic, reductions, clipping, weighting, memory and argument checks."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ms_accum import Accumulator
from conftest import raises_exactly


class Scalar(nn.Cell):
    """One zero parameter whose gradient we choose: loss = g * w."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.zeros((1,), np.float32)), name="w")

    def construct(self, g):
        return (self.w * g).sum()


def scalar_step(accumulator, net):
    grad_fn = ms.value_and_grad(net, None, accumulator.optimizer.parameters)

    @ms.jit
    def step(g, n):
        loss, grads = grad_fn(g)
        return ops.depend(loss, accumulator(grads, n))

    return step


def test_mean_of_1_2_3_4_is_exactly_2_5():
    net = Scalar()
    accumulator = Accumulator(nn.SGD(net.trainable_params(), 1.0), 4)
    step = scalar_step(accumulator, net)
    for i, g in enumerate([1.0, 2.0, 3.0, 4.0]):
        step(Tensor([g], ms.float32), 1)
        if i < 3:
            assert net.w.asnumpy()[0] == 0.0
    assert net.w.asnumpy()[0] == -2.5
    assert int(accumulator.mini_step.asnumpy()) == 0
    assert all(not b.asnumpy().any() for b in accumulator.inner_grads)


def test_sum_reduction_does_not_divide():
    net = Scalar()
    accumulator = Accumulator(nn.SGD(net.trainable_params(), 1.0), 4, reduction="sum")
    step = scalar_step(accumulator, net)
    for g in [1.0, 2.0, 3.0, 4.0]:
        step(Tensor([g], ms.float32), 1)
    assert net.w.asnumpy()[0] == -10.0


def test_unequal_micro_batches_are_weighted_by_samples():
    # Micro-batch means 1.0 over 1 sample and 4.0 over 3 samples: the concatenated mean is 13/4.
    net = Scalar()
    accumulator = Accumulator(nn.SGD(net.trainable_params(), 1.0), 2)
    step = scalar_step(accumulator, net)
    step(Tensor([1.0], ms.float32), 1)
    step(Tensor([4.0], ms.float32), 3)
    assert net.w.asnumpy()[0] == -3.25


def test_flush_applies_partial_window_as_mean_of_what_it_holds():
    net = Scalar()
    accumulator = Accumulator(nn.SGD(net.trainable_params(), 1.0), 4)
    step = scalar_step(accumulator, net)
    step(Tensor([1.0], ms.float32), 1)
    step(Tensor([2.0], ms.float32), 1)
    assert bool(accumulator.flush())
    assert net.w.asnumpy()[0] == -1.5
    assert not bool(accumulator.flush())  # empty: nothing happens
    assert net.w.asnumpy()[0] == -1.5


class Vector(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = Parameter(Tensor(np.zeros((3,), np.float32)), name="a")
        self.b = Parameter(Tensor(np.zeros((1,), np.float32)), name="b")

    def construct(self, ga, gb):
        return (self.a * ga).sum() + (self.b * gb).sum()


def run_clip(ga, gb, clip_norm, k=2):
    net = Vector()
    accumulator = Accumulator(nn.SGD(net.trainable_params(), 1.0), k, clip_norm=clip_norm)
    grad_fn = ms.value_and_grad(net, None, accumulator.optimizer.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        return ops.depend(loss, accumulator(grads))

    for _ in range(k):
        step(Tensor(ga, ms.float32), Tensor(gb, ms.float32))
    return -np.concatenate([net.a.asnumpy(), net.b.asnumpy()])  # SGD lr 1 from 0: the applied gradient


def test_clip_norm_clips_accumulated_gradient_to_global_norm():
    applied = run_clip([3.0, 4.0, 0.0], [12.0], clip_norm=1.0)  # window mean has norm 13
    assert np.linalg.norm(applied) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(applied, np.array([3, 4, 0, 12]) / 13.0, rtol=1e-6)


def test_clip_norm_leaves_small_gradient_untouched():
    applied = run_clip([0.3, 0.4, 0.0], [1.2], clip_norm=100.0)
    np.testing.assert_array_equal(applied, np.array([0.3, 0.4, 0.0, 1.2], np.float32))


def test_owns_one_buffer_per_parameter_plus_scalars():
    net = nn.SequentialCell(nn.Dense(5, 4), nn.Dense(4, 3))
    params = net.trainable_params()
    accumulator = Accumulator(nn.Momentum(params, 0.1, 0.9), 3)
    owned = accumulator.buffer.parameters()
    assert len(owned) == len(params) + 6  # two window counters, the guard's loss scale and three counters
    assert [tuple(p.shape) for p in accumulator.inner_grads] == [tuple(p.shape) for p in params]
    assert sum(p.size for p in accumulator.inner_grads) == sum(p.size for p in params)
    guard = {"loss_scale", "window_bad", "skipped_windows", "skipped_micro_batches"}
    assert {p.name for p in owned} == {f"accumulate.{p.name}" for p in params} | {
        f"accumulate.{name}" for name in ("mini_step", "num_samples", *guard)}
    # no attribute of the Accumulator holds any other Parameter (the documentation's `zeros` copy is gone)
    held = [v for v in vars(accumulator).values() if isinstance(v, (Parameter, ms.ParameterTuple))]
    assert sum(len(v) if isinstance(v, ms.ParameterTuple) else 1 for v in held) == len(owned) - len(guard)


@pytest.mark.parametrize("value,error,got", [
    (0, ValueError, "0"), (-1, ValueError, "-1"), (1.5, TypeError, "1.5 of type float"),
    (True, TypeError, "True of type bool"), (None, TypeError, "None of type NoneType"),
    ("2", TypeError, "'2' of type str")])
def test_bad_accumulate_step(value, error, got):
    optimizer = nn.SGD(nn.Dense(2, 2).trainable_params())
    with raises_exactly(error, f"For 'Accumulator', the argument 'accumulate_step' must be a positive int, but got "
                               f"{got}."):
        Accumulator(optimizer, value)


def test_message_follows_mindspore_template():
    with raises_exactly(ValueError, "For 'Accumulator', the argument 'accumulate_step' must be a positive int, but got "
                                    "0."):
        Accumulator(nn.SGD(nn.Dense(2, 2).trainable_params()), 0)


@pytest.mark.parametrize("optimizer", [None, "sgd", nn.Dense(2, 2)])
def test_bad_optimizer(optimizer):
    with raises_exactly(TypeError, f"For 'Accumulator', the argument 'optimizer' must be Optimizer, but got "
                                   f"{optimizer!r} of type {type(optimizer).__name__}."):
        Accumulator(optimizer, 2)


@pytest.mark.parametrize("value,error,got", [
    (0, ValueError, "0"), (-1.0, ValueError, "-1.0"), (float("nan"), ValueError, "nan"),
    ("1", TypeError, "'1' of type str"), (True, TypeError, "True of type bool")])
def test_bad_clip_norm(value, error, got):
    with raises_exactly(error, f"For 'Accumulator', the argument 'clip_norm' must be a positive float, but got {got}."):
        Accumulator(nn.SGD(nn.Dense(2, 2).trainable_params()), 2, clip_norm=value)


@pytest.mark.parametrize("value,error,message", [
    ("avg", ValueError, "must be one of ['mean', 'sum', 'weighted_mean'], but got 'avg'."),
    (None, TypeError, "must be str, one of ['mean', 'sum', 'weighted_mean'], but got None of type NoneType.")])
def test_bad_reduction(value, error, message):
    # The Accumulator builds its AccumulationBuffer, which checks the reduction: the error names the Accumulator.
    with raises_exactly(error, f"For 'Accumulator', the argument 'reduction' {message}"):
        Accumulator(nn.SGD(nn.Dense(2, 2).trainable_params()), 2, reduction=value)


def test_grads_of_wrong_length_or_shape_fail_before_any_update():
    net = nn.Dense(2, 2)
    accumulator = Accumulator(nn.SGD(net.trainable_params(), 1.0), 1)
    before = net.weight.asnumpy().copy()

    @ms.jit
    def wrong_length(g):
        return accumulator((g,))

    @ms.jit
    def wrong_shape(w, b):
        return accumulator((w, b))

    with raises_exactly(ValueError, "For 'Accumulator', the argument 'grads' must hold 2 tensors, one per optimizer "
                                    "parameter, but got 1."):
        wrong_length(Tensor(np.ones((2, 2), np.float32)))
    with raises_exactly(ValueError, "For 'Accumulator', the argument 'grads' must match the optimizer's parameter "
                                    "shapes, but grads[1] has shape (3,), expected (2,)."):
        wrong_shape(Tensor(np.ones((2, 2), np.float32)), Tensor(np.ones((3,), np.float32)))
    np.testing.assert_array_equal(net.weight.asnumpy(), before)

"""Non-finite windows and loss scaling: skipped windows never reach the parameters, counters are right,
the scale changes once per window, and scaled training equals unscaled training."""
import functools

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import amp, nn

from ms_accum import GradientAccumulation, TrainClear, TrainForwardBackward, TrainOptim
from ms_accum.core import AccumulationBuffer
from ms_accum.graphs import TrainAccumulationCell
from ms_accum import NonFiniteError
from ms_accum.core.guard import WindowGuard
from conftest import raises_exactly

BATCH, K = 4, 3


def make_net(seed: int = 0, dtype=None):
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3))
    return net if dtype is None else net.to_float(dtype)


def batches(bad: tuple = (), count: int = 6):
    rng = np.random.RandomState(0)
    x = rng.randn(count * BATCH, 6).astype(np.float32)
    y = rng.randint(0, 3, count * BATCH).astype(np.int32)
    for index in bad:
        x[index * BATCH] = np.nan  # one sample poisons its micro-batch's loss and gradient
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(count)]


def dataset(items):
    x = np.concatenate([b[0] for b in items])
    y = np.concatenate([b[1] for b in items])
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def train(items, dtype=None, mini_steps=K, **kwargs):
    net = make_net(dtype=dtype)
    executor = GradientAccumulation(net, loss_fn(), nn.Momentum(net.trainable_params(), 0.1, 0.9), **kwargs)
    result = executor.train_process(1, dataset(items), mini_steps, ckpt_dir=None, verbose=False)
    return result, params_of(net), executor


def params_of(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


@functools.lru_cache(maxsize=None)
def second_window_alone():
    """The parameters after training on `batches()`' second window alone, from the start: what skipping the first
    leaves. Trained once for the tests that compare with it; nothing mutates the returned arrays."""
    return train(batches()[K:])[1]


@functools.lru_cache(maxsize=None)
def without_micro_batch_1():
    """Reference for leaving out micro-batch 1: the three-graph Cells fed micro-batches 0 and 2 as window 1, then
    window 2; once for the structures compared with it."""
    items = batches()
    net = make_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    buffer = AccumulationBuffer(optimizer.parameters)
    forward_backward = TrainForwardBackward(nn.WithLossCell(net, loss_fn()), optimizer, buffer)
    optim, clear = TrainOptim(optimizer, buffer), TrainClear(buffer)
    for window in ([items[0], items[2]], items[3:]):
        for x, y in window:
            forward_backward(ms.Tensor(x), ms.Tensor(y))
        optim()
        clear()
    return params_of(net)


def assert_finite(params):
    assert all(np.isfinite(v).all() for v in params.values())


def test_nonfinite_window_is_skipped_with_a_warning():
    items = batches(bad=(1,))
    with pytest.warns(RuntimeWarning, match="step 1: the window's gradient or loss is not finite, so it was skipped"):
        result, params, _ = train(items)
    assert [r.skipped for r in result.steps] == [True, False]
    assert result.skipped_windows == 1 and result.skipped_micro_batches == 0
    assert_finite(params)
    # Exactly as if the first window had never been there (Momentum's state untouched as well).
    expected = second_window_alone()
    for name in expected:
        np.testing.assert_array_equal(params[name], expected[name])


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("structure", ["three_graphs", "fused", "window"])
def test_skip_microbatch_leaves_out_the_bad_micro_batch_and_renormalizes(structure):
    items = batches(bad=(1,))
    result, params, _ = train(items, policy="skip_microbatch", structure=structure)
    assert result.skipped_windows == 0 and result.skipped_micro_batches == 1
    assert [r.skipped for r in result.steps] == [False, False]
    assert np.isfinite(result.steps[0].loss)  # the window's loss is over the micro-batches it kept
    assert_finite(params)
    # Reference: the three-graph Cells fed the two good micro-batches of window 1, then window 2.
    for name, value in without_micro_batch_1().items():
        np.testing.assert_allclose(params[name], value, rtol=1e-6, atol=1e-7)


def test_a_window_whose_micro_batches_were_all_left_out_is_skipped():
    with pytest.warns(RuntimeWarning, match="not finite"):
        result, params, _ = train(batches(bad=(0, 1, 2)), policy="skip_microbatch", reduction="sum")
    assert result.skipped_micro_batches == 3 and result.skipped_windows == 1
    assert [r.skipped for r in result.steps] == [True, False]
    assert_finite(params)


def test_stop_on_nonfinite_raises_with_parameters_untouched():
    net = make_net()
    before = params_of(net)
    executor = GradientAccumulation(net, loss_fn(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                    stop_on_nonfinite=True)
    with raises_exactly(NonFiniteError, "For 'GradientAccumulation.train_process', epoch 1 step 1: the window's "
                                        "gradient or loss is not finite, so it was skipped (parameters unchanged; 1 "
                                        "window(s) skipped so far); stopping, as stop_on_nonfinite=True asks."):
        executor.train_process(1, dataset(batches(bad=(2,))), K, ckpt_dir=None, verbose=False)
    for name, value in params_of(net).items():
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_static_loss_scale_trains_exactly_like_no_scale():
    items = batches()
    _, plain, _ = train(items)
    result, scaled, executor = train(items, loss_scaler=amp.StaticLossScaler(2.0 ** 12))
    assert executor.buffer.guard.loss_scale.asnumpy() == 2.0 ** 12
    assert result.skipped_windows == 0
    for name in plain:  # powers of two scale and unscale float32 exactly
        np.testing.assert_array_equal(scaled[name], plain[name])


def test_dynamic_loss_scale_skips_the_overflowing_window_and_lowers_the_scale_once():
    items = batches()
    # 4 samples * 2**127 overflows float32 in the backward pass: the first window must be skipped.
    scaler = amp.DynamicLossScaler(2.0 ** 127, scale_factor=2 ** 20, scale_window=1000)
    result, scaled, _ = train(items, loss_scaler=scaler)
    assert [r.skipped for r in result.steps] == [True, False]
    assert [r.loss_scale for r in result.steps] == [2.0 ** 107, 2.0 ** 107]  # lowered once, not per micro-batch
    assert_finite(scaled)
    expected = second_window_alone()
    for name in expected:
        np.testing.assert_array_equal(scaled[name], expected[name])


def test_dynamic_loss_scale_grows_once_per_window():
    result, _, _ = train(batches(count=9), loss_scaler=amp.DynamicLossScaler(16.0, scale_factor=2, scale_window=1))
    assert [r.loss_scale for r in result.steps] == [32.0, 64.0, 128.0]


def test_float16_network_with_dynamic_loss_scale():
    # Mixed precision on CPU: float16 Dense layers; 2**24 times the gradient overflows float16 at first.
    scaler = amp.DynamicLossScaler(2.0 ** 24, scale_factor=16, scale_window=1000)
    result, params, _ = train(batches(count=24), dtype=ms.float16, loss_scaler=scaler)
    assert result.steps[0].skipped and result.skipped_windows >= 1
    assert not result.steps[-1].skipped
    assert result.steps[-1].loss_scale < 2.0 ** 24
    assert_finite(params)


def test_guard_state_is_part_of_the_training_state():
    net = make_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    cell = TrainAccumulationCell(nn.WithLossCell(net, loss_fn()), optimizer, K,
                                 loss_scaler=amp.DynamicLossScaler(8.0, 2, 10))
    names = {p.name for p in cell.get_parameters()}
    assert {"accumulate.loss_scale", "accumulate.loss_scale_counter", "accumulate.skipped_windows",
            "accumulate.skipped_micro_batches", "accumulate.window_bad"} <= names


@pytest.mark.parametrize("kwargs,error,message", [
    ({"policy": "skip"}, ValueError,
     "the argument 'policy' must be one of ['skip_window', 'skip_microbatch'], but got 'skip'."),
    ({"loss_scaler": 1024.0}, TypeError,
     "the argument 'loss_scaler' must be StaticLossScaler or DynamicLossScaler, but got 1024.0 of type float."),
])
def test_bad_guard_arguments(kwargs, error, message):
    # Each error names what was called: the guard built directly, and the executor, not the guard it builds.
    with raises_exactly(error, f"For 'WindowGuard', {message}"):
        WindowGuard(**kwargs)
    net = make_net()
    with raises_exactly(error, f"For 'GradientAccumulation', {message}"):
        GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params()), **kwargs)
    with raises_exactly(error, f"For 'TrainAccumulationCell', {message}"):
        TrainAccumulationCell(nn.WithLossCell(net, loss_fn()), nn.SGD(net.trainable_params()), K, **kwargs)


def test_policy_and_scaler_belong_to_a_given_buffer():
    net = make_net()
    optimizer = nn.SGD(net.trainable_params())
    with raises_exactly(ValueError, "For 'TrainAccumulationCell', the arguments 'policy' and 'loss_scaler' belong to "
                                    "the buffer: pass them to the AccumulationBuffer given as 'buffer', not here."):
        TrainAccumulationCell(nn.WithLossCell(net, loss_fn()), optimizer, K,
                              buffer=AccumulationBuffer(optimizer.parameters), policy="skip_microbatch")


def test_a_half_precision_window_whose_sum_would_overflow_is_still_applied():
    # The window's check sums each tensor on CPU, but only for float32 buffers: a float16 buffer of finite values
    # near float16's limit (65504) sums past it, so it gets MindSpore's element-wise test instead.
    net = nn.Dense(8, 4)
    optimizer = nn.SGD(net.trainable_params(), 0.0)  # lr 0: only whether the step ran matters
    buffer = AccumulationBuffer(optimizer.parameters, reduction="sum", dtype=ms.float16)
    for g in buffer.grad_sum:
        g.set_data(ms.Tensor(np.full(g.shape, 60000.0, np.float16)))
    ms.ops.assign(buffer.mini_step, ms.Tensor(1, ms.int32))
    assert bool(TrainOptim(optimizer, buffer)().asnumpy())
    assert int(buffer.guard.skipped_windows.asnumpy()) == 0


@functools.lru_cache(maxsize=None)
def window_check(statistics):
    """A buffer and its TrainOptim, compiled once for every case of the test below, and every Parameter's starting
    value (the network's, the optimizer's, the buffer's and its guard's), which each case restores first."""
    net = nn.SequentialCell(nn.Dense(100, 100), nn.Dense(100, 3))
    optimizer = nn.SGD(net.trainable_params(), 0.0)  # lr 0: only whether the step ran matters
    buffer = AccumulationBuffer(optimizer.parameters, reduction="sum", statistics=statistics)
    optim = TrainOptim(optimizer, buffer)
    return buffer, optim, [(p, p.asnumpy().copy()) for p in optim.get_parameters()]


@pytest.mark.parametrize("statistics", [False, True])
@pytest.mark.parametrize("value", [None, np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("tensor", ["0.weight", "0.bias", "1.weight"])
def test_the_window_check_finds_a_nonfinite_element_in_any_tensor(tensor, value, statistics):
    # The float32 window's check sums each tensor's squares with L2Loss; with statistics on it reads the window's
    # squared norm instead, where a tensor above `_ops.SMALL_TENSOR` elements (0.weight, 100 x 100) is a dot. Either
    # way, one element that is not finite rules the window out.
    buffer, optim, start = window_check(statistics)
    for param, value_at_start in start:  # a fresh buffer, guard and optimizer: nothing an earlier case left
        param.set_data(ms.Tensor(value_at_start))
    for g in buffer.grad_sum:
        data = np.full(g.shape, 0.5, np.float32)
        if value is not None and g.name == f"accumulate.{tensor}":
            data.flat[data.size // 2] = value
        g.set_data(ms.Tensor(data))
    ms.ops.assign(buffer.mini_step, ms.Tensor(1, ms.int32))
    assert bool(optim().asnumpy()) == (value is None)
    assert int(buffer.guard.skipped_windows.asnumpy()) == (value is not None)

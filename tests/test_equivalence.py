"""The core promise: K accumulated micro-batches update the parameters exactly like one K-times larger batch.

For every model, optimizer, K and execution mode, a reference trains on the full batch with
`nn.TrainOneStepCell`; the accumulating copy trains on its micro-batches. After every update the two must be
allclose (rtol 1e-5, atol 1e-6); between updates the accumulating copy must not move by a single bit.
"""
import functools

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn
import mindspore.dataset as ds

from ms_accum import Accumulator, GradientAccumulation, TrainClear, TrainForwardBackward, TrainOptim
from ms_accum.core import AccumulationBuffer
from ms_accum.graphs import TrainAccumulationCell
from accumulator_step import accumulator_step
from conftest import MODES, batch_for, make_net, make_optimizer, params_of

RTOL, ATOL = 1e-5, 1e-6
MICRO = 4      # samples per micro-batch
WINDOWS = 2    # updates per test: the second one exercises optimizer state (momentum, Adam moments)


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


@functools.lru_cache(maxsize=None)
def _reference_run(kind, opt_name, k, mode):
    net = make_net(kind)
    start = params_of(net)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn()), make_optimizer(opt_name, net.trainable_params()))
    step.set_train()
    after = []
    for w in range(WINDOWS):
        x, y = batch_for(kind, k * MICRO, seed=w)
        step(Tensor(x), Tensor(y))
        after.append(params_of(net))
    return start, after


def reference_run(kind, opt_name, k):
    """Parameters after each of WINDOWS big-batch steps of size k * MICRO, in the current execution mode.

    Computed once per case and mode: the Accumulator, the Cells and the executor are all compared with the same
    reference (each compile of it costs as much as the graph under test). Nothing mutates the returned arrays."""
    return _reference_run(kind, opt_name, k, ms.get_context("mode"))


def assert_close(actual, expected):
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)


def assert_unchanged(actual, before):
    for a, b in zip(actual, before):
        assert np.array_equal(a, b), "parameters moved before the window was full"


def micro_batches(kind, k, w):
    x, y = batch_for(kind, k * MICRO, seed=w)
    return [(Tensor(x[i * MICRO:(i + 1) * MICRO]), Tensor(y[i * MICRO:(i + 1) * MICRO])) for i in range(k)]


def run_micro_steps(kind, k, step_fn, net, expected):
    for w in range(WINDOWS):
        before = params_of(net)
        for i, (x, y) in enumerate(micro_batches(kind, k, w)):
            step_fn(x, y)
            if i < k - 1:
                assert_unchanged(params_of(net), before)
        assert_close(params_of(net), expected[w])


@pytest.fixture(params=["graph", pytest.param("pynative", marks=pytest.mark.slow)])
def mode(request):
    # Graph mode, what the library is for, in make test; PyNative too in make test-all (it doubles the 144 cases).
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


CASES = [(kind, opt, k) for kind in ("mlp", "lenet5") for opt in ("sgd", "momentum", "adam") for k in (1, 2, 4)]


def tiered(cases):
    # make test: K=4 (a window of several micro-batches, every optimizer's state, both networks); make test-all: K=1, 2.
    return [pytest.param(*case, marks=() if case[2] == 4 else pytest.mark.slow) for case in cases]


@pytest.mark.parametrize("kind,opt_name,k", tiered(CASES))
def test_accumulator_matches_big_batch(kind, opt_name, k, mode):
    _, expected = reference_run(kind, opt_name, k)
    net = make_net(kind)
    accumulator = Accumulator(make_optimizer(opt_name, net.trainable_params()), k)
    run_micro_steps(kind, k, accumulator_step(net, loss_fn(), accumulator), net, expected)


@pytest.mark.parametrize("kind,opt_name,k", tiered(CASES))
def test_cells_match_big_batch(kind, opt_name, k, mode):
    _, expected = reference_run(kind, opt_name, k)
    # The fused micro-step Cell (the executor's default) ...
    net = make_net(kind)
    cell = TrainAccumulationCell(nn.WithLossCell(net, loss_fn()), make_optimizer(opt_name, net.trainable_params()), k)
    cell.set_train()
    run_micro_steps(kind, k, cell, net, expected)

    # ... and the tutorial's three graphs on one shared buffer.
    net = make_net(kind)
    optimizer = make_optimizer(opt_name, net.trainable_params())
    buffer = AccumulationBuffer(optimizer.parameters)
    forward_backward = TrainForwardBackward(nn.WithLossCell(net, loss_fn()), optimizer, buffer).set_train()
    optim, clear = TrainOptim(optimizer, buffer).set_train(), TrainClear(buffer).set_train()
    calls = []

    def three_graphs(x, y):
        forward_backward(x, y)
        calls.append(1)
        if len(calls) % k == 0:
            optim()
            clear()

    run_micro_steps(kind, k, three_graphs, net, expected)


def dataset_of(kind, k, windows, micro=MICRO):
    xs, ys = zip(*[batch_for(kind, k * micro, seed=w) for w in range(windows)])
    x, y = np.concatenate(xs), np.concatenate(ys)
    return ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(micro)


# The default in make test; the other structures (also checked against it in test_window) in make test-all.
@pytest.mark.parametrize("structure", [pytest.param("fused", marks=pytest.mark.slow),
                                       pytest.param("window", marks=pytest.mark.slow), "three_graphs"])
@pytest.mark.parametrize("kind,opt_name,k", tiered([c for c in CASES if c[2] != 1]))
def test_executor_matches_big_batch(kind, opt_name, k, structure, mode, tmp_path):
    _, expected = reference_run(kind, opt_name, k)
    net = make_net(kind)
    executor = GradientAccumulation(net, loss_fn(), make_optimizer(opt_name, net.trainable_params()),
                                    structure=structure)
    result = executor.train_process(1, dataset_of(kind, k, WINDOWS), mini_steps=k, ckpt_dir=str(tmp_path),
                                    verbose=False)
    assert [r.step for r in result.steps] == list(range(1, WINDOWS + 1))
    assert_close(params_of(net), expected[-1])

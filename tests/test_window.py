"""TrainWindowCell: one call per window equals K calls of TrainAccumulationCell, bit for bit.

The reference is the library's own fused micro-step Cell (itself tested against the big batch in
test_equivalence.py) on the same micro-batches from the same weights. Both add the same float32 gradients in the
same order, so parameters, losses and optimizer state agree exactly.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, amp, nn

from ms_accum import TrainForwardBackward, TrainOptim
from ms_accum.core import AccumulationBuffer
from ms_accum.graphs import TrainAccumulationCell, TrainWindowCell
from ms_accum.graphs.cells import HostSteppedAccumulationCell, _CheckWindow, _StepWindow
from ms_accum.graphs.window import HostSteppedWindowCell
from conftest import make_optimizer, raises_exactly

K, B, FEATURES, CLASSES, WINDOWS = 4, 5, 6, 3, 3


def small_net(seed: int = 0) -> nn.Cell:
    ms.set_seed(seed)
    return nn.SequentialCell(nn.Dense(FEATURES, 8), nn.ReLU(), nn.Dense(8, CLASSES))


def with_loss(net: nn.Cell) -> nn.Cell:
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def windows(count: int = WINDOWS, seed: int = 0, nan_micro_batch=None):
    """(K, B, FEATURES) images and (K, B) labels per window."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, K, B, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, (count, K, B)).astype(np.int32)
    if nan_micro_batch is not None:
        x[nan_micro_batch] = np.nan  # (window, micro-batch): one sample poisons that micro-batch
    return x, y


def params_of(opt):
    return [p.asnumpy().copy() for p in opt.parameters]


def optimizer_state(opt):
    return {p.name: p.asnumpy().copy() for p in opt.get_parameters()}


def twins(optimizer: str = "momentum", **kwargs):
    """(window cell, its optimizer), (fused cell, its optimizer): identical weights, identical settings."""
    cells = []
    for cls in (TrainWindowCell, TrainAccumulationCell):
        net = small_net()
        opt = make_optimizer(optimizer, net.trainable_params())
        cells.append((cls(with_loss(net), opt, K, **kwargs).set_train(), opt))
    return cells


def assert_buffer_empty(cell):
    assert not any(g.asnumpy().any() for g in cell.buffer.grad_sum)
    assert int(cell.buffer.mini_step.asnumpy()) == 0 and float(cell.buffer.num_samples.asnumpy()) == 0.0


CASES = {
    "momentum": ("momentum", {}),
    "adam": ("adam", {}),  # Adam(eps=1e-6), conftest.make_optimizer
    # clip_norm far below the gradients' norm (~1), so every window is clipped, and clipped after unscaling.
    "clip_scaled": ("momentum", {"clip_norm": 0.05, "loss_scaler": amp.StaticLossScaler(1024.0)}),
    "sum": ("momentum", {"reduction": "sum"}),
}


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("case", list(CASES))
def test_window_equals_k_fused_micro_steps(case):
    optimizer, kwargs = CASES[case]
    (window, window_opt), (fused, fused_opt) = twins(optimizer, **kwargs)
    start = params_of(window_opt)
    x, y = windows()
    for w in range(WINDOWS):
        losses = window(Tensor(x[w]), Tensor(y[w]))
        expected = [fused(Tensor(x[w, i]), Tensor(y[w, i])).asnumpy() for i in range(K)]
        assert losses.shape == (K,)
        np.testing.assert_array_equal(losses.asnumpy(), np.stack(expected))
        for a, e in zip(params_of(window_opt), params_of(fused_opt)):
            np.testing.assert_array_equal(a, e)
        assert_buffer_empty(window)
    assert all((a != s).any() for a, s in zip(params_of(window_opt), start))  # it did train
    state, expected_state = optimizer_state(window_opt), optimizer_state(fused_opt)
    for name in expected_state:  # moments, Adam's beta powers: the optimizer ran exactly WINDOWS times
        np.testing.assert_array_equal(state[name], expected_state[name], err_msg=name)


def test_pynative_equals_graph():
    x, y = windows(count=2)
    results = []
    for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE):
        ms.set_context(mode=mode)
        net = small_net()
        opt = make_optimizer("momentum", net.trainable_params())
        cell = TrainWindowCell(with_loss(net), opt, K).set_train()
        for w in range(2):
            cell(Tensor(x[w]), Tensor(y[w]))
        results.append(params_of(opt))
    ms.set_context(mode=ms.GRAPH_MODE)
    for a, e in zip(*results):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_partial_window_through_the_three_graphs_on_the_same_buffer():
    # What the executor does at an epoch's end: full windows through TrainWindowCell, then the last 2 micro-batches
    # through TrainForwardBackward + TrainOptim sharing its buffer; the reference runs all 6 through the fused Cell.
    x, y = windows(count=2)
    cells, buffers = [], []
    for cls in (TrainWindowCell, TrainAccumulationCell):
        net = small_net()
        opt = make_optimizer("momentum", net.trainable_params())
        buffers.append(AccumulationBuffer(opt.parameters))
        cells.append((cls(with_loss(net), opt, K, buffer=buffers[-1]).set_train(), opt))
    (window, opt), (fused, ref_opt) = cells
    forward_backward = TrainForwardBackward(window.network, opt, buffers[0]).set_train()
    window(Tensor(x[0]), Tensor(y[0]))
    for i in range(2):
        forward_backward(Tensor(x[1, i]), Tensor(y[1, i]))
        fused(Tensor(x[0, i]), Tensor(y[0, i]))
    for i in range(2, K):
        fused(Tensor(x[0, i]), Tensor(y[0, i]))
    for i in range(2):
        fused(Tensor(x[1, i]), Tensor(y[1, i]))
    for a, e in zip(window.buffer.grad_sum, fused.buffer.grad_sum):  # the open partial window, accumulated alike
        np.testing.assert_array_equal(a.asnumpy(), e.asnumpy())
    TrainOptim(opt, buffers[0]).set_train()()
    TrainOptim(ref_opt, buffers[1]).set_train()()
    for a, e in zip(params_of(opt), params_of(ref_opt)):
        np.testing.assert_array_equal(a, e)


def test_a_shorter_window_trains_the_first_micro_batches_of_the_stack_only():
    # What the executor does with an epoch's partial window: stacked to K, the Cell, compiled on a whole window, told
    # to train the first 2. The stack's rest is other data, whose losses would show in the output; the reference is
    # the fused Cell on the same micro-batches, its partial window applied by TrainOptim.
    x, y = windows(count=2)
    (window, window_opt), (fused, fused_opt) = twins()
    window(Tensor(x[0]), Tensor(y[0]))
    for i in range(K):
        fused(Tensor(x[0, i]), Tensor(y[0, i]))
    window.set_micro_batches(2)
    losses = window(Tensor(x[1]), Tensor(y[1])).asnumpy()
    expected = [float(fused(Tensor(x[1, i]), Tensor(y[1, i])).asnumpy()) for i in range(2)]
    np.testing.assert_array_equal(losses, np.array(expected + [0.0, 0.0], np.float32))
    assert_buffer_empty(window)
    TrainOptim(fused_opt, fused.buffer).set_train()()
    for a, e in zip(params_of(window_opt), params_of(fused_opt)):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("count,error,message", [
    (0, ValueError, "must be a positive int, but got 0."),
    (K + 1, ValueError, f"must be at most 'accumulate_step' ({K}), but got {K + 1}."),
    (1.5, TypeError, "must be a positive int, but got 1.5 of type float.")])
def test_bad_micro_batch_count(count, error, message):
    (window, _), _ = twins()
    with raises_exactly(error, f"For 'TrainWindowCell.set_micro_batches', the argument 'count' {message}"):
        window.set_micro_batches(count)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("policy", ["skip_window", "skip_microbatch"])
def test_non_finite_micro_batch_handled_as_the_fused_cell_does(policy):
    (window, window_opt), (fused, fused_opt) = twins(policy=policy)
    x, y = windows(nan_micro_batch=(1, 2))
    for w in range(WINDOWS):
        window(Tensor(x[w]), Tensor(y[w]))
        for i in range(K):
            fused(Tensor(x[w, i]), Tensor(y[w, i]))
    for a, e in zip(params_of(window_opt), params_of(fused_opt)):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, e)
    counters = ("skipped_windows", "skipped_micro_batches", "window_bad")
    assert {c: int(getattr(window.buffer.guard, c).asnumpy()) for c in counters} == \
        {c: int(getattr(fused.buffer.guard, c).asnumpy()) for c in counters}
    assert int(window.buffer.guard.skipped_windows.asnumpy()) == (policy == "skip_window")


def test_wrong_window_length_is_refused_before_the_graph_runs():
    (window, _), _ = twins()
    x, y = windows(count=1)
    with raises_exactly(ValueError, f"For 'TrainWindowCell', the inputs' leading axis must be 'accumulate_step' long "
                                    f"({K}), but got shape {x[0, :K - 1].shape}."):
        window(Tensor(x[0, :K - 1]), Tensor(y[0, :K - 1]))


@pytest.mark.parametrize("value,error,got", [
    (0, ValueError, "0"), (-2, ValueError, "-2"), (1.5, TypeError, "1.5 of type float"),
    (None, TypeError, "None of type NoneType"), (True, TypeError, "True of type bool")])
def test_bad_accumulate_step(value, error, got):
    net = with_loss(small_net())
    with raises_exactly(error, f"For 'TrainWindowCell', the argument 'accumulate_step' must be a positive int, but got "
                               f"{got}."):
        TrainWindowCell(net, nn.SGD(net.trainable_params(), 0.1), value)


def test_bad_arguments():
    net = with_loss(small_net())
    opt = nn.SGD(net.trainable_params(), 0.1)
    with raises_exactly(TypeError, "For 'TrainWindowCell', the argument 'optimizer' must be Optimizer, but got None of "
                                   "type NoneType."):
        TrainWindowCell(net, None, K)
    function = lambda x: x  # noqa: E731
    with raises_exactly(TypeError, f"For 'TrainWindowCell', the argument 'network' must be Cell, but got {function!r} "
                                   f"of type function."):
        TrainWindowCell(function, opt, K)
    with raises_exactly(ValueError, "For 'TrainWindowCell', the argument 'network' must have trainable parameters, but "
                                    "got none."):
        TrainWindowCell(nn.WithLossCell(nn.ReLU(), nn.MSELoss()), opt, K)
    with raises_exactly(ValueError, "For 'TrainWindowCell', the argument 'clip_norm' must be a positive float, but got "
                                    "0.0."):
        TrainWindowCell(net, opt, K, clip_norm=0.0)
    with raises_exactly(ValueError, "For 'TrainWindowCell', the argument 'reduction' must be one of ['mean', 'sum', "
                                    "'weighted_mean'], but got 'avg'."):  # its buffer's check, in its name
        TrainWindowCell(net, opt, K, reduction="avg")
    with raises_exactly(ValueError, "For 'TrainWindowCell', the argument 'policy' must be one of ['skip_window', "
                                    "'skip_microbatch'], but got 'bad'."):
        TrainWindowCell(net, opt, K, policy="bad")
    with raises_exactly(TypeError, "For 'TrainWindowCell', the argument 'buffer' must be AccumulationBuffer, but got "
                                   "[] of type list."):
        TrainWindowCell(net, opt, K, buffer=[])
    with raises_exactly(ValueError, "For 'TrainWindowCell', the argument 'buffer' must hold one gradient per optimizer "
                                    "parameter (4), but holds 1."):
        TrainWindowCell(net, opt, K, buffer=AccumulationBuffer(opt.parameters[:1]))
    with raises_exactly(ValueError, "For 'TrainWindowCell', the arguments 'policy' and 'loss_scaler' belong to the "
                                    "buffer: pass them to the AccumulationBuffer given as 'buffer', not here."):
        TrainWindowCell(net, opt, K, buffer=AccumulationBuffer(opt.parameters), policy="skip_microbatch")


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_sparse_gradients_equal_the_fused_cell():
    # nn.EmbeddingLookup(sparse=True) yields RowTensor gradients, summed into the dense buffer inside the loop.
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 10, (WINDOWS, K, B, 3)).astype(np.int32)
    targets = rng.standard_normal((WINDOWS, K, B, 3, 2)).astype(np.float32)
    cells = []
    for cls in (TrainWindowCell, TrainAccumulationCell):
        ms.set_seed(0)
        net = nn.WithLossCell(nn.SequentialCell(nn.EmbeddingLookup(10, 4, sparse=True), nn.Dense(4, 2)),
                              nn.MSELoss())
        opt = make_optimizer("momentum", net.trainable_params())
        cells.append((cls(net, opt, K).set_train(), opt))
    (window, window_opt), (fused, fused_opt) = cells
    for w in range(WINDOWS):
        window(Tensor(ids[w]), Tensor(targets[w]))
        for i in range(K):
            fused(Tensor(ids[w, i]), Tensor(targets[w, i]))
    for a, e in zip(params_of(window_opt), params_of(fused_opt)):
        np.testing.assert_array_equal(a, e)


def test_an_open_window_in_the_buffer_is_refused():
    # A window is the micro-batches of one call: micro-batches left in the buffer would join it unseen.
    net = with_loss(small_net())
    opt = nn.SGD(net.trainable_params(), 0.1)
    buffer = AccumulationBuffer(opt.parameters)
    window = TrainWindowCell(net, opt, K, buffer=buffer)
    x, y = windows(1)
    x, y = x[0], y[0]
    TrainForwardBackward(net, opt, buffer)(Tensor(x[0]), Tensor(y[0]))
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    with raises_exactly(RuntimeError, "For 'TrainWindowCell', the buffer must hold no open window when called, but it "
                                      "holds 1 micro-batch(es): close it first (TrainOptim and TrainClear)."):
        window(Tensor(x), Tensor(y))
    assert all(np.array_equal(p.asnumpy(), b) for p, b in zip(net.trainable_params(), before))


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("case", ["momentum", "clip_scaled"])
def test_the_executors_cells_leave_the_step_to_the_host_and_equal_the_public_ones(case):
    # HostSteppedWindowCell and HostSteppedAccumulationCell (the executor's "window" and "fused") end with the buffer's
    # check and return its verdict; the host then runs the step. Bit-identical to the Cells that step in their graph.
    optimizer, kwargs = CASES[case]
    (window, window_opt), (fused, fused_opt) = twins(optimizer, **kwargs)
    hosted = []
    for cls in (HostSteppedWindowCell, HostSteppedAccumulationCell):
        net = small_net()
        opt = make_optimizer(optimizer, net.trainable_params())
        cell = cls(with_loss(net), opt, K, **kwargs).set_train()
        hosted.append((cell, opt, _StepWindow(opt, cell.buffer).set_train()))
    (h_window, h_window_opt, window_step), (h_fused, h_fused_opt, fused_step) = hosted
    x, y = windows()
    for w in range(WINDOWS):
        window(Tensor(x[w]), Tensor(y[w]))
        before = params_of(h_window_opt)
        _, verdict = h_window(Tensor(x[w]), Tensor(y[w]))
        assert bool(verdict.asnumpy()) and all(np.array_equal(a, b) for a, b in zip(before, params_of(h_window_opt)))
        window_step()
        for k in range(K):
            fused(Tensor(x[w, k]), Tensor(y[w, k]))
            _, verdict = h_fused(Tensor(x[w, k]), Tensor(y[w, k]))
            assert bool(verdict.asnumpy()) is (k == K - 1)  # only the K-th call checks the window
        fused_step()
        assert_buffer_empty(h_window)
        assert_buffer_empty(h_fused)
    for reference, hosted_opt in ((window_opt, h_window_opt), (fused_opt, h_fused_opt)):
        assert all(np.array_equal(a, b) for a, b in zip(params_of(reference), params_of(hosted_opt)))
        assert optimizer_state(reference).keys() and all(
            np.array_equal(a, b) for a, b in zip(optimizer_state(reference).values(),
                                                 optimizer_state(hosted_opt).values()))


@pytest.mark.parametrize("cls", [HostSteppedWindowCell, HostSteppedAccumulationCell])
def test_the_executors_cells_built_not_to_check_leave_the_window_to_the_host(cls):
    # checks=False (the executor in data parallel, where the host reduces the buffer first): the graph holds no check,
    # its verdict is False and the window stays open and undivided; the host's check and step then equal the public
    # Cell's window.
    _, kwargs = CASES["clip_scaled"]
    (reference, reference_opt), _ = twins(**kwargs)
    net = small_net()
    opt = make_optimizer("momentum", net.trainable_params())
    cell = cls(with_loss(net), opt, K, checks=False, **kwargs).set_train()
    check, step = _CheckWindow(cell.buffer, kwargs["clip_norm"]).set_train(), _StepWindow(opt, cell.buffer).set_train()
    x, y = windows()
    for w in range(WINDOWS):
        reference(Tensor(x[w]), Tensor(y[w]))
        calls = [cell(Tensor(x[w]), Tensor(y[w]))] if cls is HostSteppedWindowCell else [
            cell(Tensor(x[w, k]), Tensor(y[w, k])) for k in range(K)]
        assert not any(bool(verdict.asnumpy()) for _, verdict in calls)
        assert int(cell.buffer.mini_step.asnumpy()) == K  # still open: nothing checked, stepped or cleared
        assert bool(check().asnumpy())
        step()
        assert_buffer_empty(cell)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(reference_opt), params_of(opt)))
    with pytest.raises(TypeError, match="'checks'"):
        bad = small_net()
        cls(with_loss(bad), make_optimizer("momentum", bad.trainable_params()), K, checks=1)

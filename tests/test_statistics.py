"""What is in the window: each micro-batch's gradient norm and the window's, measured in the graph; the gradient noise
scale against the exact answer."""
import os
import sys

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, amp, nn

from ms_accum import GradientAccumulation, TokenCrossEntropy, TrainForwardBackward, TrainOptim
from ms_accum.core import AccumulationBuffer
from ms_accum.core.statistics import NoiseScale
from ms_accum.train.options import QUIET, Checkpoints
from conftest import raises_exactly

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "dist_scripts"))
from dp_cases import regression_problem  # noqa: E402  (shared with the msrun workers)


def mlp(activation=nn.Tanh):
    ms.set_seed(0)
    return nn.SequentialCell([nn.Dense(6, 8), activation(), nn.Dense(8, 3)])


def wide_mlp():
    """An MLP with a tensor above `_ops.SMALL_TENSOR` (300 x 256 = 76800 elements) and small ones: both ways of summing
    squares."""
    ms.set_seed(0)
    return nn.SequentialCell([nn.Dense(6, 300), nn.Tanh(), nn.Dense(300, 256), nn.Tanh(), nn.Dense(256, 3)])


class Tagger(nn.Cell):
    """A token tagger whose input's last axis holds (token, scale): the scale multiplies the token's embedding."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 5)
        self.head = nn.Dense(5, vocab)

    def construct(self, inputs):
        tokens, scale = inputs[..., 0].astype(ms.int32), inputs[..., 1:]
        return self.head(self.embed(tokens) * scale)


def tagger_inputs(tokens, scale=None):
    """`Tagger`'s input: the tokens beside their scales (1 by default)."""
    scale = np.ones(tokens.shape, np.float32) if scale is None else scale
    return np.stack([tokens.astype(np.float32), scale], axis=-1)


def numpy_grads(net, loss, x, y):
    """The gradient of `loss` (a mean) on (x, y) with respect to `net`'s parameters, flattened, from a plain
    value_and_grad in PyNative (no accumulation involved)."""
    def forward(a, b):
        return loss(net(a), b)

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        _, grads = ms.value_and_grad(forward, None, net.trainable_params())(Tensor(x), Tensor(y))
    finally:
        ms.set_context(mode=mode)
    return np.concatenate([g.asnumpy().ravel() for g in grads]).astype(np.float64)


@pytest.mark.parametrize("shapes", [
    [(), (1,), (3, 4), (100, 100), (8192,), (8193,)],  # scalars, both sides of SMALL_TENSOR
    [(100, 100), (90, 91)],  # large tensors only
    [(5,)],  # one small tensor
])
def test_both_squared_norms_equal_numpys_on_any_shapes(shapes):
    # A micro-batch's gradients (`grads_squared_norm`: small ones concatenated, a large one's dot weighted by 1) and a
    # buffer's (`half_squared_norm`: one sum per tensor) against float64 numpy, within float32 rounding.
    from ms_accum.core import _ops

    @ms.jit
    def norms(tensors):
        doubled = ms.ops.HyperMap()(ms.ops.partial(ms.ops.mul, 2.0), tensors)  # intermediates, as gradients are
        return _ops.grads_squared_norm(doubled), _ops.half_squared_norm(tensors)

    rng = np.random.default_rng(1)
    values = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    grads_sq, buffer_half = (float(v.asnumpy()) for v in norms(tuple(Tensor(v) for v in values)))
    exact = sum(float((v.astype(np.float64) ** 2).sum()) for v in values)
    assert grads_sq == pytest.approx(4.0 * exact, rel=2e-6)
    assert buffer_half == pytest.approx(0.5 * exact, rel=2e-6)


@pytest.mark.parametrize("structure", ["three_graphs", pytest.param("fused", marks=pytest.mark.slow),
                                       pytest.param("window", marks=pytest.mark.slow)])
def test_record_carries_each_micro_batchs_norm_and_the_windows_before_clipping(structure):
    # SGD with lr 0 keeps the parameters, so every window's gradients can be recomputed from the data; a loss scaler
    # and clipping must change none of the norms (unscaled, before clipping).
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((24, 6)).astype(np.float32), rng.integers(0, 3, 24).astype(np.int32)
    net, loss = wide_mlp(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), 0.0), clip_norm=1e-3,
                                 structure=structure, loss_scaler=amp.StaticLossScaler(1024.0), statistics=True)
    result = model.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4), 3,
                                 ckpt_dir=None, verbose=False)
    for w, record in enumerate(result.steps):
        micro = [numpy_grads(net, loss, x[i:i + 4], y[i:i + 4]) for i in range(12 * w, 12 * w + 12, 4)]
        np.testing.assert_allclose(record.micro_batch_grad_norms, [np.linalg.norm(g) for g in micro], rtol=1e-5)
        window = numpy_grads(net, loss, x[12 * w:12 * w + 12], y[12 * w:12 * w + 12])
        np.testing.assert_allclose(record.grad_norm, np.linalg.norm(window), rtol=1e-5)
        assert record.noise_scale is None  # not asked for


@pytest.mark.parametrize("structure", ["three_graphs", pytest.param("fused", marks=pytest.mark.slow),
                                       pytest.param("window", marks=pytest.mark.slow)])
@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_statistics_are_off_by_default_and_measuring_changes_no_update(structure):
    # Off, nothing is measured (nan, no norms); on, the same windows train bit for bit the same weights and losses
    # (the fused and window Cells' optimizer step sits in a tensor `if` after the measuring: README, "Known MindSpore
    # behaviour", a constant if/else).
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((24, 6)).astype(np.float32), rng.integers(0, 3, 24).astype(np.int32)
    runs = []
    for statistics in (False, True):
        net = wide_mlp()
        model = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                     nn.Momentum(net.trainable_params(), 0.1, 0.9), structure=structure,
                                     statistics=statistics)
        assert model.statistics is statistics
        result = model.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4), 3,
                                     ckpt_dir=None, verbose=False)
        runs.append((result, [p.asnumpy() for p in net.trainable_params()]))
    (off, off_weights), (on, on_weights) = runs
    # Not measured: None, as the noise scale is when it is not estimated.
    assert all(r.grad_norm is None and r.noise_scale is None and r.micro_batch_grad_norms == [] for r in off.steps)
    assert all(np.isfinite(r.grad_norm) and len(r.micro_batch_grad_norms) == 3 for r in on.steps)
    assert off.losses == on.losses
    for a, b in zip(off_weights, on_weights):
        np.testing.assert_array_equal(a, b)


def test_token_weighted_norms_are_of_each_micro_batchs_mean_over_its_tokens():
    # Micro-batches of 1 and 5 real tokens: the micro-batch norm is of its own token mean's gradient, the window's of
    # the mean over all its tokens.
    ms.set_seed(0)
    net, loss = Tagger(7), TokenCrossEntropy()
    tokens = tagger_inputs(np.array([[1, 2, 3, 4, 5, 6], [2, 3, 0, 0, 0, 0]], np.int32))
    targets = np.array([[2, 3, 4, 5, 6, -100], [3, -100, -100, -100, -100, -100]], np.int32)
    model = GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), 0.0), reduction="weighted_mean",
                                 statistics=True)
    result = model.train_process(1, ds.NumpySlicesDataset({"x": tokens, "y": targets}, shuffle=False).batch(1), 2,
                                 ckpt_dir=None, verbose=False)

    def mean_loss(out, t):  # the mean over real tokens
        return loss(out, t)[0]

    micro = [numpy_grads(net, mean_loss, tokens[i:i + 1], targets[i:i + 1]) for i in range(2)]
    np.testing.assert_allclose(result.steps[0].micro_batch_grad_norms, [np.linalg.norm(g) for g in micro],
                               rtol=1e-5)
    window = numpy_grads(net, mean_loss, tokens, targets)  # the mean over the 6 real tokens
    np.testing.assert_allclose(result.steps[0].grad_norm, np.linalg.norm(window), rtol=1e-5)


def test_the_cells_return_the_norm_only_when_the_buffer_measures():
    net = nn.WithLossCell(mlp(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    opt = nn.SGD(net.trainable_params(), 0.0)
    x, y = Tensor(np.ones((4, 6), np.float32)), Tensor(np.zeros(4, np.int32))
    plain = TrainForwardBackward(net, opt, AccumulationBuffer(opt.parameters))
    assert plain(x, y).shape == ()
    measured = TrainForwardBackward(net, opt, AccumulationBuffer(opt.parameters, statistics=True))
    loss, (sq_norm, left_out) = measured(x, y)
    assert loss.shape == () and float(sq_norm.asnumpy()) > 0 and float(left_out.asnumpy()) == 0
    with raises_exactly(TypeError, "For 'AccumulationBuffer', the argument 'statistics' must be bool, but got 1 of "
                                   "type int."):
        AccumulationBuffer(opt.parameters, statistics=1)

    # A norm, not a copy: measuring adds one float32 scalar; the outlier filter's running statistics 5 more floats.
    def nbytes(buffer):
        return sum(p.nbytes for p in buffer.parameters() + buffer.statistics.parameters())
    base = nbytes(AccumulationBuffer(opt.parameters))
    assert nbytes(AccumulationBuffer(opt.parameters, statistics=True)) - base == 4
    assert nbytes(AccumulationBuffer(opt.parameters, skip_outliers=6.0)) - base == 4 * 6


@pytest.mark.parametrize("statistics", [False, True])
def test_a_window_that_is_not_finite_is_skipped_whether_its_norm_is_measured_or_not(statistics):
    # Measuring reads the window before the guard's check does: the check must still find an infinite element that
    # the loss test cannot see, after a finite window (whose norm a wrong read would find).
    net = nn.WithLossCell(mlp(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    opt = nn.SGD(net.trainable_params(), 0.1)
    buffer = AccumulationBuffer(opt.parameters, statistics=statistics)
    forward_backward, close = TrainForwardBackward(net, opt, buffer), TrainOptim(opt, buffer, clear=True)
    x, y = Tensor(np.ones((4, 6), np.float32)), Tensor(np.zeros(4, np.int32))
    forward_backward(x, y)
    assert bool(close().asnumpy())
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    forward_backward(x, y)
    grad = buffer.grad_sum[0].asnumpy().copy()
    grad[0, 0] = np.inf  # the loss stays finite: only the window's check can find it
    buffer.grad_sum[0].set_data(Tensor(grad))
    assert not bool(close().asnumpy())
    assert int(buffer.guard.skipped_windows.asnumpy()) == 1
    for param, old in zip(net.trainable_params(), before):
        np.testing.assert_array_equal(param.asnumpy(), old)
    assert not buffer.grad_sum[0].asnumpy().any()  # cleared for the next window


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("k, batch", [(2, 4), (2, 16), (8, 4), (8, 16)])
def test_noise_scale_matches_the_data_sets_exact_value(k, batch):
    # Learning rate 0 holds the parameters, so the data set's tr(Σ)/|G|² is the exact answer the estimate must reach:
    # within 10% after 1000 windows, or 40000 samples where those are fewer windows (K=8 x 16: 312). The moving
    # averages forget with β = 0.99 (about the last 100 windows) and their bias correction is gone after about 500:
    # more windows would not average the estimate over more of them.
    net, x, y, exact = regression_problem(min(40000, 1000 * k * batch), 12.0)
    ds.config.set_seed(1)
    model = GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), noise_scale=True)
    result = model.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(batch), k,
                                 ckpt_dir=None, verbose=False)
    assert abs(result.steps[-1].noise_scale / exact - 1) < 0.10, (result.steps[-1].noise_scale, exact)


def test_noise_scale_needs_two_batch_sizes_and_a_mean():
    net, x, y, _ = regression_problem(64, 12.0)
    model = GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), noise_scale=True)
    tail = ("noise_scale=True on one rank: the noise scale compares the micro-batch's gradient with the window's, and "
            "with one micro-batch per window they are one batch size, but got ")
    for mini_steps, got in ((1, "1"), (lambda samples: 1, "a schedule that is 1 in every window of this run"),
                            ({0: 1, 10 ** 6: 4}, "a schedule that is 1 in every window of this run")):
        with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'mini_steps' must be "
                                        f"at least 2 in some window with {tail}{got}."):
            model.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}).batch(4), mini_steps, ckpt_dir=None)
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'noise_scale' needs the window's mean "
                                    "(reduction 'mean' or 'weighted_mean'), but got reduction 'sum'."):
        GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), reduction="sum",
                             noise_scale=True)
    with raises_exactly(TypeError, "For 'GradientAccumulation', the argument 'noise_scale' must be bool, but got 1 of "
                                   "type int."):
        GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), noise_scale=1)
    with raises_exactly(TypeError, "For 'GradientAccumulation', the argument 'statistics' must be bool, but got 'yes' "
                                   "of type str."):
        GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), statistics="yes")


def test_the_noise_scale_is_each_runs_own_and_a_resumed_run_continues_it(tmp_path):
    # Learning rate 0 holds the parameters, so every run sees the same gradients: a second run of the same executor
    # starts its own estimate (the first run's estimates again), and a run resumed from a training state saved after
    # window 3 continues the estimate saved with it (the uninterrupted run's estimates, exactly).
    net, x, y, _ = regression_problem(96, 12.0)

    def train(model, checkpoints):
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
        return [record.noise_scale for record in model.train_process(1, data, 4, checkpoints=checkpoints,
                                                                     log=QUIET).steps]

    def executor():
        return GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.0), noise_scale=True)

    model = executor()
    first = train(model, Checkpoints(tmp_path, save_every=3, keep_last=None))
    assert len(first) == 6 and first[3:] != [None] * 3
    assert train(model, None) == first
    saved = os.path.join(tmp_path, "gradient_accumulation-000000003.ckpt")
    assert train(executor(), Checkpoints(tmp_path / "resumed", resume=saved)) == first[3:]


def test_noise_scale_estimator_by_hand():
    # |G|² = 4 and tr(Σ) = 32 give E|g_b|² = 4 + 32 / b: the estimator recovers 8 from exact expectations.
    estimator = NoiseScale()
    for _ in range(3):
        value = estimator.update(4 + 32 / 4, 4, 4 + 32 / 16, 16)
    assert value == pytest.approx(8.0) and estimator.windows == 3
    restored = NoiseScale()
    restored.load(estimator.state())
    assert restored.value == estimator.value


B, K, N_BATCHES, BAD = 8, 4, 40, 25  # the outlier: batch 25, in the window of batches 24-27
WITHOUT_BAD = {0: K, 24 * B: 3, 27 * B: K}  # the same windows with batch 25 taken out


def outlier_data():
    """40 micro-batches of 8; batch 25's inputs are 1000 times larger and its labels scrambled (a loss spike)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N_BATCHES * B, 6)).astype(np.float32)
    y = rng.integers(0, 3, N_BATCHES * B).astype(np.int32)
    bad = slice(BAD * B, (BAD + 1) * B)
    x[bad] *= 1000
    y[bad] = (y[bad] + 1) % 3
    return x, y


def train_outliers(x, y, mini_steps, structure="three_graphs", **kwargs):
    net = mlp(nn.ReLU)  # unbounded: larger inputs make a spike in the loss
    model = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                 nn.Momentum(net.trainable_params(), 0.05, 0.9), structure=structure,
                                 skip_outliers=6.0, outlier_warmup=8)
    result = model.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B), mini_steps,
                                 ckpt_dir=kwargs.pop("ckpt_dir", None), verbose=False, **kwargs)
    return net, model, result


@pytest.mark.parametrize("structure", ["three_graphs", pytest.param("fused", marks=pytest.mark.slow),
                                       pytest.param("window", marks=pytest.mark.slow)])
@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_an_outlier_micro_batch_is_left_out_as_if_it_were_not_there(structure):
    x, y = outlier_data()
    net, _, result = train_outliers(x, y, K, structure)
    assert result.outliers == [(1, BAD)] and result.skipped_micro_batches == 1
    assert all(type(index) is int for index in result.outliers[0])  # plain ints: the CLI's --json prints them
    assert result.steps[BAD // K].outliers == [BAD] and result.steps[BAD // K].micro_batches == K
    keep = np.r_[0:BAD * B, (BAD + 1) * B:N_BATCHES * B]
    reference, _, clean = train_outliers(x[keep], y[keep], WITHOUT_BAD, structure)
    assert clean.outliers == []
    for a, b in zip(net.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-7)
    # It was a spike: over 100 times the loss of an ordinary micro-batch, at the trained weights.
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    losses = [float(loss(net(Tensor(x[i * B:(i + 1) * B])), Tensor(y[i * B:(i + 1) * B])).asnumpy())
              for i in range(N_BATCHES)]
    assert losses[BAD] > 100 * np.median(losses)


@pytest.mark.slow  # make test-all
def test_the_outlier_statistics_resume_with_the_training_state(tmp_path):
    x, y = outlier_data()
    _, whole, _ = train_outliers(x, y, K, ckpt_dir=str(tmp_path / "whole"), save_every=1)

    class Stop(Exception):
        pass

    def stop_at_7(record):
        if record.step == 7:  # after the outlier's window: its statistics must come back from the file
            raise Stop
    with pytest.raises(Stop):
        train_outliers(x, y, K, ckpt_dir=str(tmp_path / "cut"), save_every=1, on_step=stop_at_7)
    net, resumed, result = train_outliers(x, y, K, ckpt_dir=str(tmp_path / "cut"), save_every=1, resume=True)
    assert result.resumed_from.endswith("-000000006.ckpt") and result.steps[0].step == 7
    for name in ("seen", "mean", "var"):
        assert np.array_equal(getattr(resumed.buffer.statistics, name).asnumpy(),
                              getattr(whole.buffer.statistics, name).asnumpy()), name
    for a, b in zip(resumed.network.trainable_params(), whole.network.trainable_params()):
        assert np.array_equal(a.asnumpy(), b.asnumpy()), a.name


@pytest.mark.slow  # make test-all
def test_a_token_weighted_outlier_is_left_out_with_its_tokens():
    # Micro-batches of 1 to 6 real tokens; batch 9's embeddings are hit by tokens whose targets are scrambled and
    # whose loss is scaled by a spike in the inputs: leaving it out corrects the divisor by its tokens.
    ms.set_seed(0)
    rng = np.random.default_rng(1)
    vocab, length, n = 11, 6, 16
    tokens = rng.integers(1, vocab, (n, length)).astype(np.int32)
    targets = rng.integers(0, vocab, (n, length)).astype(np.int32)
    for i in range(n):
        targets[i, 1 + i % length:] = -100
    scale = np.ones((n, length), np.float32)
    scale[9] = 300.0
    inputs = tagger_inputs(tokens, scale)

    def run(keep, schedule):
        ms.set_seed(0)
        net = Tagger(vocab)
        model = GradientAccumulation(net, TokenCrossEntropy(), nn.SGD(net.trainable_params(), 0.1),
                                     reduction="weighted_mean", skip_outliers=6.0, outlier_warmup=4)
        data = {"x": inputs[keep], "y": targets[keep]}
        result = model.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(1), schedule,
                                     ckpt_dir=None, verbose=False)
        return net, result

    net, result = run(np.arange(n), 4)
    assert result.outliers == [(1, 9)]
    reference, clean = run(np.r_[0:9, 10:n], {0: 4, 8: 3, 11: 4})
    assert clean.outliers == []
    for a, b in zip(net.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-7)


def test_a_warmup_of_zero_judges_only_after_eight_micro_batches():
    x, y = outlier_data()
    net = mlp(nn.ReLU)
    model = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                 nn.Momentum(net.trainable_params(), 0.05, 0.9), skip_outliers=6.0, outlier_warmup=0)
    result = model.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B), K,
                                 ckpt_dir=None, verbose=False)
    assert result.outliers == [(1, BAD)]  # not every micro-batch, as a variance of 0 or of two would make them


def test_a_lasting_shift_is_followed_not_locked_out():
    # From batch 12 on, every input is 30 times larger: the first shifted micro-batches are outliers, but the clipped
    # updates carry the statistics to the new level, so training goes on with the later ones.
    x, y = outlier_data()
    x, y = x[:N_BATCHES * B].copy(), y.copy()
    x[12 * B:] *= 30
    net = mlp(nn.ReLU)
    model = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                 nn.SGD(net.trainable_params(), 0.0), skip_outliers=6.0, outlier_warmup=8)
    # The first shifted window loses all four micro-batches: with nothing left it is skipped, and the warning says why.
    with pytest.warns(RuntimeWarning, match="epoch 1 step 4: every micro-batch of the window was left out as an "
                                            "outlier, so it was skipped"):
        result = model.train_process(3, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B), K,
                                     ckpt_dir=None, verbose=False)
    assert result.outliers and result.outliers[0] == (1, 12)
    assert result.steps[-1].outliers == [] and not result.steps[-1].skipped  # the last window is whole again


@pytest.mark.parametrize("kwargs, error, message", [
    ({"skip_outliers": 0}, ValueError, "the argument 'skip_outliers' must be a positive float, but got 0."),
    ({"skip_outliers": -6.0}, ValueError, "the argument 'skip_outliers' must be a positive float, but got -6.0."),
    ({"skip_outliers": "6"}, TypeError,
     "the argument 'skip_outliers' must be a positive float, but got '6' of type str."),
    ({"skip_outliers": True}, TypeError,
     "the argument 'skip_outliers' must be a positive float, but got True of type bool."),
    ({"skip_outliers": 6.0, "outlier_warmup": -1}, ValueError, "the argument 'outlier_warmup' must be a "
                                                               "non-negative int, but got -1."),
    ({"skip_outliers": 6.0, "outlier_warmup": 1.5}, TypeError, "the argument 'outlier_warmup' must be a "
                                                               "non-negative int, but got 1.5 of type float."),
])
def test_bad_outlier_settings(kwargs, error, message):
    net = mlp()
    with raises_exactly(error, f"For 'GradientAccumulation', {message}"):
        GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                             nn.SGD(net.trainable_params()), **kwargs)

"""Sequence models: token-weighted windows equal the large batch's mean over its real tokens, and half-precision
networks accumulate in float32."""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn

from ms_accum import Accumulator, GradientAccumulation, TokenCrossEntropy, TrainForwardBackward, verify_equivalence
from ms_accum.core import AccumulationBuffer, LossOnly, losses
from ms_accum.graphs import TrainAccumulationCell, TrainWindowCell
from accumulator_step import accumulator_step
from conftest import raises_exactly

T, F, V, B, K, PAD = 6, 5, 7, 2, 4, -100


def token_batches(count, seed=0, nan_sample=None):
    """(count, T, F) features and (count, T) targets, each sequence 1 to T real tokens long, the rest padding."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, T, F)).astype(np.float32)
    y = rng.integers(0, V, (count, T)).astype(np.int32)
    lengths = rng.choice([1, 1, 2, 6], count)  # micro-batches of very different token counts
    y[np.arange(T)[None, :] >= lengths[:, None]] = PAD
    if nan_sample is not None:
        x[nan_sample] = np.nan
    return x, y


def net(seed=0):
    ms.set_seed(seed)
    return nn.Dense(F, V)  # applied to every position: (B, T, F) -> (B, T, V)


def big_batch(windows, x, y):
    network = net()
    # The large batch's reference: TokenCrossEntropy's mean over all its real tokens.
    step = nn.TrainOneStepCell(nn.WithLossCell(network, LossOnly(TokenCrossEntropy(PAD))),
                               nn.Momentum(network.trainable_params(), 0.1, 0.9)).set_train()
    losses = [float(step(Tensor(x[window]), Tensor(y[window])).asnumpy()) for window in windows]
    return [p.asnumpy() for p in network.trainable_params()], losses


@functools.lru_cache(maxsize=None)
def large_batch(count, windows):
    """`big_batch` on `token_batches(count)`, a step per window (start, stop); once per module for the tests and
    structures compared with it (nothing mutates what it returns)."""
    x, y = token_batches(count)
    return big_batch([slice(*window) for window in windows], x, y)


def close(actual, expected):
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("structure", ["three_graphs", "fused", "window"])
def test_token_weighted_windows_equal_the_large_batch(structure):
    # 10 micro-batches of 2 sequences, K=4: windows of 8, 8 and a partial 4 sequences, token counts 2 to 12 each.
    x, y = token_batches(20)
    counts = [(y[i:i + B] != PAD).sum() for i in range(0, 20, B)]
    assert max(counts) >= 3 * min(counts)  # the case a mean of micro-batch means gets wrong
    expected, expected_losses = large_batch(20, ((0, 8), (8, 16), (16, 20)))
    network = net()
    executor = GradientAccumulation(network, TokenCrossEntropy(PAD), nn.Momentum(network.trainable_params(), 0.1, 0.9),
                                    reduction="weighted_mean", structure=structure)
    result = executor.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B), K,
                                    ckpt_dir=None, verbose=False)
    assert [r.micro_batches for r in result.steps] == [4, 4, 2]
    close([p.asnumpy() for p in network.trainable_params()], expected)
    # The logged loss is the window's mean over its tokens: the large batch's loss at the same weights.
    np.testing.assert_allclose(result.losses, expected_losses, rtol=1e-5)


def test_a_mean_of_micro_batch_means_would_differ():
    # The control: weighting by samples, as for images, misses the large batch here.
    x, y = token_batches(8)
    expected, _ = large_batch(8, ((0, 8),))
    network = net()
    executor = GradientAccumulation(network, LossOnly(TokenCrossEntropy(PAD)),
                                    nn.Momentum(network.trainable_params(), 0.1, 0.9))
    executor.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B), K, ckpt_dir=None,
                           verbose=False)
    differences = [np.abs(p.asnumpy() - e).max() for p, e in zip(network.trainable_params(), expected)]
    assert max(differences) > 1e-3


def test_a_dropped_micro_batch_leaves_its_tokens_out_of_the_divisor():
    x, y = token_batches(8, nan_sample=2)  # the second micro-batch (samples 2, 3) is not finite
    keep = [0, 1, 4, 5, 6, 7]
    expected, _ = big_batch([keep], x, y)
    network = net()
    executor = GradientAccumulation(network, TokenCrossEntropy(PAD), nn.Momentum(network.trainable_params(), 0.1, 0.9),
                                    reduction="weighted_mean", policy="skip_microbatch")
    result = executor.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B), K,
                                    ckpt_dir=None, verbose=False)
    assert result.skipped_micro_batches == 1 and result.skipped_windows == 0
    close([p.asnumpy() for p in network.trainable_params()], expected)


def test_accumulator_weighted_by_token_counts():
    x, y = token_batches(8)
    expected, _ = large_batch(8, ((0, 8),))
    network = net()
    accumulator = Accumulator(nn.Momentum(network.trainable_params(), 0.1, 0.9), K)
    step = accumulator_step(network, TokenCrossEntropy(PAD), accumulator, weight="returned")
    for i in range(0, 8, B):
        step(Tensor(x[i:i + B]), Tensor(y[i:i + B]))
    close([p.asnumpy() for p in network.trainable_params()], expected)


def half_network(seed=0):
    ms.set_seed(seed)
    network = nn.Dense(F, V)
    for p in network.get_parameters():
        p.set_dtype(ms.float16)
    return network


def window_gradient(dtype):
    """The mean gradient of 16 micro-batches of a float16 network, accumulated in a `dtype` buffer (None: default)."""
    network = half_network()
    with_loss = nn.WithLossCell(network, nn.MSELoss())
    optimizer = nn.SGD(network.trainable_params(), 0.1)
    buffer = AccumulationBuffer(optimizer.parameters, dtype=dtype)
    step = TrainForwardBackward(with_loss, optimizer, buffer).set_train()
    rng = np.random.default_rng(3)
    for _ in range(16):  # small gradients of varied size: the float16 sum rounds each addition to 11 bits
        x = (rng.standard_normal((B, F)) * 0.05).astype(np.float16)
        step(Tensor(x), Tensor((rng.standard_normal((B, V)) * 0.05).astype(np.float16)))
    divisor = float(buffer.num_samples.asnumpy())
    return buffer, [g.asnumpy().astype(np.float64) / divisor for g in buffer.grad_sum]


def test_half_precision_parameters_accumulate_in_float32():
    buffer, fp32 = window_gradient(None)
    assert all(g.dtype == ms.float32 for g in buffer.grad_sum)  # the default for float16 parameters
    _, fp16 = window_gradient(ms.float16)
    _, reference = window_gradient(ms.float64)  # the same float16 gradients, summed exactly
    error = {name: max(np.abs(g - r).max() / np.abs(r).max() for g, r in zip(grads, reference))
             for name, grads in (("float32 buffer", fp32), ("float16 buffer", fp16))}
    print(f"window gradient, relative error against float64: {error}")
    assert error["float32 buffer"] < 1e-6
    assert error["float16 buffer"] > max(100 * error["float32 buffer"], 1e-4)  # measured: 1.1e-3 against 0.0


def test_half_precision_network_trains_with_the_float32_buffer():
    network = half_network()
    before = [p.asnumpy().copy() for p in network.trainable_params()]
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((16, F)).astype(np.float16),
            "y": rng.standard_normal((16, V)).astype(np.float16)}
    executor = GradientAccumulation(network, nn.MSELoss(), nn.SGD(network.trainable_params(), 0.1))
    result = executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(B), K, ckpt_dir=None,
                                    verbose=False)
    assert len(result.steps) == 2 and result.skipped_windows == 0
    for p, b in zip(network.trainable_params(), before):
        assert p.dtype == ms.float16 and np.isfinite(p.asnumpy()).all() and not np.array_equal(p.asnumpy(), b)


def test_bad_buffer_dtype():
    with raises_exactly(TypeError, "For 'AccumulationBuffer', the argument 'dtype' must be a float mindspore.dtype "
                                   "(mindspore.float32, float16, bfloat16 or float64) or None, but got "
                                   "mindspore.int32."):
        AccumulationBuffer(net().trainable_params(), dtype=ms.int32)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_verify_equivalence_with_token_weights():
    from ms_accum import verify_equivalence
    x, y = token_batches(8)
    network = net()
    optimizer = nn.Adam(network.trainable_params(), 0.01)
    report = verify_equivalence(network, TokenCrossEntropy(PAD), optimizer, (x, y), 4, reduction="weighted_mean")
    print(report)
    assert report.passed and report.max_rel_diff < 1e-4
    # Sample weighting of a token mean is not the large batch's update: verify says so.
    plain = verify_equivalence(network, LossOnly(TokenCrossEntropy(PAD)), optimizer, (x, y), 4)
    assert not plain.passed


@pytest.mark.slow  # make test-all (make test answers within 8 minutes)
def test_every_structure_compiles_without_eliminating_side_effects():
    # MindSpore warns "Some side effect nodes were eliminated by mistake" when a result of a function with side
    # effects is discarded (docs/mindspore.md, discarded results of functions with side effects); its warnings go to stderr, so a fresh process.
    script = (
        "import sys, numpy as np, mindspore as ms, mindspore.dataset as ds\n"
        "from mindspore import nn\n"
        "from ms_accum import GradientAccumulation, TokenCrossEntropy\n"
        "ms.set_context(mode=ms.GRAPH_MODE)\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.standard_normal((8, 3, 5)).astype(np.float32)\n"
        "for reduction, y, loss in ((\"mean\", rng.standard_normal((8, 3, 7)).astype(np.float32), nn.MSELoss()),\n"
        "                           (\"weighted_mean\", rng.integers(0, 7, (8, 3)).astype(np.int32),\n"
        "                            TokenCrossEntropy())):\n"
        "    for structure in (\"three_graphs\", \"fused\", \"window\"):\n"
        "        net = nn.Dense(5, 7)\n"
        "        GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), 0.1), reduction=reduction,\n"
        "                             structure=structure).train_process(\n"
        "            1, ds.NumpySlicesDataset({'x': x, 'y': y}, shuffle=False).batch(2), 2, ckpt_dir=None, verbose=False)\n"
        "        print(reduction, structure, 'trained', flush=True)\n")
    env = {**os.environ, "GLOG_v": "2"}  # MindSpore's warnings on
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("trained") == 6
    assert "eliminated by mistake" not in run.stderr, run.stderr[-3000:]


# Bad inputs of the sequence features: each a clear error, raised before any graph compiles.

@pytest.mark.parametrize("value", ["x", 2.5, None, True])
def test_token_cross_entropy_needs_an_int_ignore_index(value):
    with raises_exactly(TypeError, f"For 'TokenCrossEntropy', the argument 'ignore_index' must be an int, the target "
                                   f"of padding positions, but got {value!r} of type {type(value).__name__}."):
        TokenCrossEntropy(ignore_index=value)


@pytest.mark.parametrize("value", [None, "TokenCrossEntropy"])
def test_loss_only_needs_a_cell(value):
    with raises_exactly(TypeError, f"For 'LossOnly', the argument 'cell' must be Cell, but got {value!r} of type "
                                   f"{type(value).__name__}."):
        LossOnly(value)


def token_dataset(count=B * K):
    x, y = token_batches(count)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(B)


def mse_dataset(count=B * K):
    rng = np.random.default_rng(0)
    return ds.NumpySlicesDataset({"x": rng.standard_normal((count, F)).astype(np.float32),
                                  "y": rng.standard_normal((count, V)).astype(np.float32)}, shuffle=False).batch(B)


# The two refusals, for the name called, the argument that gave the loss and the reduction asked for.
PAIR_NEEDS_WEIGHTED = ("For '{}', the argument 'reduction' must be 'weighted_mean' for a loss that returns (loss, "
                       "weight), as the '{}' given does, but got '{}'.")
WEIGHTED_NEEDS_PAIR = ("For '{}', the argument '{}' must return (loss, weight) under reduction='weighted_mean' (e.g. "
                       "ms_accum.TokenCrossEntropy: the mean over real tokens and their count), but it returns a "
                       "Tensor of shape (); a loss alone needs reduction='mean' or 'sum'.")


def probes(monkeypatch):
    """Counts the eager forward passes that check a loss's output."""
    calls = []
    real = losses._eager_output
    monkeypatch.setattr(losses, "_eager_output", lambda network, inputs: calls.append(network) or real(network, inputs))
    return calls


@pytest.mark.parametrize("loss,reduction,dataset,message", [
    (TokenCrossEntropy(PAD), "mean", token_dataset,
     PAIR_NEEDS_WEIGHTED.format("GradientAccumulation", "loss_fn", "mean")),
    (TokenCrossEntropy(PAD), "sum", token_dataset,
     PAIR_NEEDS_WEIGHTED.format("GradientAccumulation", "loss_fn", "sum")),
    (nn.MSELoss(), "weighted_mean", mse_dataset, WEIGHTED_NEEDS_PAIR.format("GradientAccumulation", "loss_fn"))],
    ids=["tokens-mean", "tokens-sum", "mse-weighted"])
def test_executor_refuses_a_loss_that_does_not_fit_the_reduction(loss, reduction, dataset, message, monkeypatch):
    network = net()
    before = [p.asnumpy().copy() for p in network.trainable_params()]
    executor = GradientAccumulation(network, loss, nn.SGD(network.trainable_params(), 0.1), reduction=reduction)
    calls, training = probes(monkeypatch), network.training  # the executor's Cells set it to train
    # Found by train_process, it is about the executor's own arguments: it names the executor.
    with raises_exactly(ValueError, message):
        executor.train_process(1, dataset(), K, ckpt_dir=None, verbose=False)
    assert len(calls) == 1  # the first graph failed to compile, and one eager forward pass said why
    assert all(np.array_equal(a, p.asnumpy()) for a, p in zip(before, network.trainable_params()))
    assert ms.get_context("mode") == ms.GRAPH_MODE and network.training is training is True  # as they were


def test_a_fitting_loss_trains_with_no_eager_pass(monkeypatch):
    # An eager pass's memory stays with the process (docs/mindspore.md): a loss that fits compiles, and is not run
    # eagerly at all.
    network = net()
    executor = GradientAccumulation(network, TokenCrossEntropy(PAD), nn.SGD(network.trainable_params(), 0.1),
                                    reduction="weighted_mean")
    calls = probes(monkeypatch)
    result = executor.train_process(2, token_dataset(), K, ckpt_dir=None, verbose=False)
    assert len(calls) == 0 and len(result.steps) == 2 and np.isfinite(result.losses).all()


@pytest.mark.parametrize("cls", [TrainForwardBackward, TrainAccumulationCell, TrainWindowCell])
def test_cells_refuse_a_loss_that_does_not_fit_their_buffer(cls):
    x, y = token_batches(B)
    network = nn.WithLossCell(net(), TokenCrossEntropy(PAD))
    optimizer = nn.SGD(network.trainable_params(), 0.1)
    buffer = AccumulationBuffer(optimizer.parameters)  # "mean"
    if cls is TrainForwardBackward:
        cell, inputs = cls(network, optimizer, buffer), (Tensor(x), Tensor(y))
    elif cls is TrainAccumulationCell:
        cell, inputs = cls(network, optimizer, K, buffer=buffer), (Tensor(x), Tensor(y))
    else:
        xs, ys = token_batches(B * K)
        cell = cls(network, optimizer, K, buffer=buffer)
        inputs = (Tensor(xs.reshape(K, B, T, F)), Tensor(ys.reshape(K, B, T)))
    with raises_exactly(ValueError, PAIR_NEEDS_WEIGHTED.format(cls.__name__, "network", "mean")):
        cell(*inputs)


def test_verify_equivalence_refuses_a_loss_that_does_not_fit_the_reduction():
    x, y = token_batches(B * K)
    network = net()
    with raises_exactly(ValueError, PAIR_NEEDS_WEIGHTED.format("verify_equivalence", "loss_fn", "mean")):
        verify_equivalence(network, TokenCrossEntropy(PAD), nn.SGD(network.trainable_params()), (x, y), K)
    with raises_exactly(ValueError, WEIGHTED_NEEDS_PAIR.format("verify_equivalence", "loss_fn")):
        dense = nn.Dense(F, V)
        verify_equivalence(dense, nn.MSELoss(), nn.SGD(dense.trainable_params()),
                           (np.ones((8, F), np.float32), np.ones((8, V), np.float32)), K, reduction="weighted_mean")


def test_accumulator_under_weighted_mean_needs_the_token_count():
    network = net()
    accumulator = Accumulator(nn.SGD(network.trainable_params(), 0.1), K, reduction="weighted_mean")
    step = accumulator_step(network, LossOnly(TokenCrossEntropy(PAD)), accumulator)  # the token count is not given
    x, y = token_batches(B)
    with raises_exactly(ValueError, "For 'Accumulator', the argument 'num_samples' must be given under "
                                    "reduction='weighted_mean' (the micro-batch's weight, e.g. its real tokens, the "
                                    "weight TokenCrossEntropy returns), but got None."):
        step(Tensor(x), Tensor(y))


@pytest.mark.parametrize("value,got", [(ms.int32, "mindspore.int32"), ("float32", "'float32'")])
def test_executor_names_its_own_buffer_dtype_argument(value, got):
    network = net()
    with raises_exactly(TypeError, f"For 'GradientAccumulation', the argument 'buffer_dtype' must be a float "
                                   f"mindspore.dtype (mindspore.float32, float16, bfloat16 or float64) or None, but "
                                   f"got {got}."):
        GradientAccumulation(network, nn.MSELoss(), nn.SGD(network.trainable_params()), buffer_dtype=value)

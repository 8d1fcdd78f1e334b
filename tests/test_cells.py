"""Cells: shared buffer, argument checks, and mindspore.train.Model with the fused micro-step Cell."""
import numpy as np
import pytest
import mindspore.dataset as ds
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.train import CheckpointConfig, LossMonitor, Model, ModelCheckpoint, TimeMonitor

from ms_accum import TrainClear, TrainForwardBackward, TrainOptim
from ms_accum.core import AccumulationBuffer
from ms_accum.graphs import TrainAccumulationCell
from ms_accum.core import _ops
from ms_accum.train.checkpoint import load_into
from conftest import batch_for, make_net, params_of, raises_exactly


def parts():
    net = nn.WithLossCell(nn.Dense(3, 2), nn.MSELoss())
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    return net, optimizer


def test_buffer_names_and_sizes():
    net, optimizer = parts()
    buffer = AccumulationBuffer(optimizer.parameters)
    assert [p.name for p in buffer.parameters()] == [
        "accumulate.weight", "accumulate.bias", "accumulate.mini_step", "accumulate.num_samples",
        "accumulate.loss_scale", "accumulate.window_bad", "accumulate.skipped_windows",
        "accumulate.skipped_micro_batches"]
    assert buffer.guard.loss_scale.asnumpy() == 1.0  # no loss scaler: the backward pass is not scaled
    assert all(not p.asnumpy().any() for p in buffer.parameters() if p is not buffer.guard.loss_scale)


def test_fused_cell_owns_one_buffer_per_parameter_plus_scalars():
    net, optimizer = parts()
    cell = TrainAccumulationCell(net, optimizer, 4)
    own = [p for _, p in cell.parameters_and_names() if p.name.startswith("accumulate.")]
    assert len(own) == len(optimizer.parameters) + 6  # two window counters, the loss scale, three guard counters


@pytest.mark.parametrize("value,error,got", [
    (0, ValueError, "0"), (-1, ValueError, "-1"), (1.5, TypeError, "1.5 of type float"),
    (None, TypeError, "None of type NoneType"), (False, TypeError, "False of type bool"),
    ("3", TypeError, "'3' of type str")])
def test_fused_cell_bad_accumulate_step(value, error, got):
    net, optimizer = parts()
    with raises_exactly(error, f"For 'TrainAccumulationCell', the argument 'accumulate_step' must be a positive int, "
                               f"but got {got}."):
        TrainAccumulationCell(net, optimizer, value)


def test_cells_reject_wrong_kinds():
    net, optimizer = parts()
    buffer = AccumulationBuffer(optimizer.parameters)
    with raises_exactly(TypeError, "For 'TrainForwardBackward', the argument 'network' must be Cell, but got None of "
                                   "type NoneType."):
        TrainForwardBackward(None, optimizer, buffer)
    with raises_exactly(TypeError, f"For 'TrainOptim', the argument 'optimizer' must be Optimizer, but got {net!r} of "
                                   f"type WithLossCell."):
        TrainOptim(net, buffer)
    with raises_exactly(TypeError, "For 'TrainClear', the argument 'buffer' must be AccumulationBuffer, but got [1, 2] "
                                   "of type list."):
        TrainClear([1, 2])
    other = AccumulationBuffer(nn.Dense(3, 2).trainable_params()[:1])
    with raises_exactly(ValueError, "For 'TrainOptim', the argument 'buffer' must hold one gradient per optimizer "
                                    "parameter (2), but holds 1."):
        TrainOptim(optimizer, other)
    with raises_exactly(TypeError, "For 'AccumulationBuffer', the argument 'params' must be ParameterTuple or list or "
                                   "tuple, but got None of type NoneType."):
        AccumulationBuffer(None)
    with raises_exactly(ValueError, "For 'TrainAccumulationCell', the argument 'network' must have trainable "
                                    "parameters, but got none."):
        TrainAccumulationCell(nn.WithLossCell(nn.ReLU(), nn.MSELoss()), optimizer, 2)


def test_model_train_with_standard_callbacks_matches_big_batch_and_saves(tmp_path, capsys):
    x, y = batch_for("lenet5", 32, seed=7)  # 8 micro-batches of 4, K=4: two optimizer steps
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    reference = make_net("lenet5")
    big = nn.TrainOneStepCell(nn.WithLossCell(reference, loss), nn.Momentum(reference.trainable_params(), 0.05, 0.9))
    big.set_train()
    for i in (0, 16):
        big(Tensor(x[i:i + 16]), Tensor(y[i:i + 16]))

    net = make_net("lenet5")
    cell = TrainAccumulationCell(nn.WithLossCell(net, loss), nn.Momentum(net.trainable_params(), 0.05, 0.9), 4)
    dataset = ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(4)
    saver = ModelCheckpoint("lenet", str(tmp_path), CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=5))
    Model(cell).train(1, dataset, callbacks=[LossMonitor(1), TimeMonitor(), saver], dataset_sink_mode=False)

    for a, e in zip(params_of(net), params_of(reference)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    out = capsys.readouterr().out
    assert out.count("loss is") == 8 and "step time" in out
    saved = sorted(p.name for p in tmp_path.glob("lenet*.ckpt"))
    assert saved == ["lenet-1_4.ckpt", "lenet-1_8.ckpt"]
    restored = make_net("lenet5", seed=3)
    load_into(restored, str(tmp_path / "lenet-1_8.ckpt"))  # the training state beside the weights is ignored
    for a, e in zip(params_of(restored), params_of(net)):
        np.testing.assert_array_equal(a, e)


def test_the_buffer_decides_the_reduction_for_every_cell():
    net, optimizer = parts()
    summed = AccumulationBuffer(optimizer.parameters, reduction="sum")
    assert summed.reduction.name == "sum"
    # An argument may repeat the buffer's rule, which then decides: micro-batches of 2 and 3 samples weigh 1 each.
    forward_backward = TrainForwardBackward(net, optimizer, summed, weight_by_samples=False)
    rng = np.random.default_rng(0)
    grads = []
    for n in (2, 3):
        x, y = (Tensor(rng.standard_normal((n, k)).astype(np.float32)) for k in (3, 2))
        before = [g.asnumpy().copy() for g in summed.grad_sum]
        forward_backward(x, y)
        grads.append([g.asnumpy() - b for g, b in zip(summed.grad_sum, before)])
    assert float(summed.num_samples.asnumpy()) == 2.0
    weights = [p.asnumpy().copy() for p in optimizer.parameters]
    assert TrainOptim(optimizer, summed, reduction="sum")()  # SGD(0.1) on the plain sum of the two gradients
    for p, w, g1, g2 in zip(optimizer.parameters, weights, *grads):
        np.testing.assert_allclose(p.asnumpy(), w - 0.1 * (g1 + g2), rtol=1e-6, atol=1e-7)
    decides = "or be None, but got {}: the AccumulationBuffer decides the reduction."
    with raises_exactly(ValueError, "For 'TrainOptim', the argument 'reduction' must agree with the buffer's "
                                    "reduction ('sum') " + decides.format("'mean'")):
        TrainOptim(optimizer, summed, reduction="mean")
    with raises_exactly(ValueError, "For 'TrainForwardBackward', the argument 'weight_by_samples' must agree with the "
                                    "buffer's reduction ('sum') " + decides.format("True")):
        TrainForwardBackward(net, optimizer, summed, weight_by_samples=True)
    with raises_exactly(ValueError, "For 'TrainAccumulationCell', the argument 'reduction' must agree with the "
                                    "buffer's reduction ('sum') " + decides.format("'mean'")):
        TrainAccumulationCell(net, optimizer, 2, reduction="mean", buffer=summed)
    # Built by the user, the buffer is what the user called.
    with raises_exactly(ValueError, "For 'AccumulationBuffer', the argument 'reduction' must be one of ['mean', "
                                    "'sum', 'weighted_mean'], but got 'avg'."):
        AccumulationBuffer(optimizer.parameters, reduction="avg")


class _ClipInPlace(nn.Cell):
    def __init__(self, params, clip_norm):
        super().__init__()
        self.params, self.clip_norm = params, clip_norm
        self.in_place = _ops.in_place_arithmetic()

    def construct(self):
        return self.in_place(self.params, _ops.clip_measured(self.params, self.clip_norm)[0])


@pytest.mark.parametrize("clip_norm", [0.5, 1e3])  # clipped, and left as it is
def test_clipping_in_the_buffer_is_mindspores_clip_by_global_norm(clip_norm, mode):
    # The executor clips the window in its buffer, so the graph that steps the optimizer can read it. It sums the
    # squares without clip_by_global_norm's squared copy of each tensor (one above `SMALL_TENSOR` elements here, summed
    # by its other kernel): the global norm differs by float32 rounding, a few ulps, so the clipped values agree to
    # rtol 1e-6; a window left as it is stays bit for bit.
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(shape).astype(np.float32) for shape in ((7, 5), (5,), (3, 2, 2), (300, 300))]
    expected = [x.asnumpy() for x in ops.clip_by_global_norm(tuple(Tensor(v) for v in values), clip_norm)]
    params = ParameterTuple([Parameter(Tensor(v), name=f"p{i}") for i, v in enumerate(values)])
    _ClipInPlace(params, clip_norm)()
    for param, want in zip(params, expected):
        if clip_norm > 1.0:
            np.testing.assert_array_equal(param.asnumpy(), want)
        else:
            np.testing.assert_allclose(param.asnumpy(), want, rtol=1e-6, atol=0)
    assert clip_norm > 1.0 or not np.array_equal(params[0].asnumpy(), values[0])  # it did clip

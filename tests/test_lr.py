"""Learning rates: scaling rules, and schedules that advance once per optimizer step, not per micro-batch."""
import numpy as np
import pytest
import mindspore.dataset as ds
from mindspore import Tensor, nn

from ms_accum import GradientAccumulation
from ms_accum.train.lr import scale_lr
from conftest import batch_for, make_net, params_of, raises_exactly


def test_scale_lr_rules():
    assert scale_lr(0.01, 4) == pytest.approx(0.04)
    assert scale_lr(0.001, 4, "sqrt") == pytest.approx(0.002)
    assert scale_lr(0.1, 1, "sqrt") == 0.1
    with raises_exactly(ValueError, "For 'scale_lr', the argument 'accumulate_step' must be a positive int, but got "
                                    "0."):
        scale_lr(0.1, 0)
    with raises_exactly(ValueError, "For 'scale_lr', the argument 'rule' must be one of ['linear', 'sqrt'], but got "
                                    "'cubic'."):
        scale_lr(0.1, 2, "cubic")
    with raises_exactly(TypeError, "For 'scale_lr', the argument 'lr' must be a positive float, but got '0.1' of type "
                                   "str."):
        scale_lr("0.1", 2)


def test_schedule_advances_per_optimizer_step(tmp_path):
    schedule = [0.2, 0.1, 0.05, 0.0125]  # one rate per update
    x, y = batch_for("mlp", 48, seed=9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    reference = make_net("mlp")
    big_opt = nn.Momentum(reference.trainable_params(), schedule, 0.9)
    big = nn.TrainOneStepCell(nn.WithLossCell(reference, loss), big_opt).set_train()
    for i in range(3):
        big(Tensor(x[16 * i:16 * i + 16]), Tensor(y[16 * i:16 * i + 16]))

    net = make_net("mlp")
    optimizer = nn.Momentum(net.trainable_params(), schedule, 0.9)
    data = ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(4)
    GradientAccumulation(net, loss, optimizer).train_process(1, data, mini_steps=4, ckpt_dir=None, verbose=False)
    assert int(optimizer.global_step.asnumpy()) == 3  # 12 micro-batches, 3 updates
    for a, e in zip(params_of(net), params_of(reference)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)

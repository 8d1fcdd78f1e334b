"""verify_equivalence: passes where accumulation is exact, fails where it is not, leaves the model alone."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from ms_accum import verify_equivalence
from conftest import batch_for, make_net


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


@pytest.mark.parametrize("kind,k,n", [("mlp", 4, 32), ("lenet5", 3, 22)])
def test_passes_and_leaves_network_and_optimizer_untouched(kind, k, n):
    net = make_net(kind)
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    before = [p.asnumpy().copy() for _, p in optimizer.parameters_and_names()]
    report = verify_equivalence(net, loss_fn(), optimizer, batch_for(kind, n, seed=0), k)
    assert report.passed, str(report)
    assert report.accumulate_step == k and not report.moved_between_updates
    assert 0 <= report.max_abs_diff <= 1e-6
    assert str(report).startswith("PASSED: ")
    after = [p.asnumpy() for _, p in optimizer.parameters_and_names()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_detects_batchnorm_which_accumulation_cannot_reproduce():
    # BatchNorm normalises each micro-batch by its own statistics: K small batches are not one big batch.
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dense(32, 10)])
    report = verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), batch_for("mlp", 16, seed=1), 4)
    assert not report.passed
    assert report.max_abs_diff > 1e-4
    assert str(report).startswith("FAILED: ")
    worst = max(report.per_parameter, key=lambda name: report.per_parameter[name][0])
    assert report.per_parameter[worst][0] == report.max_abs_diff


def test_bad_arguments():
    net = make_net("mlp")
    args = (net, loss_fn(), nn.SGD(net.trainable_params()), batch_for("mlp", 4, seed=0))
    with pytest.raises(ValueError, match="For 'verify_equivalence', the argument 'accumulate_step' must be a "
                                         "positive int, but got 0."):
        verify_equivalence(*args, 0)
    with pytest.raises(ValueError, match="'accumulate_step' must not exceed the batch size 4, but got 5"):
        verify_equivalence(*args, 5)
    with pytest.raises(TypeError, match="the argument 'optimizer' must be Optimizer"):
        verify_equivalence(net, loss_fn(), None, args[3], 2)
    x, y = args[3]
    with pytest.raises(ValueError, match="'inputs' must be arrays sharing their first \\(batch\\) axis"):
        verify_equivalence(*args[:3], (x, y[:3]), 2)
    with pytest.raises(ValueError, match="'rtol' must be a positive float"):
        verify_equivalence(*args, 2, rtol=-1.0)

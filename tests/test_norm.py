"""replace_batchnorm: BatchNorm breaks accumulation's equivalence, GroupNorm restores it."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from ms_accum import verify_equivalence
from ms_accum.tools.norm import replace_batchnorm
from conftest import batch_for, raises_exactly


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 5, pad_mode="valid")
        self.bn = nn.BatchNorm2d(6)
        self.block = nn.SequentialCell([nn.Conv2d(6, 8, 5, pad_mode="valid"), nn.BatchNorm2d(8), nn.ReLU()])
        self.head = nn.SequentialCell([nn.Flatten(), nn.Dense(8 * 20 * 20, 10)])

    def construct(self, x):
        return self.head(self.block(self.bn(self.conv(x))))


def check(net):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return verify_equivalence(net, loss, nn.SGD(net.trainable_params(), 0.1), batch_for("mlp", 16, seed=0), 4)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_groupnorm_makes_accumulation_exact_again():
    ms.set_seed(0)
    net = ConvNet()
    assert not check(net).passed  # micro-batch statistics differ from the big batch's
    assert replace_batchnorm(net, num_groups=4) == ["bn", "block.1"]
    assert isinstance(net.bn, nn.GroupNorm) and isinstance(net.block[1], nn.GroupNorm)
    assert net.bn.num_groups == 3 and net.block[1].num_groups == 4  # 6 channels: the largest divisor <= 4
    names = [p.name for p in net.trainable_params()]
    assert "bn.gamma" in names and "block.1.beta" in names and len(names) == len(set(names))
    assert check(net).passed
    out = net(ms.Tensor(np.ones((2, 1, 28, 28), np.float32)))
    assert out.shape == (2, 10)


@pytest.mark.slow  # make test-all
def test_the_verifiers_named_fix_makes_a_batchnorm1d_network_pass():
    # The fix the verifier names for BatchNorm1d on (N, C) runs: a one-group GroupNorm (per sample, as LayerNorm).
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dense(32, 10)])
    report = check(net)
    assert not report.passed and "ms_accum.replace_batchnorm(network)" in report.causes[0].fix
    assert replace_batchnorm(net) == ["2"]
    assert isinstance(net[2], nn.GroupNorm) and net[2].num_groups == 1
    assert [p.name for p in net.trainable_params()][2:4] == ["2.gamma", "2.beta"]
    assert check(net).passed


@pytest.mark.slow  # make test-all
def test_batchnorm1d_on_sequences_and_batchnorm3d_are_replaced_too():
    class Seq(nn.Cell):  # BatchNorm1d on (N, C, L), BatchNorm3d on (N, C, D, H, W)
        def __init__(self):
            super().__init__()
            self.bn1 = nn.BatchNorm1d(4)
            self.bn3 = nn.BatchNorm3d(2)
            self.head = nn.Dense(4 * 14 * 14, 10)

        def construct(self, x):
            n = x.shape[0]
            h = self.bn1(x.reshape(n, 4, 196))
            return self.head(self.bn3(h.reshape(n, 2, 2, 14, 14)).reshape(n, -1))

    ms.set_seed(0)
    net = Seq()
    assert not check(net).passed
    assert replace_batchnorm(net, num_groups=4) == ["bn1", "bn3.bn2d"]  # BatchNorm3d holds a BatchNorm2d
    assert net.bn1.num_groups == 1 and net.bn3.bn2d.num_groups == 2
    assert "bn3.bn2d.gamma" in [p.name for p in net.trainable_params()]
    assert check(net).passed


def test_frozen_batchnorm_stays_and_bad_arguments():
    net = nn.SequentialCell([nn.Dense(4, 4), nn.BatchNorm1d(4, use_batch_statistics=False)])
    assert replace_batchnorm(net) == []  # it normalizes by its moving statistics, per sample
    with raises_exactly(ValueError, "For 'replace_batchnorm', the argument 'num_groups' must be a positive int, but "
                                    "got 0."):
        replace_batchnorm(net, 0)
    with raises_exactly(TypeError, "For 'replace_batchnorm', the argument 'network' must be Cell, but got None of type "
                                   "NoneType."):
        replace_batchnorm(None)

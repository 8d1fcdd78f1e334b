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


def test_batchnorm1d_is_left_with_a_warning_and_bad_arguments():
    net = nn.SequentialCell([nn.Dense(4, 4), nn.BatchNorm1d(4)])
    with pytest.warns(UserWarning, match="'1' is a BatchNorm1d and stays"):
        assert replace_batchnorm(net) == []
    with raises_exactly(ValueError, "For 'replace_batchnorm', the argument 'num_groups' must be a positive int, but "
                                    "got 0."):
        replace_batchnorm(net, 0)
    with raises_exactly(TypeError, "For 'replace_batchnorm', the argument 'network' must be Cell, but got None of type "
                                   "NoneType."):
        replace_batchnorm(None)

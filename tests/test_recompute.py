"""recompute_cells: marked cells recompute their forward, and training is unchanged."""
import numpy as np
import pytest
from mindspore import Tensor, nn

from ms_accum.graphs import TrainAccumulationCell
from ms_accum.train.recompute import recompute_cells
from conftest import batch_for, make_net, params_of, raises_exactly

# `Cell.recompute()`'s mark in the cell's graph flags, which MindSpore's compiler reads: "output_recompute" since 2.9,
# "output_no_recompute" on 2.8 (CI runs this file on each).
RECOMPUTE_FLAGS = ("output_recompute", "output_no_recompute")


def recomputed(cell) -> bool:
    """Whether `Cell.recompute()` was called on `cell` itself (a cell inside one is recomputed too, unmarked)."""
    return any(flag in cell.get_flags() for flag in RECOMPUTE_FLAGS)


LENET5_PATHS = "['conv1', 'conv2', 'fc1', 'fc2', 'fc3', 'flatten', 'max_pool2d', 'relu']"


def train_window(recompute):
    net = make_net("lenet5")
    if recompute:
        assert recompute_cells(net, ["conv1", "conv2", "fc1"]) == ["conv1", "conv2", "fc1"]
        # Cell.recompute() leaves its mark in the cell's graph flags; unmarked cells have none.
        assert recomputed(net.conv1) and not recomputed(net.fc2)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = TrainAccumulationCell(nn.WithLossCell(net, loss), nn.Momentum(net.trainable_params(), 0.05, 0.9), 2)
    cell.set_train()
    x, y = batch_for("lenet5", 16, seed=3)
    for i in range(4):  # two windows
        cell(Tensor(x[4 * i:4 * i + 4]), Tensor(y[4 * i:4 * i + 4]))
    return params_of(net)


def test_recompute_leaves_training_unchanged():
    for a, b in zip(train_window(True), train_window(False)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_bad_names():
    with raises_exactly(ValueError, f"For 'recompute_cells', the argument 'names' must hold sub-cells of the network, "
                                    f"but got 'conv9'; valid paths: {LENET5_PATHS}."):
        recompute_cells(make_net("lenet5"), ["conv9"])
    with raises_exactly(TypeError, "For 'recompute_cells', the argument 'names' must be str, but got 3 of type int."):
        recompute_cells(make_net("lenet5"), [3])


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_executor_option_recomputes_and_trains_the_same():
    import mindspore.dataset as ds
    from ms_accum import GradientAccumulation
    x, y = batch_for("lenet5", 16, seed=3)
    trained = []
    for recompute in (["conv1", "conv2"], None):
        net = make_net("lenet5")
        executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                        nn.Momentum(net.trainable_params(), 0.05, 0.9), recompute=recompute)
        assert recomputed(net.conv2) == bool(recompute)
        executor.train_process(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4), 2, ckpt_dir=None,
                               verbose=False)
        trained.append(params_of(net))
    for a, b in zip(*trained):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    net = make_net("lenet5")
    with raises_exactly(ValueError, f"For 'GradientAccumulation', the argument 'recompute' must hold sub-cells of the "
                                    f"network, but got 'conv9'; valid paths: {LENET5_PATHS}."):
        GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params()), recompute=["conv9"])

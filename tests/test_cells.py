"""Cells: shared buffer, argument checks, and mindspore.train.Model with the fused micro-step Cell."""
import numpy as np
import pytest
from mindspore import nn

from ms_accum import AccumulationBuffer, TrainAccumulationCell, TrainClear, TrainForwardBackward, TrainOptim


def parts():
    net = nn.WithLossCell(nn.Dense(3, 2), nn.MSELoss())
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    return net, optimizer


def test_buffer_names_and_sizes():
    net, optimizer = parts()
    buffer = AccumulationBuffer(optimizer.parameters)
    assert [p.name for p in buffer.parameters()] == ["accumulate.weight", "accumulate.bias",
                                                      "accumulate.mini_step", "accumulate.num_samples"]
    assert all(not p.asnumpy().any() for p in buffer.parameters())


def test_fused_cell_owns_one_buffer_per_parameter_plus_scalars():
    net, optimizer = parts()
    cell = TrainAccumulationCell(net, optimizer, 4)
    own = [p for _, p in cell.parameters_and_names() if p.name.startswith("accumulate.")]
    assert len(own) == len(optimizer.parameters) + 2


@pytest.mark.parametrize("value,error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (None, TypeError),
                                         (False, TypeError), ("3", TypeError)])
def test_fused_cell_bad_accumulate_step(value, error):
    net, optimizer = parts()
    with pytest.raises(error, match="For 'TrainAccumulationCell', the argument 'accumulate_step' must be a "
                                    "positive int"):
        TrainAccumulationCell(net, optimizer, value)


def test_cells_reject_wrong_kinds():
    net, optimizer = parts()
    buffer = AccumulationBuffer(optimizer.parameters)
    with pytest.raises(TypeError, match="'network' must be Cell"):
        TrainForwardBackward(None, optimizer, buffer)
    with pytest.raises(TypeError, match="'optimizer' must be Optimizer"):
        TrainOptim(net, buffer)
    with pytest.raises(TypeError, match="'buffer' must be AccumulationBuffer"):
        TrainClear([1, 2])
    other = AccumulationBuffer(nn.Dense(3, 2).trainable_params()[:1])
    with pytest.raises(ValueError, match="'buffer' must hold one gradient per optimizer parameter"):
        TrainOptim(optimizer, other)
    with pytest.raises(TypeError, match="'params' must be"):
        AccumulationBuffer(None)
    with pytest.raises(ValueError, match="'network' must have trainable parameters"):
        TrainAccumulationCell(nn.WithLossCell(nn.ReLU(), nn.MSELoss()), optimizer, 2)

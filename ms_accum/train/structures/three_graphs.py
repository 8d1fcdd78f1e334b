"""``"three_graphs"``, the default: the tutorial's three graphs, with the window's choice made on the host."""
from __future__ import annotations

import os
from typing import List

import mindspore as ms
from mindspore import nn

from ...graphs.cells import TrainForwardBackward, _ThreadedForwardBackward
from .base import Closer, MicroBatches, Parts, Structure, WindowResult, noting_sizes

# docs/mindspore.md, small straight-line graphs run synchronously: one actor thread below 12 cores, and about 4-6
# kernels a trainable Parameter, so from about 20 Parameters the graph is past the 100 kernels MindSpore threads itself.
SYNCHRONOUS_PARAMETERS, SYNCHRONOUS_CORES = 20, 12


def runs_synchronously(network: nn.Cell) -> bool:
    """Whether MindSpore would run `network`'s micro-batch graph synchronously, which on CPU is the slower mode."""
    return (ms.get_context("device_target") == "CPU" and (os.cpu_count() or 1) < SYNCHRONOUS_CORES
            and len(network.trainable_params()) <= SYNCHRONOUS_PARAMETERS)


class ThreeGraphs(Structure):
    """`TrainForwardBackward` runs each micro-batch; the closer then checks the window and launches the step or the
    clear. As many launches per window as the tutorial's `TrainOptim` and `TrainClear`, the least memory of the
    structures (docs/structures.md). A micro-batch graph MindSpore would run synchronously gets a tensor `if` that
    threads it (`runs_synchronously`), which runs it faster on CPU (benchmarks/README.md, peer)."""

    def __init__(self, parts: Parts, closer: Closer) -> None:
        super().__init__(parts, closer)
        cell = _ThreadedForwardBackward if runs_synchronously(parts.network) else TrainForwardBackward
        self.forward_backward = cell(parts.net_with_loss, parts.optimizer, parts.buffer).set_train()
        self.forward_backward.loss_arg = parts.loss_arg

    def run(self, window: MicroBatches, size: int) -> WindowResult:
        samples: List[int] = []
        outputs = [self.forward_backward(*inputs) for inputs in noting_sizes(window, samples)]
        return self.result(outputs, samples, self.closer.close())


STRUCTURE = ThreeGraphs

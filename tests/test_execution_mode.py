"""MindSpore runs a small straight-line graph synchronously when its runtime has one actor thread, and a graph past 100
kernels on the actor threads (docs/mindspore.md, "Small straight-line graphs run synchronously"). The speed of the
default structure against "fused" and "window" rests on it; this reads it from MindSpore's own INFO log, with no
timing, so an upgrade that changes it fails here; and that the executor's default threads every micro-batch graph
(`ms_accum.train.structures.three_graphs.runs_synchronously`)."""
import os
import re
import subprocess
import sys

import pytest

CALLS = 8
# Graph mode parses source files, so the script goes to a file. PAD chained scalar multiplications take LeNet5's
# micro-batch graph (about 45-60 kernels) past the 100 kernels a synchronously run graph may have, computing the same.
SCRIPT = f"""
import ms_accum  # before MindSpore: oneDNN's CPU ISA, as users run it
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from ms_accum import TrainForwardBackward, set_device
from ms_accum.core import AccumulationBuffer
from ms_accum.demo.models import LeNet5

PAD = 60


class Padded(TrainForwardBackward):
    def __init__(self, *args):
        super().__init__(*args)
        self.scalar = Parameter(Tensor(0.0, ms.float32), name="pad", requires_grad=False)

    def construct(self, *inputs):
        out = super().construct(*inputs)
        x = self.scalar * 1.0
        for _ in range(PAD):
            x = x * 1.0001  # not 1.0, which the compiler may drop; the scalar stays 0
        return ops.depend(out, ops.assign(self.scalar, x))


set_device("CPU")
rng = np.random.default_rng(0)
inputs = [(Tensor(rng.standard_normal((32, 1, 32, 32)).astype(np.float32)),
           Tensor(rng.integers(0, 10, 32).astype(np.int32))) for _ in range(2)]
for name, cls in (("plain", TrainForwardBackward), ("padded", Padded)):  # the default's micro-batch graph, then padded
    net = LeNet5()
    for param in net.trainable_params():
        param.name = name + "." + param.name
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = cls(nn.WithLossCell(net, loss), opt, AccumulationBuffer(opt.parameters, prefix=name)).set_train()
    for i in range({CALLS}):
        cell(*inputs[i % 2]).asnumpy()
"""
STRATEGY = re.compile(r"\] (\S+) execution count: (\d+), .* multi thread or not: ([01])")


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_the_default_micro_batch_graph_runs_synchronously_and_the_padded_one_threaded(tmp_path):
    script = tmp_path / "modes.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], env={**os.environ, "GLOG_v": "1"}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    threads = re.search(r"The actor thread number: (\d+)", out.stderr)
    assert threads, "MindSpore's INFO log no longer names its actor threads"
    if int(threads.group(1)) > 1:
        pytest.skip(f"{threads.group(1)} actor threads: MindSpore times both modes and keeps the faster")
    modes = {}  # graph -> the modes of its calls after the first, in the order the graphs first ran
    for graph, count, mode in STRATEGY.findall(out.stderr):
        if int(count) > 1:
            modes.setdefault(graph, set()).add(mode == "1")
    assert list(modes.values()) == [{False}, {True}], modes


DEFAULT_SCRIPT = """
import sys
import ms_accum  # before MindSpore: oneDNN's CPU ISA, as users run it
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from ms_accum import GradientAccumulation, set_device
from ms_accum.demo.models import LeNet5
from ms_accum.train.options import QUIET

set_device("CPU")
rng = np.random.default_rng(0)
if sys.argv[1] == "lenet5":
    net, x = LeNet5(), rng.standard_normal((96, 1, 32, 32)).astype(np.float32)
else:  # 13 Dense layers and their ReLUs, 26 Parameters: past 100 kernels, threaded by MindSpore itself
    net = nn.SequentialCell([cell for _ in range(12) for cell in (nn.Dense(16, 16), nn.ReLU())] + [nn.Dense(16, 10)])
    x = rng.standard_normal((96, 16)).astype(np.float32)
y = rng.integers(0, 10, 96).astype(np.int32)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
executor = GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
executor.train_process(1, data, 4, checkpoints=None, log=QUIET)
print(type(executor.runner(4).forward_backward).__name__)
"""


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("network, cell", [("lenet5", "_ThreadedForwardBackward"),
                                           ("deep", "TrainForwardBackward")])
def test_the_default_structure_threads_every_micro_batch_graph(tmp_path, network, cell):
    # LeNet5's graph gets the tensor `if` (`three_graphs.runs_synchronously`); the deep one is threaded as it is.
    script = tmp_path / "default.py"
    script.write_text(DEFAULT_SCRIPT)
    out = subprocess.run([sys.executable, str(script), network], env={**os.environ, "GLOG_v": "1"},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    threads = re.search(r"The actor thread number: (\d+)", out.stderr)
    assert threads, "MindSpore's INFO log no longer names its actor threads"
    if int(threads.group(1)) > 1 or (os.cpu_count() or 1) >= 12:
        pytest.skip(f"{threads.group(1)} actor threads: MindSpore times both modes and keeps the faster")
    assert out.stdout.split()[-1] == cell
    modes = {}  # graph -> the modes of its calls after the first; the micro-batch graph is the one called most
    for graph, count, mode in STRATEGY.findall(out.stderr):
        if int(count) > 1:
            modes.setdefault(graph, []).append(mode == "1")
    micro_batch_graph = max(modes, key=lambda graph: len(modes[graph]))
    assert len(modes[micro_batch_graph]) == 11 and set(modes[micro_batch_graph]) == {True}, modes

"""Section f, second part: peak resident memory of a train structure, one process per structure.

    python -m benchmarks.peak_memory CONTENDER

Counting Parameters (memory.py) misses what a graph allocates while it runs: gradients, the temporaries of
clearing a buffer, dividing the window's sum. So each structure trains a few windows of an MLP large enough
(3 x 4096^2 weights, 192 MiB) for its parameter-sized tensors to dominate, in a fresh process, and prints
``PEAK <bytes> PARAMS <bytes>``: the growth of the process's peak RSS (VmHWM) from just before the Cell is
built, and the trainable bytes. SGD without momentum, so the optimizer adds no state of its own.
The `three_graphs_*` contenders add one option that touches every gradient (`THREE_GRAPHS`): measuring the norms
(`ms_accum.core.statistics`), clipping the window, leaving micro-batches out (`policy="skip_microbatch"`, an outlier
filter). None may cost a copy of any tensor (each weight is a third of the parameters). `three_graphs_threaded` is
the default with its micro-batch graph run in MindSpore's threaded mode (benchmark section x).
"""
from __future__ import annotations

import argparse

import numpy as np

from ms_accum.tools.planner import process_status as status  # the peak memory the planner's trials read, read alike

# The executor's default structure with each of its options that touches every gradient tensor
THREE_GRAPHS = {"three_graphs": {}, "three_graphs_statistics": {"statistics": True},
                "three_graphs_clip": {"clip_norm": 1.0}, "three_graphs_skip_microbatch": {"policy": "skip_microbatch"},
                "three_graphs_outliers": {"skip_outliers": 6.0}}
CONTENDERS = ("one_step", "fused", *THREE_GRAPHS, "three_graphs_threaded", "window", "accumulator",
              "accumulator_weighted")
K, B, WIDTH, WINDOWS = 4, 8, 4096, 4


def measure(contender: str):
    import mindspore as ms
    from mindspore import Tensor, nn
    from ms_accum import GradientAccumulation, TrainAccumulationCell, TrainWindowCell
    from .steps import jit_accumulator_step
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(WIDTH, WIDTH), nn.ReLU(), nn.Dense(WIDTH, WIDTH), nn.ReLU(),
                             nn.Dense(WIDTH, WIDTH), nn.ReLU(), nn.Dense(WIDTH, 10)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    net_with_loss = nn.WithLossCell(net, loss)
    opt = nn.SGD(net.trainable_params(), 0.01)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((K, B, WIDTH)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, (K, B)).astype(np.int32))
    micro = [(Tensor(x.asnumpy()[i]), Tensor(y.asnumpy()[i])) for i in range(K)]
    start = status("VmRSS")
    if contender == "window":
        cell = TrainWindowCell(net_with_loss, opt, K).set_train()
        run = lambda: cell(x, y).asnumpy()  # noqa: E731
    elif contender.startswith("three_graphs"):
        model = GradientAccumulation(net, loss, opt, structure="three_graphs", **THREE_GRAPHS.get(contender, {}))
        if contender == "three_graphs_threaded":  # section x's padded graph: what MindSpore's threaded mode costs
            from .execution_mode import threaded_graph
            threaded_graph(model, opt)
        runner = model.runner(K)
        run = lambda: runner.run(micro, K)  # noqa: E731  (closing a window reads its verdict: synchronized)
    elif contender.startswith("accumulator"):
        step = jit_accumulator_step(net, loss, opt, K, B if contender.endswith("weighted") else None)
        run = lambda: [step(*inputs) for inputs in micro][-1].asnumpy()  # noqa: E731
    else:
        cell = (nn.TrainOneStepCell(net_with_loss, opt) if contender == "one_step"
                else TrainAccumulationCell(net_with_loss, opt, K)).set_train()
        run = lambda: [cell(*inputs) for inputs in micro][-1].asnumpy()  # noqa: E731
    for _ in range(WINDOWS):
        run()
    return status("VmHWM") - start, sum(p.nbytes for p in net.trainable_params())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=CONTENDERS)
    peak, params = measure(parser.parse_args(argv).contender)
    print(f"PEAK {peak} PARAMS {params}", flush=True)


if __name__ == "__main__":
    main()

"""Section b2: what each launch of the window's bookkeeping is worth, one contender per choice, side by side.

A tiny network (Dense 16 -> 4, micro-batch 8, K=4) makes the fixed cost of graph calls, control flow and small
kernels visible, which LeNet5's compute hides in noise. Each ms_accum contender differs from the default in one choice
that the library made to save launches, so its ratio to the default is what that choice is worth per window:
- closing the window on the host (the executor's: a check graph, its verdict read back, then a straight-line step
  graph), against one `TrainOptim(clear=True)` call (one graph with a tensor `if`) and against
  `TrainOptim` then `TrainClear` (two graph calls, two tensor `if`s: the clear tests the buffer for inf/nan itself);
- the sum-based finiteness check on CPU, against `mindspore.amp.all_finite` (three kernels per tensor);
- a constant backward sensitivity without a loss scaler, against a `StaticLossScaler(1)` (the scaled path multiplies);
- the unweighted Accumulator (`num_samples` omitted), against `num_samples=8` (a multiplication per gradient);
- and, for scale, the documentation's Cell-graph loop, with and without a host wait once per window.
"""
from __future__ import annotations

import numpy as np

from .common import K, Table, interleave

WIDTH, OUT, B = 16, 4, 8


def _tiny(seed: int = 0):
    import mindspore as ms
    from mindspore import nn
    ms.set_seed(seed)
    net = nn.Dense(WIDTH, OUT)
    return net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9)


def _inputs():
    from mindspore import Tensor
    rng = np.random.default_rng(0)
    return [(Tensor(rng.standard_normal((B, WIDTH)).astype(np.float32)),
             Tensor(rng.standard_normal((B, OUT)).astype(np.float32))) for _ in range(K)]


def _cells(inputs, close="host", all_finite=False, scaler=None):
    """ms_accum's three graphs as the executor runs them (its runner), with one choice changed; fn(n) runs n windows.

    `close`: ``"host"`` (the executor's), ``"one_graph"`` (`TrainOptim(clear=True)`) or ``"two_graphs"``
    (`TrainOptim`, `TrainClear`)."""
    from mindspore import amp
    from ms_accum import GradientAccumulation, TrainClear, TrainOptim
    from ms_accum.core import guard
    net, loss, opt = _tiny()
    chooser = guard._window_check
    if all_finite:
        guard._window_check = lambda dtypes: guard._AllFinite()
    try:
        executor = GradientAccumulation(net, loss, opt, structure="three_graphs",
                                        loss_scaler=None if scaler is None else amp.StaticLossScaler(1.0))
    finally:
        guard._window_check = chooser
    runner = executor.runner(K)
    if close == "host":
        def run(n):
            for _ in range(n):
                runner.run(inputs, K)  # reads the verdict: synchronized
        return run
    buffer = executor.buffer
    calls = {"one_graph": [TrainOptim(opt, buffer, clear=True).set_train()],
             "two_graphs": [TrainOptim(opt, buffer).set_train(), TrainClear(buffer).set_train()]}[close]

    def run(n):
        for _ in range(n):
            for x, y in inputs:
                out = runner.forward_backward(x, y)
            for call in calls:
                call()
        out.asnumpy()
    return run


def _documentation(inputs, wait_each_window=False):
    from . import doc_impls
    doc = doc_impls.DocGradientAccumulation(*_tiny())
    forward_backward, optim, clear = doc._train_forward_backward, doc._train_optim, doc._train_clear

    def run(n):
        for _ in range(n):
            for x, y in inputs:
                out = forward_backward(x, y)
            optim()
            clear()
            if wait_each_window:
                out.asnumpy()
        out.asnumpy()
    return run


def _accumulator(inputs, weighted=False):
    from .steps import jit_accumulator_step
    step = jit_accumulator_step(*_tiny(), K, B if weighted else None)

    def run(n):
        for _ in range(n):
            for x, y in inputs:
                out = step(x, y)
        out.asnumpy()
    return run


def launches(rounds: int, windows: int) -> Table:
    """b2: ms per window of each contender, and its ratio to the executor's default."""
    inputs = _inputs()
    default = "ms_accum three graphs, as the executor runs them (default)"
    contenders = {
        default: _cells(inputs),
        "  ... closed in one TrainOptim(clear=True) call (one tensor if)": _cells(inputs, close="one_graph"),
        "  ... closed by TrainOptim then TrainClear (two tensor ifs)": _cells(inputs, close="two_graphs"),
        "  ... with amp.all_finite as the window's check": _cells(inputs, all_finite=True),
        "  ... with a StaticLossScaler(1) (scaled sensitivity)": _cells(inputs, scaler=True),
        "ms_accum Accumulator, num_samples omitted (no weighting)": _accumulator(inputs),
        "  ... with num_samples=8 (one multiplication per gradient)": _accumulator(inputs, weighted=True),
        "docs: Cell-graph tutorial loop": _documentation(inputs),
        "  ... with a host wait once per window": _documentation(inputs, wait_each_window=True),
    }
    table = Table("b2", f"what each launch is worth: a window of {K} micro-batches of {B} on Dense({WIDTH}, {OUT}) "
                  "(fixed costs dominate)", f"one window of {K} micro-batches", K * B, default)
    table.rows = interleave(contenders, rounds, windows)
    table.notes.append("each '...' row differs from the row above it in one choice; its ratio minus that row's is "
                       "what the choice costs, as a fraction of the default's time per window.")
    return table

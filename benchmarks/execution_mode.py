"""Section x: MindSpore's synchronous execution of small graphs, and what a kernel launch costs in each mode.

    python -m benchmarks.execution_mode [--rounds N] [--data DIR] [--only x1,x2,x3,x4] [--dispatch-threads N]

MindSpore's actor runtime (`GraphScheduler::SetActorExecutionStrategy`, MindSpore 2.10) runs a graph synchronously,
on the calling thread with its thread pool not spinning, when the graph has no control flow, at most
`ActorDispatcher::kSingleThreadExecutionActorMaxNum` = 100 kernels, and the runtime has one actor thread: on CPUs
with fewer than 12 cores at the default `runtime_num_threads`, and perhaps more (MindSpore logs "The actor thread
number: 1" at INFO level). Every graph of the tutorial's three Cells and of ms_accum's three graphs is such a graph
for LeNet5 (about 45-60 kernels); a graph with a tensor `if` ("fused", the Accumulator page's `@ms.jit` step) or
with more kernels is run by the actor threads instead. `PAD` scalar multiplications past the 100 kernels move a
graph to the threaded mode without changing what it computes, so each table holds the same graphs in both modes,
interleaved in one process:

- x1: one micro-batch (LeNet5 b32) of the tutorial's `TrainForwardBackward` and of ms_accum's, each as it is and
  padded, and ms_accum's with a never-taken tensor `if` instead (control flow is run threaded too);
- x2: what one kernel launch costs in each mode: the tutorial's Cell with 0 and 48 scalar kernels (still
  synchronous) and with 60 and 240 (threaded); the slope in µs per launch;
- x3: what users run, `GradientAccumulation.train_process` over real MNIST (default structure, K=4), its
  `TrainForwardBackward` as it is and padded;
- x4: the triggers where no graph needs one: the Shakespeare transformer's micro-batch graph (well over 100 kernels)
  as it is, padded, and with a never-taken tensor `if` instead.
"""
from __future__ import annotations

import argparse
from typing import Optional

import numpy as np

from .common import BATCH, K, Table, cycle_calls, epochs, interleave, lenet, micro_batches, mnist_dir, \
    note_per_round_ratios, setup_mindspore, tensors

PAD = 60  # with LeNet5's ~45-60 kernels, past the 100 that a synchronously run graph may have
EXECUTOR_IMAGES = 2048


def _triggered(cls, trigger: str = "pad"):
    """`cls` (a micro-batch Cell) with a Parameter of its own that moves it to the threaded mode: ``"pad"``, `n`
    chained scalar multiplications of it; ``"if"``, a tensor `if` on it that is never taken."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, ops

    class Triggered(cls):
        def __init__(self, *args, n: int = PAD) -> None:
            super().__init__(*args)
            self.n = n
            self.scalar = Parameter(Tensor(0.0, ms.float32), name=f"pad{id(self)}", requires_grad=False)

        def construct(self, *inputs):
            out = super().construct(*inputs)
            x = self.scalar * 1.0
            if trigger == "if":
                if self.scalar > 1.0:
                    x = x * 2.0
            else:
                for _ in range(self.n):
                    x = x * 1.0001  # not 1.0, which the compiler may drop; the scalar stays 0
            return ops.depend(out, ops.assign(self.scalar, x))

    return Triggered


def threaded_graph(model, optimizer, trigger: str = "pad"):
    """The micro-batch graph of `model` (a `GradientAccumulation` with the default structure) with `trigger`, on the
    same buffer; `model.runner` uses it once it is put in the place of the executor's own."""
    graph = _triggered(type(model._graphs[0]), trigger)(model._net_with_loss, optimizer, model.buffer).set_train()
    model._graphs = (graph, *model._graphs[1:])
    return graph


def _tutorial(n: int):
    from mindspore import nn
    from .doc_impls import TrainForwardBackward
    net, loss, opt = lenet()
    args = (nn.WithLossCell(net, loss), opt, opt.parameters.clone(prefix=f"grad_sum{n}", init="zeros"), 1.0)
    return (_triggered(TrainForwardBackward)(*args, n=n) if n else TrainForwardBackward(*args)).set_train()


def _ours(trigger: Optional[str] = None):
    """ms_accum's LeNet5 `TrainForwardBackward`, as it is or with `trigger` (``"pad"``: `PAD` kernels, or ``"if"``)."""
    from mindspore import nn
    from ms_accum import AccumulationBuffer, TrainForwardBackward
    net, loss, opt = lenet()
    args = (nn.WithLossCell(net, loss), opt, AccumulationBuffer(opt.parameters, prefix=f"accumulate{trigger}"))
    return (_triggered(TrainForwardBackward, trigger)(*args) if trigger else TrainForwardBackward(*args)).set_train()


def cells(rounds: int) -> Table:
    """x1: the micro-batch graphs of the tutorial and of ms_accum, each in both modes."""
    inputs = tensors(micro_batches(8, None))
    builds = {"tutorial's TrainForwardBackward (synchronous)": lambda: _tutorial(0),
              f"the same + {PAD} scalar kernels (threaded)": lambda: _tutorial(PAD),
              "ms_accum's TrainForwardBackward (synchronous)": lambda: _ours(),
              f"ms_accum's + {PAD} scalar kernels (threaded)": lambda: _ours("pad"),
              "ms_accum's + a never-taken tensor if (threaded)": lambda: _ours("if")}
    table = Table("x1", "one micro-batch graph in MindSpore's two execution modes (LeNet5 b32)",
                  f"one micro-batch of {BATCH}", BATCH, next(iter(builds)))
    table.rows = interleave({name: cycle_calls(build(), inputs) for name, build in builds.items()}, rounds, 32)
    note_per_round_ratios(table)
    return table


def launch_cost(rounds: int) -> Table:
    """x2: the tutorial's Cell with more and more scalar kernels; µs per launch in each mode."""
    inputs = tensors(micro_batches(8, None))
    counts = (0, 48, PAD, 4 * PAD)
    table = Table("x2", "what one scalar kernel launch costs (the tutorial's Cell, LeNet5 b32, n kernels added)",
                  f"one micro-batch of {BATCH}", BATCH, "n=0")
    table.rows = interleave({f"n={n}": cycle_calls(_tutorial(n), inputs) for n in counts}, rounds, 32)

    def slope(low: int, high: int) -> str:
        per_round = (np.asarray(table.rows[f"n={high}"]) - np.asarray(table.rows[f"n={low}"])) / (high - low)
        return f"{np.median(per_round) * 1e3:.1f} µs per launch (n={low} to {high}, median of per-round slopes)"

    table.notes.append(f"synchronous: {slope(0, 48)}; threaded: {slope(PAD, 4 * PAD)}")
    return table


def executor(rounds: int, data_dir: str) -> Table:
    """x3: train_process over real MNIST, the default structure's micro-batch graph as it is and padded."""
    from ms_accum import GradientAccumulation
    from ms_accum.demo.data import create_dataset
    dataset = create_dataset(data_dir, BATCH, num_samples=EXECUTOR_IMAGES, seed=0)
    contenders = {}
    for name, n in (("the executor as it is", 0), (f"its TrainForwardBackward + {PAD} scalar kernels", PAD)):
        net, loss, opt = lenet()
        model = GradientAccumulation(net, loss, opt)
        if n:
            threaded_graph(model, opt)
        contenders[name] = epochs(model, dataset)
    table = Table("x3", f"train_process over real MNIST ({EXECUTOR_IMAGES} images per round, LeNet5 b32, K={K}, "
                  "default structure)", f"one micro-batch of {BATCH}", BATCH, next(iter(contenders)))
    table.rows = interleave(contenders, rounds, EXECUTOR_IMAGES // BATCH)
    note_per_round_ratios(table)
    return table


def transformer(rounds: int) -> Table:
    """x4: what each trigger costs a graph the runtime already threads (the Shakespeare transformer)."""
    from mindspore import Tensor, nn
    from ms_accum import GradientAccumulation, TokenCrossEntropy
    from ms_accum.demo.models import CharTransformer
    rng = np.random.default_rng(0)
    batch, length, vocab = 8, 64, 65  # the tutorial's micro-batch on its shortest bucket
    inputs = [(Tensor(rng.integers(0, vocab, (batch, length)).astype(np.int32)),
               Tensor(rng.integers(0, vocab, (batch, length)).astype(np.int32))) for _ in range(4)]
    contenders = {}
    for name, trigger in (("the transformer's TrainForwardBackward", None), (f"+ {PAD} scalar kernels", "pad"),
                          ("+ a tensor if", "if")):
        net = CharTransformer(vocab, 64, 4, 2, 256)
        for param in net.trainable_params():  # unique names in one process
            param.name = f"{trigger}.{param.name}"
        opt = nn.Adam(net.trainable_params(), 1e-3)
        model = GradientAccumulation(net, TokenCrossEntropy(), opt, reduction="weighted_mean")
        contenders[name] = cycle_calls(threaded_graph(model, opt, trigger) if trigger else model._graphs[0], inputs)
    table = Table("x4", f"the triggers on a graph the runtime already threads: the Shakespeare transformer "
                  f"(micro-batch {batch} x {length} characters)", f"one micro-batch of {batch}", batch,
                  next(iter(contenders)))
    table.rows = interleave(contenders, rounds, 16)
    note_per_round_ratios(table)
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--data", help="MNIST_Data directory (default $MS_ACCUM_MNIST or ../shared/data/MNIST_Data)")
    parser.add_argument("--only", default="x1,x2,x3,x4", help="comma-separated tables to run")
    parser.add_argument("--dispatch-threads", type=int, metavar="N",
                        help="run with ms.runtime.dispatch_threads_num(N), which gives the runtime N actor threads")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if args.dispatch_threads:
        import mindspore as ms
        ms.runtime.dispatch_threads_num(args.dispatch_threads)
    setup_mindspore()
    data_dir = mnist_dir(args.data)
    for key, table in (("x1", lambda: cells(args.rounds)), ("x2", lambda: launch_cost(args.rounds)),
                       ("x4", lambda: transformer(args.rounds)),
                       ("x3", lambda: executor(max(args.rounds // 2, 5), data_dir) if data_dir else None)):
        result = table() if key in only else None
        if result is not None:
            print(result.render(), flush=True)


if __name__ == "__main__":
    main()

"""Section s: what measuring the window costs per micro-batch (ms_accum.core.statistics).

    python -m benchmarks.statistics_cost [--rounds N] [--data DIR] [--pair off_first|on_first]

With statistics on, every micro-batch's graph also measures its gradient's squared norm (a large tensor's dot product
with itself, the small tensors concatenated and summed by one dot), and the window's check its own, which the guard
then reads for finiteness; an outlier filter also keeps running statistics and adds the gradient behind a tensor `if`
on the micro-batch's weight. Tables s0-s3 and s6 are timed in rounds interleaved against statistics off; s4 and s5
are read from MindSpore's profiler:

- s0: what users run, `GradientAccumulation.train_process` (default structure, K=4, LeNet5 b32) over real MNIST
  (2048 images per round), `statistics=False` against `statistics=True`;
- s1, s2: one `TrainAccumulationCell` micro-step on pre-loaded tensors, LeNet5 b32 and section m's activation-heavy
  conv net b8 (3x96x96), the buffer's statistics off, on, and with `skip_outliers`;
- s3: s1's first two rows with each contender in three processes of its own (over MNIST batches), which no build
  order can move;
- s4: the kernel time of one tensor's sum of squares by its size, `L2Loss` against the `MatMul` dot (no other process
  or graph moves a kernel's own time): where `_ops.SMALL_TENSOR` comes from;
- s5: the kernels statistics add to a LeNet5 micro-batch of s1, launches and kernel time;
- s6: s1's LeNet5 pair in six fresh processes, each building both, half of them in each order.

Target: at most 1.02x. Memory: statistics add no buffer, a scalar Parameter (the window's squared norm; the outlier
filter's running statistics are 5 more floats), counted in `tests/test_statistics.py`.
"""
from __future__ import annotations

import argparse

import numpy as np

from .common import BATCH, K, Table, cycle_calls, epochs, interleave, lenet, mnist_dir, note_per_round_ratios, \
    setup_mindspore

CONTENDERS = {"statistics off (the default)": {},
              "statistics on": {"statistics": True},
              "statistics and skip_outliers=6": {"skip_outliers": 6.0, "outlier_warmup": 10 ** 6}}
BASELINE = next(iter(CONTENDERS))
EXECUTOR_IMAGES = 2048


def _cell(build, settings):
    from mindspore import nn
    from ms_accum import AccumulationBuffer, TrainAccumulationCell
    net, loss, opt = build()
    buffer = AccumulationBuffer(opt.parameters, **settings)
    return TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K, buffer=buffer).set_train()


def _conv():
    """Section m's conv net with the LeNet5 setup's loss and optimizer."""
    import mindspore as ms
    from mindspore import nn
    from .activation_memory import build
    net, loss, _, _, _ = build("conv")
    for param in net.trainable_params():  # unique names, as `lenet` gives them
        param.name = f"conv{id(net)}.{param.name}"
    ms.set_seed(0)
    return net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9)


def executor(rounds: int, data_dir: str) -> Table:
    """s0: train_process over real MNIST, statistics off and on."""
    from ms_accum import GradientAccumulation
    from ms_accum.demo.data import create_dataset
    dataset = create_dataset(data_dir, BATCH, num_samples=EXECUTOR_IMAGES, seed=0)
    contenders = {}
    for name, settings in CONTENDERS.items():
        net, loss, opt = lenet()
        model = GradientAccumulation(net, loss, opt, **settings)
        contenders[name] = epochs(model, dataset)
    table = Table("s0", f"statistics in the executor: train_process over real MNIST ({EXECUTOR_IMAGES} images per "
                  "round, LeNet5 b32, K=4, the default structure)", "one micro-batch of 32", BATCH, BASELINE,
                  "<= 1.02", [name for name in CONTENDERS if name != BASELINE])
    table.rows = interleave(contenders, rounds, EXECUTOR_IMAGES // BATCH)
    note_per_round_ratios(table)
    return table


def cells(rounds: int):
    """s1, s2: one TrainAccumulationCell micro-step, LeNet5 b32 and the conv net b8."""
    from mindspore import Tensor
    rng = np.random.default_rng(0)
    tables = []
    for key, title, build, shape, batch, calls, table_rounds in (
            ("s1", "statistics per micro-batch, LeNet5 b32", lenet, (1, 32, 32), BATCH, 32, rounds),
            ("s2", "statistics per micro-batch, section m's conv net b8 (3x96x96)", _conv, (3, 96, 96), 8, 8,
             max(rounds // 4, 5))):
        inputs = [(Tensor(rng.standard_normal((batch, *shape)).astype(np.float32)),
                   Tensor(rng.integers(0, 10, batch).astype(np.int32))) for _ in range(8)]
        table = Table(key, title, f"one micro-batch of {batch}", batch, BASELINE, "<= 1.02",
                      [name for name in CONTENDERS if name != BASELINE])
        table.rows = interleave({name: cycle_calls(_cell(build, settings), inputs)
                                 for name, settings in CONTENDERS.items()}, table_rounds, calls)
        table.notes.append("TrainAccumulationCell (structure 'fused'), K=4, one call per micro-batch; the outlier "
                           "filter judges every micro-batch but, with its warm-up never reached, leaves none out.")
        note_per_round_ratios(table)
        tables.append(table)
    return tables


def cells_processes(rounds: int, calls: int, replicas: int = 3) -> Table:
    """s3: s1 with each contender in `replicas` processes of its own (`threads.replicated_workers`): in one process
    the contender built second measured 1.06-1.11 where the other order measured 1.02-1.04."""
    from .threads import replicated_workers
    table = Table("s3", f"s1 with {replicas} processes per contender (LeNet5 b32, K=4, TrainAccumulationCell)",
                  "one micro-batch of 32, the mean of a contender's processes", BATCH, BASELINE, "<= 1.02",
                  ["statistics on"])
    table.rows, note = replicated_workers({BASELINE: ("ms_cell", "default", {}),
                                           "statistics on": ("ms_cell_statistics", "default", {})},
                                          rounds, calls, replicas)
    table.notes.append(note)
    note_per_round_ratios(table)
    return table


SUM_SIZES = (840, 2400, 4800, 10080, 48000, 480000)  # elements: LeNet5's fc3, conv2, fc2 and fc1 weights among them


def _kernels(graph, args, calls: int) -> dict:
    """{op type: (ms, launches)} of `calls` calls of the compiled `graph`, from MindSpore's profiler."""
    from .worker import mindspore_kernels
    graph(args).asnumpy()
    return mindspore_kernels(lambda n: [graph(args) for _ in range(n)][-1].asnumpy(), calls)


def _sum_ways() -> tuple:
    """s4's two ways to sum squares, each a function of a tuple of tensors to compile: `L2Loss`, and the dot."""
    from mindspore import ops
    from ms_accum.core import _ops
    l2_loss = ops.L2Loss()

    def l2_loss_sums(xs):
        return ops.addn([l2_loss(x) for x in xs])

    def dot_sums(xs):
        return ops.addn([_ops._row_sum_of_squares(_ops._row(x)) for x in xs])

    return l2_loss_sums, dot_sums


def sum_of_squares_kernels(calls: int = 100, tensors: int = 8) -> str:
    """s4: microseconds of kernel time per sum of squares, by size: each way sums `tensors` distinct tensors in one
    graph, `calls` times under the profiler."""
    import mindspore as ms
    from mindspore import Tensor
    from ms_accum.core import _ops
    rng = np.random.default_rng(0)
    lines = [f"== s4. one sum of squares, kernel time by size (MindSpore's profiler, {calls} calls x {tensors} "
             "tensors)",
             f"   {'elements':>10}{'L2Loss us':>12}{'MatMul dot us':>15}  cheaper"]
    ways = _sum_ways()
    for size in SUM_SIZES:
        xs = ms.mutable(tuple(Tensor(rng.standard_normal(size).astype(np.float32)) for _ in range(tensors)))
        times = [_kernels(ms.jit(fn), xs, calls)[kernel][0] / (calls * tensors) * 1e3
                 for kernel, fn in zip(("L2Loss", "MatMul"), ways)]
        cheaper = "L2Loss" if times[0] <= times[1] else "MatMul"
        lines.append(f"   {size:>10}{times[0]:>12.2f}{times[1]:>15.2f}  {cheaper}")
    lines.append(f"   note: a tensor of more than _ops.SMALL_TENSOR = {_ops.SMALL_TENSOR} elements is summed with its "
                 "own dot; the smaller ones with L2Loss in the window, concatenated and summed by one dot in a "
                 "micro-batch.")
    return "\n".join(lines)


def micro_batch_kernels(calls: int = 256) -> str:
    """s5: the kernels statistics add, launches and kernel time per LeNet5 micro-batch, from MindSpore's profiler over
    `calls` micro-batches of s1's `TrainAccumulationCell` (its window's share included, a quarter at K=4)."""
    from .worker import build, mindspore_kernels
    per_batch = {}
    for contender in ("ms_cell", "ms_cell_statistics"):
        run = build(contender, "default")
        run(16)
        run(16)
        per_batch[contender] = {op: (ms_ / calls * 1e3, count / calls)
                                for op, (ms_, count) in mindspore_kernels(run, calls).items()}
    lines = [f"== s5. kernels per LeNet5 micro-batch, statistics off and on (MindSpore's profiler, {calls} "
             "micro-batches of s1's cell)", f"   {'':<20}{'launches':>9}{'kernel us':>11}"]
    for contender, kernels in per_batch.items():
        lines.append(f"   {contender:<20}{sum(n for _, n in kernels.values()):>9.2f}"
                     f"{sum(us for us, _ in kernels.values()):>11.0f}")
    off, on = per_batch["ms_cell"], per_batch["ms_cell_statistics"]
    added = {op: on.get(op, (0.0, 0.0))[1] - off.get(op, (0.0, 0.0))[1] for op in set(off) | set(on)}
    by_count = sorted(added.items(), key=lambda item: -item[1])
    lines.append("   launches added: " + ", ".join(f"{op} {n:+.2f}" for op, n in by_count if abs(n) >= 0.125))
    lines.append("   kernel time moves by hundreds of microseconds between processes (the network's own kernels); each "
                 "launch also costs the runtime some microseconds on the host, which kernel time leaves out.")
    return "\n".join(lines)


PAIR_ORDERS = ("off_first", "on_first")


def one_pair(order: str, rounds: int, calls: int = 2 * BATCH) -> str:
    """One process of s6: both of s1's LeNet5 contenders (statistics off and on) built in `order`, timed in interleaved
    rounds; the line ``PAIR <order> <ratio of medians> <median of per-round ratios>``."""
    from mindspore import Tensor
    rng = np.random.default_rng(0)
    inputs = [(Tensor(rng.standard_normal((BATCH, 1, 32, 32)).astype(np.float32)),
               Tensor(rng.integers(0, 10, BATCH).astype(np.int32))) for _ in range(8)]
    names = ["statistics off (the default)", "statistics on"]
    contenders = {}
    for name in names if order == PAIR_ORDERS[0] else names[::-1]:
        contenders[name] = cycle_calls(_cell(lenet, CONTENDERS[name]), inputs)
        contenders[name](8)  # compiled now, in this order
    rows = interleave(contenders, rounds, calls, warmup=2)
    off, on = (np.asarray(rows[name]) for name in names)
    return f"PAIR {order} {np.median(on) / np.median(off):.4f} {np.median(on / off):.4f}"


def paired_processes(processes: int = 6, rounds: int = 30) -> str:
    """s6: s1's LeNet5 pair in `processes` fresh processes, each building both contenders, half of them statistics off
    first: a process's speed moves both alike, and the build order's effect is taken both ways."""
    import os
    import subprocess
    import sys
    from .common import REPO
    lines = [f"== s6. statistics on / off, both in one process, {processes} processes, build order alternating "
             f"({rounds} rounds each; ratio of medians, median of per-round ratios)"]
    ratios = []
    for index in range(processes):
        out = subprocess.run([sys.executable, "-m", "benchmarks.statistics_cost", "--pair", PAIR_ORDERS[index % 2],
                              "--rounds", str(rounds)], cwd=REPO, env=os.environ, capture_output=True, text=True,
                             check=True).stdout.split()
        at = out.index("PAIR")
        ratios.append((float(out[at + 2]), float(out[at + 3])))
        lines.append(f"   {out[at + 1]:<10}{ratios[-1][0]:>8.3f}{ratios[-1][1]:>8.3f}")
    mean = np.mean(ratios, axis=0)
    lines.append(f"   {'mean':<10}{mean[0]:>8.3f}{mean[1]:>8.3f}   target <= 1.02")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=161, help="rounds of s0 and s1 (s2: a quarter)")
    parser.add_argument("--data", help="MNIST_Data directory (default $MS_ACCUM_MNIST or ../shared/data/MNIST_Data)")
    parser.add_argument("--pair", choices=PAIR_ORDERS, help="run one process of s6 (with --rounds) and stop")
    args = parser.parse_args(argv)
    setup_mindspore()
    if args.pair:
        print(one_pair(args.pair, args.rounds), flush=True)
        return
    data_dir = mnist_dir(args.data)
    if data_dir is not None:
        print(executor(max(args.rounds // 8, 5), data_dir).render(), flush=True)
    for table in cells(args.rounds):
        print(table.render(), flush=True)
    print(cells_processes(max(args.rounds // 4, 5), 2 * BATCH).render(), flush=True)
    print(sum_of_squares_kernels(), flush=True)
    print(micro_batch_kernels(), flush=True)
    print(paired_processes(), flush=True)


if __name__ == "__main__":
    main()

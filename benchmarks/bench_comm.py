"""Communication per window under msrun: AllReduce launches and wall time, for K in --ks, side by side.

    PATH="$PWD/.venv/bin:$PATH" msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True \\
        --log_dir=/tmp/bench_comm benchmarks/bench_comm.py [--rounds 7] [--windows 8] [--micro 16] [--ks 1 4 16]

Rank 0 prints the table (in msrun's output and in LOG_DIR/worker_0.log). Contenders, all LeNet5 with
Momentum(0.01, 0.9), `--micro` samples per rank per micro-batch (so the global micro-batch is twice that), run
in interleaved rounds after a compiling warm-up; the median of the rounds is reported:

  window K        `TrainAccumulationCell`: micro-batches accumulate locally, and each window all-reduces each
                  buffer tensor and the sample count (ms_accum's `AllReduceSums`); K=1 is plain data parallelism
  flat K          the same, but the window's buffer and sample count are concatenated into one tensor, all-reduced
                  in one launch and split again (`FlatAllReduceSums` below: a temporary copy of the buffer)
  per-micro K=4   the same window, but each micro-batch's gradients are all-reduced as it is computed (what
                  `nn.DistributedGradReducer` inside a train-one-step Cell would do): the baseline
Both window contenders add one all-reduce of the guard's two counts per window.

AllReduce launches and their kernel time come from MindSpore's CPU profiler, in a separate profiled pass of
`--windows` windows per contender (the profiler's overhead stays out of the wall times).

    msrun ... benchmarks/bench_comm.py --peak window|flat      (one contender's memory, one job each)

measures instead the peak resident memory a window's reduction costs: an MLP of 3 x 4096^2 weights (192 MiB), K=2,
b8, SGD, two windows; rank 0 prints the growth of its peak RSS (VmHWM) from before the Cell is built, in MiB and
as a multiple of the parameters.
"""
import argparse
import glob
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ms_accum.runtime import prefer_fast_cpu_kernels  # noqa: E402

prefer_fast_cpu_kernels()  # oneDNN reads its ISA cap when MindSpore loads: before any import of it

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402
from mindspore.communication import GlobalComm  # noqa: E402

from ms_accum import AccumulationBuffer, TrainAccumulationCell  # noqa: E402
from ms_accum.demo.models import LeNet5  # noqa: E402
from ms_accum.core import _ops  # noqa: E402
from ms_accum.core.parallel import AllReduceSums, LocalSums  # noqa: E402
from ms_accum.train.distributed import init_data_parallel  # noqa: E402


@ms.jit_class
class FlatAllReduceSums(AllReduceSums):
    """The window's buffer and sample count in one all-reduce: concatenated, reduced, split back."""

    def __call__(self, grad_sum, num_samples):
        flat = ops.concat([ops.reshape(g, (-1,)) for g in grad_sum] + [ops.reshape(num_samples, (1,))])
        total = self.all_reduce(flat)
        out = []
        start = 0
        for g in grad_sum:
            out.append(ops.reshape(total[start:start + g.size], g.shape))
            start += g.size
        return tuple(out), total[start]


class PerMicroBatchReduce(nn.Cell):
    """The baseline: all-reduce every micro-batch's gradients (and its sample count), accumulate the sums."""

    def __init__(self, network, optimizer, accumulate_step):
        super().__init__(auto_prefix=False)
        buffer = AccumulationBuffer(optimizer.parameters)
        self.grad_sum, self.mini_step, self.num_samples = buffer.grad_sum, buffer.mini_step, buffer.num_samples
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.accumulate_step = accumulate_step
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.reducer = nn.DistributedGradReducer(optimizer.parameters, mean=False, group=GlobalComm.WORLD_COMM_GROUP)
        self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)
        self.sums = LocalSums()  # the already-reduced sums, as they are: divided by the samples

    def construct(self, x, y):
        loss = self.network(x, y)
        weight = ops.shape(x)[0] * 1.0
        grads = self.grad(self.network, self.weights)(x, y, ops.fill(ops.dtype(loss), ops.shape(loss), weight))
        grads = self.reducer(grads)
        samples = self.all_reduce(ops.fill(ms.float32, (), weight))
        step = _ops.accumulate(self.grad_sum, self.mini_step, self.num_samples, grads, samples)
        if step >= self.accumulate_step:
            grad_sum, divisor = self.sums(self.grad_sum, self.num_samples)
            self.optimizer(_ops.window_grads(grad_sum, divisor, None))
            _ops.clear_window(self.grad_sum, self.mini_step, (self.num_samples,))
        return loss


def build(kind, k):
    net = LeNet5()
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    if kind in ("window", "flat"):
        cell = TrainAccumulationCell(with_loss, optimizer, k)
        if kind == "flat":
            cell.buffer.reducer = FlatAllReduceSums()
    else:
        cell = PerMicroBatchReduce(with_loss, optimizer, k)
    return cell.set_train(), len(optimizer.parameters)


def run_windows(cell, k, windows, batches):
    loss = None
    for i in range(windows * k):
        loss = cell(*batches[i % len(batches)])
    loss.asnumpy()  # wait for the last step


def allreduce_stats(path):
    """(launches, total kernel ms) of AllReduce in MindSpore's CPU profiler output under `path`."""
    files = glob.glob(os.path.join(path, "**", "cpu_op_type_info_*.csv"), recursive=True)
    with open(files[0], encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
        for line in handle:
            row = dict(zip(header, line.strip().split(",")))
            if row["op_type"] == "AllReduce":
                return int(row["type_occurrences"]), float(row["total_compute_time"])
    return 0, 0.0


def peak(kind, info):
    """Peak RSS growth (bytes) of two windows of the large MLP with the `kind` reduction, and its parameter bytes."""
    from benchmarks.peak_memory import B, WIDTH, status
    net = nn.SequentialCell([nn.Dense(WIDTH, WIDTH), nn.ReLU(), nn.Dense(WIDTH, WIDTH), nn.ReLU(),
                             nn.Dense(WIDTH, WIDTH), nn.ReLU(), nn.Dense(WIDTH, 10)])
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    rng = np.random.default_rng(info.rank)
    x = Tensor(rng.standard_normal((B, WIDTH)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, (B,)).astype(np.int32))
    start = status("VmRSS")
    cell = TrainAccumulationCell(with_loss, nn.SGD(net.trainable_params(), 0.01), 2)
    if kind == "flat":
        cell.buffer.reducer = FlatAllReduceSums()
    cell.set_train()
    for _ in range(4):
        cell(x, y).asnumpy()
    return status("VmHWM") - start, sum(p.nbytes for p in net.trainable_params())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--windows", type=int, default=8, help="windows per contender per round")
    parser.add_argument("--micro", type=int, default=16, help="samples per rank per micro-batch")
    parser.add_argument("--peak", choices=("window", "flat"), help="measure this contender's peak memory instead")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16], help="window sizes K")
    parser.add_argument("--out", default=None, help="profiler output directory (default: a temporary one)")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    info = init_data_parallel()
    if args.peak:
        grown, params = peak(args.peak, info)
        if info.is_main:
            print(f"PEAK {args.peak}: {grown / 2**20:.0f} MiB, {grown / params:.2f} x the parameters "
                  f"({params / 2**20:.0f} MiB)", flush=True)
        return
    out = args.out or os.path.join("/tmp", f"bench_comm_profile_{os.getpid()}")

    rng = np.random.default_rng(info.rank)
    batches = [(Tensor(rng.standard_normal((args.micro, 1, 32, 32)).astype(np.float32)),
                Tensor(rng.integers(0, 10, (args.micro,)).astype(np.int32))) for _ in range(8)]
    contenders = {f"{kind} K={k}": (kind, k) for k in args.ks for kind in ("window", "flat")}
    contenders["per-micro K=4"] = ("per_micro", 4)
    cells = {}
    for name, (kind, k) in contenders.items():
        cells[name], tensors = build(kind, k)
        run_windows(cells[name], k, 1, batches)  # compile

    times = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (_, k) in contenders.items():
            start = time.perf_counter()
            run_windows(cells[name], k, args.windows, batches)
            times[name].append((time.perf_counter() - start) * 1000 / args.windows)

    counts = {}
    for index, (name, (_, k)) in enumerate(contenders.items()):
        profiler = ms.Profiler(output_path=os.path.join(out, f"rank{info.rank}_{index}"))
        run_windows(cells[name], k, args.windows, batches)
        profiler.stop()
        profiler.analyse()
        counts[name] = allreduce_stats(os.path.join(out, f"rank{info.rank}_{index}"))

    if info.is_main:
        lines = [f"LeNet5, {info.group_size} CPU workers, {args.micro} samples per rank per micro-batch "
                 f"({tensors} parameter tensors); median of {args.rounds} rounds of {args.windows} windows",
                 f"{'contender':<15}{'AllReduce/window':>18}{'AllReduce ms/window':>21}{'wall ms/window':>16}"
                 f"{'wall ms/micro-batch':>21}"]
        for name, (_, k) in contenders.items():
            launches, kernel_ms = counts[name]
            wall = statistics.median(times[name])
            lines.append(f"{name:<15}{launches / args.windows:>18.1f}{kernel_ms / args.windows:>21.2f}"
                         f"{wall:>16.2f}{wall / k:>21.2f}")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()

"""A benchmark contender in its own process, for what a process can set only once (threads, env) and for torch.

    python -m benchmarks.worker CONTENDER [--setting S] [--serve | --profile N]

`--serve`: build, warm up, print ``READY``, then for each stdin line ``N`` run N micro-batches of 32 and print
``MS <ms per micro-batch>``; the parent (threads.py) alternates between several such workers, one at a time.
`--profile N`: warm up, run N micro-batches, print ``WALL <ms per micro-batch>``; with ONEDNN_VERBOSE=1 in the
environment the parent (profile.py) reads oneDNN's lines from the same stdout; `--trace mindspore|torch` also
runs the framework's profiler and prints ``OP <op type> <ms per micro-batch>``. Nothing runs on import.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

CONTENDERS = ("torch", "ms_cell", "ms_jit", "ms_window", "ms_one_step", "torch_loader", "ms_executor",
              "ms_executor_fused", "ms_executor_window", "ms_loop_one_step", "doc_page", "doc_tutorial",
              "ms_three_graphs", "ms_cell_statistics")
SETTINGS = ("default", "threads_num=1", "threads_num=2", "dispatch_threads_num=1", "cpu_affinity", "env")


def _torch_lenet(threads: int = 0):
    """(model, optimizer): the tutorial's LeNet5 and Momentum(0.01, 0.9) in PyTorch, on `threads` (0: all cores)."""
    import torch
    from torch import nn
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def torch_contender(batches, k: int, threads: int = 0):
    """The PyTorch CPU loop equivalent to the tutorial: LeNet5, b32, loss/K, backward, step + zero every K."""
    import torch
    from torch.nn import functional as F
    model, opt = _torch_lenet(threads)
    data = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in batches]
    state = {"micro": 0}

    def run(n: int) -> None:
        for i in range(n):
            x, y = data[i % len(data)]
            (F.cross_entropy(model(x), y) / k).backward()
            state["micro"] += 1
            if state["micro"] % k == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
    return run


def _block(batches, n: int):
    """n micro-batches cycled from `batches`, as two arrays of n * B samples (what a data loader reads)."""
    xs = np.concatenate([batches[i % len(batches)][0] for i in range(n)])
    ys = np.concatenate([batches[i % len(batches)][1] for i in range(n)])
    return xs, ys


def torch_loader_contender(batches, k: int):
    """The PyTorch loop as users write it: a DataLoader over the samples, batch 32, no worker processes."""
    import torch
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset
    model, opt = _torch_lenet()
    blocks = {}

    def run(n: int) -> None:
        if n not in blocks:
            xs, ys = _block(batches, n)
            blocks[n] = TensorDataset(torch.from_numpy(xs), torch.from_numpy(ys).long())
        for i, (x, y) in enumerate(DataLoader(blocks[n], batch_size=len(batches[0][0]))):
            (F.cross_entropy(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
    return run


def mindspore_dataset_contender(name: str, batches, k: int):
    """What users run: a MindSpore dataset of the block's samples, batched by B, trained by the executor (or by a
    plain TrainOneStepCell loop over the same dataset)."""
    import mindspore.dataset as ds
    from mindspore import nn
    from ms_accum import GradientAccumulation
    from .common import lenet
    net, loss_fn, opt = lenet()
    structure = {"ms_executor": "auto", "ms_executor_fused": "fused", "ms_executor_window": "window"}.get(name)
    executor = GradientAccumulation(net, loss_fn, opt, structure=structure) if structure else None
    one_step = None if structure else nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt).set_train()
    blocks = {}

    def run(n: int) -> None:
        if n not in blocks:
            blocks[n] = _block(batches, n)
        xs, ys = blocks[n]
        dataset = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(len(batches[0][0]))
        if executor is not None:
            executor.train_process(1, dataset, k, ckpt_dir=None, verbose=False)
            return
        out = None
        for x, y in dataset.create_tuple_iterator():
            out = one_step(x, y)
        out.asnumpy()
    return run


def mindspore_contender(name: str, batches, k: int):
    from mindspore import nn
    from ms_accum import AccumulationBuffer, TrainAccumulationCell, TrainWindowCell
    from .common import cycle_calls, lenet, tensors, window_tensors
    from .steps import jit_accumulator_step
    net, loss_fn, opt = lenet()
    if name == "doc_page":
        from .doc_impls import accumulator_page_train_step
        return cycle_calls(accumulator_page_train_step(net, loss_fn, opt, k)[0], tensors(batches))
    if name == "doc_tutorial":
        from .doc_impls import DocGradientAccumulation
        from .steps import _cell_graph_tutorial
        return _cell_graph_tutorial(DocGradientAccumulation(net, loss_fn, opt), tensors(batches))
    if name == "ms_three_graphs":
        from .steps import _three_graphs
        return _three_graphs(net, loss_fn, opt, tensors(batches))
    if name in ("ms_cell", "ms_cell_statistics"):  # the second measures each micro-batch's norm (section s3)
        buffer = AccumulationBuffer(opt.parameters, statistics=name == "ms_cell_statistics")
        return cycle_calls(TrainAccumulationCell(nn.WithLossCell(net, loss_fn), opt, k, buffer=buffer).set_train(),
                           tensors(batches))
    if name == "ms_one_step":
        return cycle_calls(nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt).set_train(), tensors(batches))
    if name == "ms_window":
        window = cycle_calls(TrainWindowCell(nn.WithLossCell(net, loss_fn), opt, k).set_train(),
                             window_tensors(batches, k))
        return lambda n: window(n // k)  # n is a multiple of k: threads.py asks for blocks of 2 x 8 or 2 x 32
    return cycle_calls(jit_accumulator_step(net, loss_fn, opt, k), tensors(batches))


def apply_setting(setting: str) -> None:
    """MindSpore's process-wide thread knobs (environment variables are set by the parent instead)."""
    import mindspore as ms
    if setting.startswith("threads_num="):
        ms.device_context.cpu.op_tuning.threads_num(int(setting.split("=")[1]))
    elif setting.startswith("dispatch_threads_num="):
        ms.runtime.dispatch_threads_num(int(setting.split("=")[1]))
    elif setting == "cpu_affinity":
        ms.runtime.set_cpu_affinity(True)


def build(contender: str, setting: str):
    from .common import K, micro_batches, mnist_dir, setup_mindspore
    if contender.startswith("torch"):
        batches = micro_batches(16, None)  # random data: no MindSpore in the torch process
        if contender == "torch_loader":
            return torch_loader_contender(batches, K)
        return torch_contender(batches, K, int(setting.split("=")[1]) if setting.startswith("threads_num=") else 0)
    setup_mindspore()
    apply_setting(setting)
    if contender.startswith("ms_executor") or contender == "ms_loop_one_step":
        return mindspore_dataset_contender(contender, micro_batches(16, mnist_dir()), K)
    return mindspore_contender(contender, micro_batches(16, mnist_dir()), K)


def mindspore_kernels(run, n: int) -> dict:
    """{op type: (total ms, launches)} over n micro-batches from MindSpore's profiler (CPU op times)."""
    import csv
    import glob
    import tempfile
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity
    with tempfile.TemporaryDirectory() as out:
        prof = ms.profiler.profile(activities=[ProfilerActivity.CPU],
                                   on_trace_ready=ms.profiler.tensorboard_trace_handler(out))
        prof.start()
        run(n)
        prof.stop()
        with open(glob.glob(f"{out}/*/FRAMEWORK/cpu_op_type_info_0.csv")[0], encoding="utf-8") as handle:
            return {row["op_type"]: (float(row["total_compute_time"]), int(row["type_occurrences"]))
                    for row in csv.DictReader(handle)}


def trace_mindspore(run, n: int):
    """(op type, total ms) over n micro-batches from MindSpore's profiler (CPU op times)."""
    return [(op, total) for op, (total, _) in mindspore_kernels(run, n).items()]


def trace_torch(run, n: int):
    """(op, self CPU ms) over n micro-batches from torch.profiler."""
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run(n)
    return [(e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages() if e.self_cpu_time_total > 0]


TRACERS = {"mindspore": trace_mindspore, "torch": trace_torch}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=CONTENDERS)
    parser.add_argument("--setting", default="default", choices=SETTINGS)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--trace", choices=("none", "mindspore", "torch"), default="none")
    args = parser.parse_args(argv)
    run = build(args.contender, args.setting)
    run(16)  # warm-up: compilation, first allocations
    run(16)
    if args.profile:
        sys.stdout.flush()
        start = time.perf_counter()
        run(args.profile)
        print(f"WALL {(time.perf_counter() - start) * 1e3 / args.profile:.4f}", flush=True)
        if args.trace != "none":
            for op, ms_total in TRACERS[args.trace](run, args.profile):
                print(f"OP {op} {ms_total / args.profile:.4f}", flush=True)
        return
    print("READY", flush=True)
    for line in sys.stdin:
        n = int(line)
        start = time.perf_counter()
        run(n)
        print(f"MS {(time.perf_counter() - start) * 1e3 / n:.4f}", flush=True)


if __name__ == "__main__":
    if os.environ.get("ONEDNN_MAX_CPU_ISA") is None:
        from ms_accum.runtime import prefer_fast_cpu_kernels
        prefer_fast_cpu_kernels()
    main()

"""Runs the benchmark suite and prints its tables under the machine's CPU and the date (see benchmarks/README.md).

    .venv/bin/python -m benchmarks [--quick] [--only SECTION,...] [--repeats N] [--encoder-layers L]
        [--encoder-seq S] [--data DIR] [--json PATH]
"""
import argparse
import json
import os
import sys
import time

from . import common

SECTIONS = {  # name -> what it measures (README.md has the details)
    "step": "speed: LeNet5 b32, K=4, the steps alone on pre-loaded tensors",
    "epoch": "speed: LeNet5 over real MNIST, ms_accum through its executor",
    "epoch_alone": "speed: LeNet5 over real MNIST, the default and the tutorial's loop each alone in a fresh process",
    "conv_net": "speed: the activation-heavy conv net through the executor, K=4 x B=8",
    "char_transformer": "speed: the Shakespeare tutorial's transformer through the executor, K=4 x B=8",
    "activations": "memory: conv net and transformer, K = 4, 8, 16, as multiples of one micro-batch's step",
    "parameters": "memory: a 192 MiB MLP, as multiples of its parameters",
    "real_size": "memory: a deep MLP and a BERT-shaped encoder, B=1, K=4, above the plain step, x the parameters",
    "parallel": "speed: LeNet5 on two msrun workers, one all-reduce a window against one a step",
    "cached": "gradient caching: a contrastive conv net's memory (K = 4, 8, 16) and time per window vs one K·B step",
    "plan_budget": "memory: a plan for a 132 MiB encoder with AdamW at 1400 MiB, against training with it",
    "sharding": "memory and speed: the optimizer state sharded over 2 and 4 msrun ranks, a 192 MiB MLP and an encoder",
    "dropout": "memory and speed: ms_accum's dropout against MindSpore's kernel, a BERT-shaped encoder and the recipe",
    "adaptive": "steps and samples to a held-out loss: fixed K, a ramp and AdaptiveK on MNIST and Shakespeare",
    "peer": "speed, memory, exactness: mindcv's TrainStep accumulation against ms_accum, an MLP, the recipe's model",
}
# Full run, then --quick: a smoke run, every section with too few rounds to measure anything (no warm-up round: the
# first compiles), and the memory sections with a few of their figures.
ROUNDS = {"step": (21, 2), "epoch": (11, 1), "epoch_alone": (8, 1), "heavy": (9, 1), "parallel": (7, 1), "peer": (3, 1)}
WARMUP = (1, 0)                  # rounds run and discarded before the timed ones
STEP_MICRO_BATCHES = (32, 8)     # per round and contender
EPOCH_IMAGES = (6400, 256)       # per round and contender
HEAVY_WINDOWS = (2, 1)           # per round and contender
PARALLEL_WINDOWS = (8, 2)        # per round and contender
ACTIVATION_KS = ((4, 8, 16), (4,))
QUICK_ACTIVATIONS = ("conv_net",), ("one_kb", "mindcv", "three_graphs")  # networks, contenders besides one B step
QUICK_PARAMETERS = ("one_b", "mindcv", "three_graphs+statistics")
QUICK_PEER = ("mlp",), ("one_b", "mindcv", "three_graphs")  # peer: memory's networks and contenders, exactness's nets
# (factory, layers, seq), None for the factory's default; the encoder's sizes are options (12 x 768 at seq 512, BERT-
# base, peaks at 4-5 GB with AdamW), --quick a tiny pair with SGD and the default structure only
QUICK_REAL = (("deep_mlp", 2, None), ("encoder", 1, 32)), ("sgd",), ("one_b", "three_graphs")
# (model, --memory, --global-batch): issue 45's encoder, --quick the test's small one
PLAN_BUDGET = (("parameter_heavy:encoder_4x768", "1400MiB", 16), ("parameter_heavy:encoder", "1GiB", 8))
# dropout: the encoder's (layers, seq) for memory (BERT-base at sequence 512) and for time, rounds and steps per round
DROPOUT = (((12, 512), (6, 384), 7, 2), ((1, 64), (1, 64), 1, 1))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a 1-2 minute smoke run: every section runs, too briefly to measure")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections: " + ", ".join(SECTIONS) + " (default: all)")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help="fresh processes per memory figure, whose median is shown (default 3; 1 with --quick)")
    parser.add_argument("--encoder-layers", type=int, default=12, metavar="L",
                        help="real_size: the BERT-shaped encoder's layers (default 12)")
    parser.add_argument("--encoder-seq", type=int, default=512, metavar="S",
                        help="real_size: the encoder's sequence length (default 512)")
    parser.add_argument("--data", help="MNIST_Data directory (default $MS_ACCUM_MNIST or ../shared/data/MNIST_Data)")
    parser.add_argument("--json", metavar="PATH", help="also write every sample and figure to PATH")
    args = parser.parse_args(argv)
    args.only = args.only.split(",")
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = 1 if args.quick else 0
    started = time.time()
    print(common.header(), flush=True)
    print(f"mode    : {'quick (a smoke run: no figure is a measurement)' if args.quick else 'full'}; sections "
          f"{', '.join(args.only)}\n", flush=True)
    common.setup()
    results = {"header": common.header(), "quick": args.quick, "tables": [], "memory": {}}

    def show(table) -> None:
        print(table.render() + "\n", flush=True)
        results["tables"].append(table.to_json())

    def section(name: str) -> bool:
        if name in args.only:
            common.log(f"-- {name}: {SECTIONS[name]} ({time.time() - started:.0f} s so far)")
        return name in args.only

    from . import memory, parallel, speed
    if section("step"):
        batches = _lenet_batches(16, common.mnist_dir(args.data))
        show(speed.step(batches, ROUNDS["step"][mode], STEP_MICRO_BATCHES[mode], WARMUP[mode]))
    if section("epoch"):
        data_dir = common.mnist_dir(args.data)
        if data_dir is None:
            print("== epoch. skipped: no MNIST directory (pass --data DIR or set MS_ACCUM_MNIST)\n", flush=True)
        else:
            show(speed.epoch(data_dir, EPOCH_IMAGES[mode], ROUNDS["epoch"][mode], WARMUP[mode]))
    if section("epoch_alone"):
        data_dir = common.mnist_dir(args.data)
        if data_dir is None:
            print("== epoch_alone. skipped: no MNIST directory (pass --data DIR or set MS_ACCUM_MNIST)\n", flush=True)
        else:
            from . import alone
            show(alone.table(data_dir, EPOCH_IMAGES[mode] // 2, ROUNDS["epoch_alone"][mode]))
    for net in ("conv_net", "char_transformer"):
        if section(net):
            show(speed.heavy(net, HEAVY_WINDOWS[mode], ROUNDS["heavy"][mode], WARMUP[mode]))
    if section("activations"):
        nets, columns = QUICK_ACTIVATIONS if args.quick else (memory.ACTIVATION_NETS, memory.ACTIVATION_COLUMNS)
        rows = memory.activations(ACTIVATION_KS[mode], nets, columns, args.repeats, common.log)
        print(memory.render_activations(rows) + "\n", flush=True)
        results["memory"]["activations"] = rows
    if section("parameters"):
        rows = memory.parameters(QUICK_PARAMETERS if args.quick else memory.PARAMETER_ROWS, 4, args.repeats,
                                 common.log)
        print(memory.render_parameters(rows) + "\n", flush=True)
        results["memory"]["parameters"] = rows
    if section("real_size"):
        if args.quick:
            networks, optimizers, contenders = QUICK_REAL
        else:
            networks = (("deep_mlp", None, None), ("encoder", args.encoder_layers, args.encoder_seq))
            optimizers, contenders = memory.REAL_OPTIMIZERS, memory.REAL_CONTENDERS
        rows = memory.real_size(networks, optimizers, contenders, args.repeats, common.log)
        print(memory.render_real_size(rows) + "\n", flush=True)
        results["memory"]["real_size"] = rows
    if section("parallel"):
        show(parallel.table(ROUNDS["parallel"][mode], PARALLEL_WINDOWS[mode]))
    if section("cached"):
        from . import cached
        rows = cached.memory(ACTIVATION_KS[mode], args.repeats, common.log)
        print(cached.render_memory(rows) + "\n", flush=True)
        results["memory"]["cached"] = rows
        show(cached.speed(4, ROUNDS["heavy"][mode], HEAVY_WINDOWS[mode], WARMUP[mode]))

    if section("plan_budget"):
        from . import plan_budget
        model, memory_size, global_batch = PLAN_BUDGET[mode]
        row = plan_budget.measure(memory_size, global_batch, args.repeats, common.log, model)
        print(plan_budget.render(row) + "\n", flush=True)
        results["memory"]["plan_budget"] = row
    if section("sharding"):
        from . import sharding
        rows = sharding.measure(("mlp",) if args.quick else ("mlp", "encoder"), 3 if args.quick else 6,
                                1 if args.quick else 3, common.log)
        print(sharding.render(rows) + "\n", flush=True)
        results["memory"]["sharding"] = rows

    if section("dropout"):
        from . import dropout
        (layers, seq), (time_layers, time_seq), rounds, steps = DROPOUT[mode]
        figures = dropout.memory(layers, seq, args.repeats, common.log)
        print(dropout.render_memory(figures) + "\n", flush=True)
        results["memory"]["dropout"] = figures
        for table in dropout.speed(time_layers, time_seq, rounds, steps, WARMUP[mode]):
            show(table)

    if section("adaptive"):
        from . import adaptive
        results["adaptive"] = {}
        for task in adaptive.TASKS:
            result = adaptive.measure(task, args.quick, args.data, common.log)
            print(result["text"] + "\n", flush=True)
            results["adaptive"][task] = result

    if section("peer"):
        from . import peer
        for name in peer.NETWORKS:
            show(peer.speed(name, ROUNDS["peer"][mode], 1 if args.quick else None))
        names, contenders = QUICK_PEER if args.quick else (tuple(peer.NETWORKS), tuple(peer.CONTENDERS))
        rows = peer.memory(names, contenders, args.repeats, common.log)
        print(peer.render_memory(rows) + "\n", flush=True)
        found = peer.exactness(names if args.quick else tuple(peer.NETWORKS))
        print(peer.render_exactness(found) + "\n", flush=True)
        results["memory"]["peer"], results["peer_exactness"] = rows, found

    print(f"total {time.time() - started:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, default=str)
    return 0


def _lenet_batches(count: int, data_dir):
    """`count` (images, labels) numpy micro-batches of 32 for LeNet5: real MNIST when there is some, else random."""
    import numpy as np
    if data_dir is not None:
        from ms_accum.demo.data import create_dataset
        dataset = create_dataset(data_dir, 32, num_samples=32 * count, seed=0)
        batches = list(dataset.create_tuple_iterator(output_numpy=True))
        if len(batches) == count:
            return [tuple(batch) for batch in batches]
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((32, 1, 32, 32), dtype=np.float32), rng.integers(0, 10, 32).astype(np.int32))
            for _ in range(count)]


if __name__ == "__main__":
    sys.exit(main())

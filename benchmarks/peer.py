"""The peer: mindcv's accumulation, `TrainStep(..., gradient_accumulation_steps=K)` through `mindspore.train.Model`
as mindcv's `create_trainer` runs it, against ms_accum's structures, plain steps of B and one K·B step.

    python -m benchmarks.peer NETWORK CONTENDER            (one memory figure: prints {"peak": bytes, "params": bytes})
    python -m benchmarks.peer --speed NETWORK CONTENDER N  (one timed run of N windows: prints ms per window)

The networks, K=4:

- ``conv_net``: activation-heavy, `ms_accum.demo.models.conv_net` (4 conv3x3 x 32 channels on 3x96x96), B=8;
- ``mlp``: parameter-heavy, `deep_mlp` at 8 x Dense(1024, 1024) (32 MiB of parameters), Momentum(0.01, 0.9), B=32;
- ``lenet5``: LeNet5 on real MNIST images (`ms_accum.demo.data.create_dataset`'s, read once into arrays), B=32;
- ``recipe``: the fine-tuning recipe's model at its defaults (`tutorials/finetune_bert.py`: the BERT-shaped
  `BertClassifier`, 2 layers of width 128 at sequence 128, dropout 0.1, AdamW on its warm-up-then-decay schedule),
  B=16, on its Tiny Shakespeare sentence pairs, without its clipping (mindcv would clip each micro-batch).

Speed: each contender alone in a fresh process per round, the rounds alternating the order (a user's process holds one
contender's graphs; beside other graphs MindSpore runs a graph differently, `alone`), over a dataset of its
micro-batches (the K·B step: of K·B): a first pass that compiles, then two timed passes; ms per window. Memory: one
fresh process per figure, the growth of the peak resident memory (VmHWM) from just before the contender is built over
two windows. Exactness: every contender trains three windows from the same weights on the same samples (the recipe
with dropout off), and its largest weight difference to the K·B step's, compared by position (mindcv renames the
parameters); the clipped contenders, mindcv's ``clip_grad=True`` (each micro-batch's gradient clipped) and ms_accum's
``clip_norm`` (the window's), against a K·B step clipped alike (mindcv's `TrainStep` without accumulation).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable, Dict, List, Optional

from .common import (K, MIB, Table, build, executor, fresh_process, log, mindcv_model, mnist_dir, model_train,
                     one_step_cell, over, recipe_module, setup)

NETWORKS = {"conv_net": 8, "mlp": 32, "lenet5": 32, "recipe": 16}  # name -> micro-batch B
SPEED_WINDOWS = {"conv_net": 6, "mlp": 24, "lenet5": 50, "recipe": 6}  # a timed pass's windows: a few seconds
SPEED_CONTENDERS = ("one_b", "mindcv", "three_graphs")  # the goal's: the default against the peer and plain steps
CONTENDERS = {
    "one_b": "plain steps of B (nn.TrainOneStepCell)",
    "one_kb": "one K·B step",
    "mindcv": "mindcv TrainStep: K=4, through Model",
    "three_graphs": "ms_accum default ('three_graphs')",
    "fused": "ms_accum 'fused'",
    "window": "ms_accum 'window'",
}
CLIP = 0.01  # small enough to bind on every network here: each micro-batch's and each window's gradient is larger
CLIPPED = {"mindcv": "mindcv TrainStep, clip_grad=True", "three_graphs": "ms_accum default, clip_norm"}
EXACT_WINDOWS = 3


def parts(name: str, dropout: bool = True):
    """(network, loss, optimizer, sample) of `name`, the same weights every call; ``sample(n)``: n samples' columns."""
    if name == "recipe":
        module = recipe_module()
        _, args = module.parse([] if dropout else ["--dropout", "0"])
        vocab, columns, _ = module.prepare(args)
        return (*module.build(args, vocab, total_steps=100), lambda n: tuple(column[:n] for column in columns))
    if name == "lenet5":
        return (*build("lenet5")[:3], _mnist)
    return build("deep_mlp", layers=8, width=1024) if name == "mlp" else build(name)


def _mnist(n: int):
    """The first `n` real MNIST training images and labels, as `create_dataset` makes them, in arrays."""
    import numpy as np
    from ms_accum.demo.data import create_dataset
    data_dir = mnist_dir()
    if data_dir is None:
        raise SystemExit("lenet5 needs real MNIST: set MS_ACCUM_MNIST (benchmarks/README.md)")
    batches = list(create_dataset(data_dir, n, num_samples=n, seed=0).create_tuple_iterator(output_numpy=True))
    return tuple(np.ascontiguousarray(column) for column in batches[0])


def runner(contender: str, network, loss, optimizer, columns, micro: int,
           clip: Optional[float] = None) -> Callable[[int], None]:
    """fn(n) for `interleave`: one pass of `contender` over `columns` in micro-batches of `micro` (of K x `micro` for
    the K·B step); `clip` clips as the contender does (the K·B step through mindcv's `TrainStep` without
    accumulation)."""
    import mindspore.dataset as ds
    from ms_accum.train.options import QUIET, WindowOptions

    def data(batch):
        return ds.NumpySlicesDataset({f"column{i}": column for i, column in enumerate(columns)},
                                     shuffle=False).batch(batch, drop_remainder=True)

    if contender == "one_kb" and clip is not None:
        return model_train(mindcv_model(network, loss, optimizer, 1, clip), data(K * micro))
    if contender in ("one_b", "one_kb"):
        return over(data(micro * (K if contender == "one_kb" else 1)), one_step_cell(network, loss, optimizer))
    if contender == "mindcv":
        return model_train(mindcv_model(network, loss, optimizer, K, clip), data(micro))
    model = executor(network, loss, optimizer, contender, window=WindowOptions(clip_norm=clip))
    dataset = data(micro)
    return lambda _n: model.train_process(1, dataset, K, checkpoints=None, log=QUIET)


# ------------------------------------------------------------------------------------------------------------ speed
def speed(name: str, rounds: int, windows: Optional[int] = None) -> Table:
    """`name`'s speed contenders, each alone in a fresh process per round, alternated; ms per window."""
    windows = windows or SPEED_WINDOWS[name]
    samples: Dict[str, List[float]] = {CONTENDERS[c]: [] for c in SPEED_CONTENDERS}
    for r in range(rounds):
        order = SPEED_CONTENDERS[r % len(SPEED_CONTENDERS):] + SPEED_CONTENDERS[:r % len(SPEED_CONTENDERS)]
        for contender in order:
            found = fresh_process(["-m", "benchmarks.peer", "--speed", name, contender, str(windows)])
            samples[CONTENDERS[contender]].append(found["ms"])
        log(f"   peer speed {name}: round {r + 1} of {rounds} done")
    table = Table(f"peer {name}", f"{name} over a dataset of {windows} windows of K={K} x B={NETWORKS[name]}, each "
                  "contender alone in a fresh process (its graphs compiled on a first pass, then two timed passes; "
                  "ms_accum through GradientAccumulation.train_process, mindcv through Model.train)",
                  f"window of {K * NETWORKS[name]} samples", CONTENDERS["mindcv"])
    table.rows = samples
    table.note_goal([(CONTENDERS["three_graphs"], CONTENDERS[to]) for to in ("mindcv", "one_b")], 1.00)
    return table


def timed(name: str, contender: str, windows: int) -> float:
    """ms per window of `contender` over `windows` windows of `name`, after a first pass that compiles, here."""
    setup()
    network, loss, optimizer, sample = parts(name)
    run = runner(contender, network, loss, optimizer, sample(windows * K * NETWORKS[name]), NETWORKS[name])
    run(0)
    start = time.perf_counter()
    run(0)
    run(0)
    return (time.perf_counter() - start) * 1e3 / (2 * windows)


# ----------------------------------------------------------------------------------------------------------- memory
def measure(name: str, contender: str):
    """(peak RSS growth, trainable bytes) of `contender` training two windows of `name`, here."""
    from ms_accum.tools.planner import process_status
    setup()
    network, loss, optimizer, sample = parts(name)
    columns = sample(2 * K * NETWORKS[name])
    start = process_status("VmRSS")
    # The high-water mark starts here (Linux): reading MNIST's files held more than LeNet5 trains in, and would hide it.
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")
    runner(contender, network, loss, optimizer, columns, NETWORKS[name])(0)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in network.trainable_params()))


def memory(names=tuple(NETWORKS), contenders=tuple(CONTENDERS), repeats: int = 3, log=None) -> List[dict]:
    """The median peak over `repeats` fresh processes of every (network, contender)."""
    rows = []
    for name in names:
        for contender in contenders:
            if log:
                log(f"   peer memory: {name} {contender}")
            runs = [fresh_process(["-m", "benchmarks.peer", name, contender]) for _ in range(repeats)]
            rows.append({"network": name, "contender": contender, "peak": statistics.median(r["peak"] for r in runs),
                         "peaks": [r["peak"] for r in runs], "params": runs[0]["params"]})
    return rows


def render_memory(rows: List[dict]) -> str:
    lines = [f"== peer memory. peak RSS growth over two windows of K={K}, median of {len(rows[0]['peaks'])} fresh "
             "process(es) per figure: MiB, as a multiple of the plain step of B's, and above it in units of the "
             "parameters (the buffer alone: +1.00x)",
             f"   {'network':<10}{'params MiB':>11}  {'contender':<40}{'MiB':>8}{'x one B':>9}{'over one B':>12}"]
    for name in dict.fromkeys(r["network"] for r in rows):
        group = [r for r in rows if r["network"] == name]
        plain = next(r["peak"] for r in group if r["contender"] == "one_b")
        for row in group:
            lines.append(f"   {name:<10}{row['params'] / MIB:>11.0f}  {CONTENDERS[row['contender']]:<40}"
                         f"{row['peak'] / MIB:>8.0f}{row['peak'] / plain:>9.2f}"
                         f"{(row['peak'] - plain) / row['params']:>+11.2f}x")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------- exactness
def exactness(names=tuple(NETWORKS), windows: int = EXACT_WINDOWS) -> Dict[str, Dict[str, float]]:
    """network -> contender -> max |weight - the K·B step's| after `windows` windows (clipped: both at `CLIP`)."""
    import numpy as np

    def trained(name, contender, clip=None):
        network, loss, optimizer, sample = parts(name, dropout=False)
        runner(contender, network, loss, optimizer, sample(windows * K * NETWORKS[name]), NETWORKS[name], clip)(0)
        return [p.asnumpy() for p in network.trainable_params()]

    def difference(mine, reference):
        return max(float(np.abs(a - b).max()) for a, b in zip(mine, reference))

    found = {}
    for name in names:
        log(f"   peer exactness: {name}")
        big, clipped = trained(name, "one_kb"), trained(name, "one_kb", CLIP)
        found[name] = {title: difference(trained(name, c), big) for c, title in CONTENDERS.items() if c != "one_kb"}
        found[name].update({title: difference(trained(name, c, CLIP), clipped) for c, title in CLIPPED.items()})
    return found


def render_exactness(found: Dict[str, Dict[str, float]], windows: int = EXACT_WINDOWS) -> str:
    names = list(found)
    titles = list(found[names[0]])
    width = max(len(t) for t in titles) + 2
    lines = [f"== peer exactness. max |weight - the K·B step's| after {windows} windows of K={K} from the same "
             "weights on the same samples (B: " + ", ".join(f"{n} {NETWORKS[n]}" for n in names)
             + ("; the recipe with dropout off" if "recipe" in names else "")
             + f"); the clipped rows at {CLIP} against a K·B step clipped alike",
             f"   {'contender':<{width}}" + "".join(f"{n:>12}" for n in names)]
    lines += [f"   {t:<{width}}" + "".join(f"{found[n][t]:>12.1e}" for n in names) for t in titles]
    lines.append("   expected: float32 rounding for every accumulating contender unclipped and for ms_accum clipped; "
                 "the plain steps update every micro-batch; mindcv's clip_grad clips each micro-batch, not the window")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="one peer memory figure, or with --speed one timed run")
    parser.add_argument("--speed", action="store_true", help="time WINDOWS windows instead of measuring memory")
    parser.add_argument("network", choices=list(NETWORKS))
    parser.add_argument("contender", choices=list(CONTENDERS))
    parser.add_argument("windows", nargs="?", type=int, default=None)
    args = parser.parse_args(argv)
    if args.speed:
        print(json.dumps({"ms": timed(args.network, args.contender, args.windows or SPEED_WINDOWS[args.network])}),
              flush=True)
        return
    peak, params = measure(args.network, args.contender)
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)


if __name__ == "__main__":
    main()

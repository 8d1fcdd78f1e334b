"""Whether an adaptive K pays: optimizer steps and samples to a validation loss, fixed K against a ramp and AdaptiveK.

For each task (LeNet5 on real MNIST; the Shakespeare tutorial's character Transformer, token-weighted) every contender
trains its own copy of the network from the same initial weights, over the same batches in the same order, for the same
budget of samples, through `GradientAccumulation.train_process`, and is scored on a fixed held-out set every
`eval_samples` samples (at the first window that closes at or after each multiple):

- fixed K: a small grid k_min, 2 k_min, 4 k_min, 8 k_min;
- ramp: a hand-written ramp-up of the global batch (`ms_accum.rampup`), k_min to 8 k_min over most of the budget;
- adaptive: `ms_accum.AdaptiveK`, K chosen from the measured gradient noise scale.

Learning rates, one rule for all: the rate tuned for k_min, times the factor of the task's `lr_rule` for the window's
K, the rule the adaptive run is given ("linear": S = K/k_min, "sqrt": its square root, "adascale": AdaScale's gain
from the run's own noise-scale estimate; `lr_scale`).

The target is the smallest fixed K's validation loss at the budget; every contender trains 10 % past the budget, so a
contender that needs up to 1.10x the samples still reaches it. The table gives each contender's loss at the budget
(equal samples), and the optimizer steps and samples at its first evaluation at or below the target (nothing
interpolated), with their ratios to the smallest fixed K's. The goal (issue 52): the adaptive run at least 30 % fewer
optimizer steps at no more than 1.10x the samples, on at least one task. Every figure is a count or a loss: no time is
measured, so the machine's load does not change them.

    .venv/bin/python -m benchmarks.adaptive [--task mnist,shakespeare] [--quick] [--json PATH] [--plot DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from . import common

TAIL = 0.10          # every contender trains 10 % past the budget: reaching the target at up to 1.10x counts
GOAL_STEPS = 0.70    # the adaptive run: at most this many optimizer steps of the smallest fixed K's ...
GOAL_SAMPLES = 1.10  # ... at no more than this many of its samples
BAND = 5             # the smallest fixed K's last scores shown beside the target, how much it moves


@dataclass
class Task:
    """One task's settings: micro-batch, K, learning rate and its rule, the budget and the adaptive run's options.

    Attributes:
        name: "mnist" or "shakespeare".
        batch: Samples per micro-batch (images, or speeches).
        k_min: The smallest K: the grid's first, the ramp's start and AdaptiveK's k_min.
        k_max: AdaptiveK's largest K (the grid and the ramp stop at `grid[-1]` x k_min).
        lr: The learning rate tuned for k_min.
        lr_rule: How every contender scales `lr` with K/k_min ("none", "linear", "sqrt").
        budget: Samples each contender is compared at (it trains 10 % more: `tail_end`).
        eval_samples: Samples between two validation scores.
        grid: The fixed K's, as multiples of k_min.
        adaptive: AdaptiveK's keyword options (fraction, min_samples, every, threshold, beta).
        seed: The initial weights' and the data order's seed (the Shakespeare split's too).
        defaults_too: Whether AdaptiveK also runs with its default min_samples and every.
    """

    name: str
    batch: int
    k_min: int
    k_max: int
    lr: float
    lr_rule: str
    budget: int
    eval_samples: int
    grid: tuple = (1, 2, 4, 8)
    adaptive: dict = field(default_factory=dict)
    seed: int = 0
    defaults_too: bool = False


# The full run's settings, then --quick's (a smoke run: every contender trains a few windows, nothing is measured).
TASKS = {
    "mnist": (Task("mnist", batch=16, k_min=2, k_max=32, lr=0.01, lr_rule="adascale", budget=61440, eval_samples=3072,
                   adaptive={"fraction": 0.5, "min_samples": 16384}, defaults_too=True),
              Task("mnist", batch=16, k_min=2, k_max=8, lr=0.01, lr_rule="adascale", budget=2048, eval_samples=512,
                   grid=(1, 2), adaptive={"fraction": 0.5, "min_samples": 256, "every": 256})),
    "shakespeare": (Task("shakespeare", batch=8, k_min=2, k_max=16, lr=2e-3, lr_rule="sqrt", budget=3840,
                         eval_samples=384, adaptive={"fraction": 1.0}),
                    Task("shakespeare", batch=8, k_min=2, k_max=8, lr=2e-3, lr_rule="sqrt", budget=256,
                         eval_samples=64, grid=(1, 2), adaptive={"fraction": 1.0, "min_samples": 64, "every": 64})),
}
MNIST_HELD_OUT = 5000      # test images scored (model noise, not this sample, moves the loss most)
SHAKESPEARE_HELD_OUT = 10  # held-out batches of the tutorial's 32 speeches scored


def tail_end(task: Task) -> int:
    """The samples each contender trains: the budget and 10 % more, in whole evaluation intervals."""
    return task.budget + round(TAIL * task.budget / task.eval_samples) * task.eval_samples


# -------------------------------------------------------------------------------------------------------------- data
@dataclass
class Data:
    """What a task trains and scores on.

    Attributes:
        network: Builds the network, the same weights every call.
        loss: Builds the training loss.
        dataset: Builds the training dataset, the same batches in the same order every call.
        epochs: Epochs of `dataset` that hold the budget and its tail.
        held_out: (inputs, labels) numpy batches scored.
        weighted: Whether the loss returns (loss, tokens): token-weighted windows and validation.
        micro_weight: A micro-batch's mean weight, the noise scale's unit: samples, or tokens when `weighted`.
        note: What the data is, for the table's title.
    """

    network: Callable
    loss: Callable
    dataset: Callable
    epochs: int
    held_out: list
    weighted: bool
    micro_weight: float
    note: str


def mnist_data(task: Task, data_dir: Optional[str]) -> Data:
    """LeNet5 on real MNIST, batches of `task.batch` in a fixed shuffled order; the first MNIST_HELD_OUT test images.

    Args:
        task: The task's settings.
        data_dir: The MNIST_Data directory, or None for $MS_ACCUM_MNIST or ../shared/data/MNIST_Data.

    Returns:
        Data.
    """
    import mindspore as ms
    from mindspore import nn
    from ms_accum.demo import LeNet5
    from ms_accum.demo.data import create_dataset
    data_dir = common.mnist_dir(data_dir)
    if data_dir is None:
        raise SystemExit("adaptive: no MNIST directory (pass --data DIR or set MS_ACCUM_MNIST)")
    test = create_dataset(data_dir, 500, usage="test", num_samples=MNIST_HELD_OUT)
    held_out = [tuple(batch) for batch in test.create_tuple_iterator(output_numpy=True)]
    per_epoch = 60000 // task.batch * task.batch

    def network():
        ms.set_seed(task.seed)
        return LeNet5()

    return Data(network, lambda: nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                lambda: create_dataset(data_dir, task.batch, seed=task.seed),
                epochs=math.ceil(tail_end(task) / per_epoch), held_out=held_out, weighted=False,
                micro_weight=float(task.batch),
                note=f"LeNet5, real MNIST, {MNIST_HELD_OUT} test images held out")


def _tutorial():
    """The Shakespeare tutorial as a module (tutorials/ is not a package)."""
    path = os.path.join(common.REPO, "tutorials", "char_transformer_shakespeare.py")
    spec = importlib.util.spec_from_file_location("char_transformer_shakespeare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shakespeare_data(task: Task) -> Data:
    """The tutorial's data and model: one speech per sequence, padded to buckets, in micro-batches of `task.batch`
    speeches (its split and order); the first SHAKESPEARE_HELD_OUT of its held-out batches of 32 speeches.

    Args:
        task: The task's settings.

    Returns:
        Data.
    """
    import mindspore as ms
    import mindspore.dataset as ds
    from ms_accum import TokenCrossEntropy
    from ms_accum.demo import CharTransformer
    tutorial = _tutorial()
    speeches = tutorial.read_speeches(None)  # $MS_ACCUM_SHAKESPEARE, else ../shared/data beside the checkout
    rng = np.random.default_rng(task.seed)
    vocab_chars = sorted(set("".join(speeches)))
    index = {c: i + 1 for i, c in enumerate(vocab_chars)}  # 0 pads the inputs
    encoded = tutorial.encode(speeches, index)
    order = rng.permutation(len(encoded))
    held = len(encoded) // 10
    val = tutorial.batches([encoded[i] for i in order[:held]], rng, tutorial.VAL_BATCH)[:SHAKESPEARE_HELD_OUT]
    train = tutorial.batches([encoded[i] for i in order[held:]], rng, task.batch)

    def network():
        ms.set_seed(task.seed)
        return CharTransformer(len(index) + 1, tutorial.WIDTH, tutorial.HEADS, tutorial.LAYERS, tutorial.MAX_LEN)

    # The tutorial's micro-batches, one speech a row, batched again: the same batches, but the dataset's batch size
    # is the micro-batch's speeches, so the samples consumed count speeches (a dataset of whole micro-batches counts
    # each as one sample).
    rows = [(tokens[i], targets[i]) for tokens, targets in train for i in range(len(tokens))]

    def dataset():
        return ds.GeneratorDataset(rows, column_names=["tokens", "targets"], shuffle=False).batch(task.batch)

    return Data(network, lambda: TokenCrossEntropy(tutorial.IGNORE), dataset,
                epochs=math.ceil(tail_end(task) / (len(train) * task.batch)), held_out=val, weighted=True,
                micro_weight=float(np.mean([(y != tutorial.IGNORE).sum() for _, y in train])),
                note=f"the tutorial's CharTransformer, Adam, token-weighted, {len(val) * tutorial.VAL_BATCH} "
                     f"held-out speeches")


# ------------------------------------------------------------------------------------------------------- contenders
def contenders(task: Task) -> Dict[str, dict]:
    """Each contender's `mini_steps` (an int, a dict schedule or an AdaptiveK) by name.

    Args:
        task: The task's settings.

    Returns:
        dict, name -> what `train_process` takes as `mini_steps`.
    """
    from ms_accum import rampup
    out = {f"fixed K={task.k_min * multiple}": task.k_min * multiple for multiple in task.grid}
    # The ramp: the global batch grows from k_min's to the grid's largest in equal steps over the first 3/4 of the
    # budget, Megatron-LM's --rampup-batch-size written by hand.
    first, increments = task.k_min * task.batch, task.grid[-1] - 1
    out[f"ramp K={task.k_min}->{task.k_min * task.grid[-1]}"] = rampup(
        start=first, increment=first, samples_per_increment=task.budget * 3 // 4 // increments,
        global_batch=first * task.grid[-1], batch_size=task.batch)
    adaptive = adaptive_k(task)
    if adaptive is not None:
        out["AdaptiveK"] = adaptive
        if task.defaults_too:  # and without the task's min_samples and every: its defaults
            out["AdaptiveK (defaults)"] = adaptive_k(task, min_samples=None, every=None)
    return out


def adaptive_k(task: Task, **changes):
    """The AdaptiveK contender, or None in an ms_accum without it (before issue 52).

    Args:
        task: The task's settings.
        changes: Keyword options that replace the task's.

    Returns:
        ms_accum.AdaptiveK, or None.
    """
    import ms_accum
    if not hasattr(ms_accum, "AdaptiveK"):
        return None
    return ms_accum.AdaptiveK(task.k_min, task.k_max, lr_rule=task.lr_rule, **{**task.adaptive, **changes})


# ------------------------------------------------------------------------------------------------------------- runs
def _scorer(network, loss_fn, held_out, weighted: bool) -> Callable[[], float]:
    """The held-out loss (sample- or token-weighted mean) of `network`, through one graph of network and loss."""
    from mindspore import Tensor, nn

    class Scored(nn.Cell):
        """The network and its loss: the loss, or (loss, tokens)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.network, self.loss_fn = network, loss_fn

        def construct(self, x, y):
            return self.loss_fn(self.network(x), y)

    cell = Scored()
    batches = [(Tensor(x), Tensor(y)) for x, y in held_out]

    def score() -> float:
        network.set_train(False)
        total = count = 0.0
        for x, y in batches:
            out = cell(x, y)
            loss, weight = (out if weighted else (out, x.shape[0]))
            total += float(loss.asnumpy()) * float(np.asarray(weight))
            count += float(np.asarray(weight))
        network.set_train(True)
        return total / count

    return score


def run(task: Task, data: Data, name: str, k, log: Callable[[str], None]) -> dict:
    """Trains one contender for the budget and its tail, scoring it every `task.eval_samples` samples.

    The learning rate is k_min's, `task.lr`, times the factor of `task.lr_rule` for the window's K: AdaptiveK applies
    its own; for the others a `SamplesLR` computes the same factor when each window opens, "adascale" from the run's
    own noise-scale estimate (the last window's) and k_min's global batch in the estimate's unit (for tokens, the
    training set's mean tokens per micro-batch, where AdaptiveK averages the windows it saw).

    Args:
        task: The task's settings.
        data: The task's data and network.
        name: The contender's name.
        k: What `train_process` takes as `mini_steps`: an int, a dict schedule or an AdaptiveK.
        log: Where progress goes.

    Returns:
        dict: the per-window curves (samples consumed, K, noise scale, lr scale) and the scores (samples, step, loss).
    """
    from mindspore import nn
    from ms_accum import (AccumulationSchedule, AdaptiveK, GradientAccumulation, LogOptions, SamplesLR,
                          StatisticsOptions, WindowOptions)
    from ms_accum.train.adaptive import lr_factor  # the rule AdaptiveK applies, for the fixed K and the ramp too
    network = data.network()
    loss_fn = data.loss()
    state = {"estimate": None, "scale": 1.0}  # the run's last noise-scale estimate; the factor of the open window
    if isinstance(k, AdaptiveK):
        rate = task.lr
    else:
        k_of = AccumulationSchedule(k)
        b0 = task.k_min * data.micro_weight

        def rate_for(samples: int) -> float:
            state["scale"] = lr_factor(task.lr_rule, k_of(samples) / task.k_min, state["estimate"], b0)
            return task.lr * state["scale"]

        rate = SamplesLR(rate_for)
    if task.name == "mnist":
        optimizer = nn.Momentum(network.trainable_params(), rate, 0.9)
    else:
        optimizer = nn.Adam(network.trainable_params(), rate)
    executor = GradientAccumulation(
        network, loss_fn, optimizer, statistics=StatisticsOptions(noise_scale=True),
        window=WindowOptions(reduction="weighted_mean" if data.weighted else "mean"))
    score = _scorer(network, data.loss(), data.held_out, data.weighted)
    end = tail_end(task)
    curve = {"name": name, "samples": [], "k": [], "noise_scale": [], "lr_scale": [], "loss": [],
             "scores": [{"samples": 0, "step": 0, "loss": score()}]}

    def on_step(record) -> bool:
        curve["samples"].append(record.samples_consumed)
        curve["k"].append(record.accumulate_step)
        curve["noise_scale"].append(record.noise_scale)
        curve["lr_scale"].append(state["scale"] if isinstance(rate, SamplesLR) else record.lr_scale)
        state["estimate"] = record.noise_scale
        curve["loss"].append(record.loss)
        # Scored at the first window that closes at or after each multiple of eval_samples (a window of the
        # adaptive run need not end on one).
        if record.samples_consumed // task.eval_samples > curve["scores"][-1]["samples"] // task.eval_samples:
            curve["scores"].append({"samples": record.samples_consumed, "step": record.step, "loss": score()})
        return record.samples_consumed >= end  # stops the run: the budget and its tail are done

    executor.train_process(data.epochs, data.dataset(), mini_steps=k, checkpoints=None,
                           log=LogOptions(verbose=False, on_step=on_step))
    last = curve["scores"][-1]
    log(f"   {task.name} {name}: {last['step']} steps, {last['samples']} samples, held-out loss {last['loss']:.4f}")
    return curve


# ---------------------------------------------------------------------------------------------------------- figures
def _first(scores: List[dict], test: Callable[[dict], bool]) -> Optional[dict]:
    """The first of `scores` that passes `test`, None if none does."""
    return next((score for score in scores if test(score)), None)


def summarize(task: Task, curves: List[dict]) -> dict:
    """The table's figures: each contender's loss at the budget, and its steps and samples to reach the target, the
    smallest fixed K's loss at the budget (its first score at or below it; nothing interpolated).

    Args:
        task: The task's settings.
        curves: `run`'s results, the smallest fixed K first.

    Returns:
        dict with "target" and one row per contender (None where the target was not reached).
    """
    target = _first(curves[0]["scores"], lambda s: s["samples"] >= task.budget)["loss"]
    rows = []
    for curve in curves:
        at_budget = _first(curve["scores"], lambda s: s["samples"] >= task.budget)
        reached = _first(curve["scores"], lambda s: s["loss"] <= target)
        ks = curve["k"]
        rows.append({"name": curve["name"], "loss_at_budget": at_budget["loss"], "budget_samples": at_budget["samples"],
                     "budget_steps": at_budget["step"], "k_range": (min(ks), max(ks)),
                     "steps_to_target": reached and reached["step"],
                     "samples_to_target": reached and reached["samples"]})
    reference = rows[0]
    for row in rows:
        for key in ("steps", "samples"):
            mine = row[f"{key}_to_target"]
            row[f"{key}_ratio"] = None if mine is None else mine / reference[f"{key}_to_target"]
    # How much the target itself moves: the smallest fixed K's last scores up to the budget (a constant rate keeps
    # the weights moving, so one score is one draw of that).
    band = [score["loss"] for score in curves[0]["scores"] if score["samples"] <= task.budget][-BAND:]
    return {"target": target, "band": (min(band), max(band)), "rows": rows}


def goal(row: dict) -> str:
    """Whether `row` meets the goal: at least 30 % fewer optimizer steps at no more than 1.10x the samples."""
    if row["steps_ratio"] is None:
        return "NOT met (target not reached within 1.10x the budget)"
    met = row["steps_ratio"] <= GOAL_STEPS and row["samples_ratio"] <= GOAL_SAMPLES
    return (f"{row['steps_ratio']:.3f}x the steps at {row['samples_ratio']:.3f}x the samples: "
            f"{'met' if met else 'NOT met'}")


def render(task: Task, data: Data, summary: dict) -> str:
    """The task's table, its target and the goal line.

    Args:
        task: The task's settings.
        data: The task's data (its note).
        summary: `summarize`'s result.

    Returns:
        str, the lines to print.
    """
    unit = "tokens" if data.weighted else "samples"
    lines = [f"== adaptive. {task.name}: {data.note}; micro-batch {task.batch}, lr {task.lr:g} for K={task.k_min} "
             f"x {task.lr_rule} of K/{task.k_min} for every contender; seed {task.seed}; budget {task.budget} samples "
             f"(trained to {tail_end(task)}), held-out loss every {task.eval_samples} samples",
             f"   target: fixed K={task.k_min}'s held-out loss at the budget, {summary['target']:.4f}; AdaptiveK"
             f"({task.k_min}, {task.k_max}, lr_rule={task.lr_rule!r}, "
             f"{', '.join(f'{key}={value}' for key, value in task.adaptive.items())}), its noise scale in {unit}; "
             f"fixed K={task.k_min}'s last {BAND} scores to the budget span {summary['band'][0]:.4f}-"
             f"{summary['band'][1]:.4f}",
             f"   {'contender':<22} {'K':>7} {'loss at budget':>15} {'steps at budget':>16} {'steps to target':>16} "
             f"{'samples to target':>18} {'x steps':>8} {'x samples':>10}"]
    for row in summary["rows"]:
        low, high = row["k_range"]
        k = f"{low}" if low == high else f"{low}-{high}"
        reached = row["steps_to_target"] is not None
        lines.append(
            f"   {row['name']:<22} {k:>7} {row['loss_at_budget']:>15.4f} {row['budget_steps']:>16d} "
            f"{row['steps_to_target'] if reached else 'not reached':>16} "
            f"{row['samples_to_target'] if reached else '':>18} "
            f"{format(row['steps_ratio'], '.3f') if reached else '':>8} "
            f"{format(row['samples_ratio'], '.3f') if reached else '':>10}")
    adaptive = [row for row in summary["rows"] if row["name"] == "AdaptiveK"]
    if adaptive:
        lines.append(f"   goal (>= 30 % fewer optimizer steps at <= 1.10x the samples of fixed K={task.k_min}): "
                     f"AdaptiveK {goal(adaptive[0])}")
    else:
        lines.append("   goal: not evaluated, this ms_accum has no AdaptiveK (issue 52)")
    others = [f"{row['name']} {goal(row).split(':')[-1].strip()}" for row in summary["rows"][1:]
              if row["name"] != "AdaptiveK"]
    lines.append(f"   the same goal for the others: {'; '.join(others)}")
    return "\n".join(lines)


def plot(task: Task, weighted: bool, curves: List[dict], summary: dict, path: str) -> None:
    """A PNG of the held-out loss, K and the noise-scale estimate of every contender against the samples consumed.

    Args:
        task: The task's settings.
        weighted: Whether the losses and the noise scale are token-weighted.
        curves: `run`'s results.
        summary: `summarize`'s result (the target line).
        path: The PNG to write.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(7, 8.5), sharex=True)
    for curve in curves:
        style = {"linewidth": 2.0 if curve["name"].startswith("AdaptiveK") else 1.0}
        scores = curve["scores"]
        axes[0].plot([s["samples"] for s in scores], [s["loss"] for s in scores], label=curve["name"], **style)
        axes[1].step(curve["samples"], curve["k"], where="pre", **style)
        estimates = [(s, n) for s, n in zip(curve["samples"], curve["noise_scale"]) if n is not None]
        if estimates:
            axes[2].plot(*zip(*estimates), **style)
    axes[0].axhline(summary["target"], color="grey", linestyle=":", linewidth=1)
    axes[0].axvline(task.budget, color="grey", linestyle=":", linewidth=1)
    axes[0].set_yscale("log")  # the end of training, where the contenders differ, next to the start
    axes[0].set_ylabel("held-out loss" + (" (nats/token)" if weighted else ""))
    axes[0].legend(fontsize=8)
    axes[1].set_ylabel("K (micro-batches)")
    axes[1].set_yscale("log", base=2)
    axes[2].set_ylabel("noise scale B_simple\n(" + ("tokens" if weighted else "samples") + ")")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("samples consumed")
    axes[0].set_title(f"{task.name}: micro-batch {task.batch}, lr rule {task.lr_rule}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------ entry
def measure(name: str, quick: bool, data_dir: Optional[str], log: Callable[[str], None],
            plot_dir: Optional[str] = None, seed: int = 0) -> dict:
    """Runs every contender of one task and returns its table and figures.

    Args:
        name: "mnist" or "shakespeare".
        quick: The smoke run's settings.
        data_dir: The MNIST_Data directory (None: $MS_ACCUM_MNIST or ../shared/data/MNIST_Data).
        log: Where progress goes.
        plot_dir: Where to write the task's PNG (None: none).
        seed: The initial weights' and the data order's seed.

    Returns:
        dict: "text" (the table), "task", "summary", "curves".
    """
    task = dataclasses.replace(TASKS[name][1 if quick else 0], seed=seed)
    data = mnist_data(task, data_dir) if name == "mnist" else shakespeare_data(task)
    curves = [run(task, data, contender, k, log) for contender, k in contenders(task).items()]
    summary = summarize(task, curves)
    if plot_dir:
        os.makedirs(plot_dir, exist_ok=True)
        suffix = f"-seed{seed}" if seed else ""
        plot(task, data.weighted, curves, summary, os.path.join(plot_dir, f"adaptive-k-{name}{suffix}.png"))
    return {"text": render(task, data, summary), "task": vars(task), "weighted": data.weighted, "summary": summary,
            "curves": curves}


def replot(path: str, plot_dir: str) -> None:
    """The PNGs of a run's `--json` file again, without training (the figures of that run).

    Args:
        path: The JSON file `main` wrote.
        plot_dir: Where to write the PNGs.
    """
    with open(path, encoding="utf-8") as handle:
        results = json.load(handle)
    os.makedirs(plot_dir, exist_ok=True)
    for name, result in results["adaptive"].items():
        task = Task(**{**result["task"], "grid": tuple(result["task"]["grid"])})
        suffix = f"-seed{task.seed}" if task.seed else ""
        plot(task, result.get("weighted", name == "shakespeare"), result["curves"], result["summary"],
             os.path.join(plot_dir, f"adaptive-k-{name}{suffix}.png"))


def main(argv=None) -> int:
    """The command: each task's table (and with --plot its PNG, with --json every curve); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few windows: measures nothing")
    parser.add_argument("--data", help="MNIST_Data directory (default $MS_ACCUM_MNIST or ../shared/data/MNIST_Data)")
    parser.add_argument("--json", metavar="PATH", help="also write every curve and figure to PATH")
    parser.add_argument("--plot", metavar="DIR", help="write a PNG per task to DIR")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order (default 0)")
    parser.add_argument("--replot", metavar="JSON", help="only write the PNGs of a --json file to --plot DIR")
    args = parser.parse_args(argv)
    if args.replot:
        replot(args.replot, args.plot or ".")
        return 0
    tasks = args.task.split(",")
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"unknown tasks {unknown}; choose from {', '.join(TASKS)}")
    print(common.header(), flush=True)
    print(f"mode    : {'quick (a smoke run: no figure is a measurement)' if args.quick else 'full'}; tasks "
          f"{', '.join(tasks)}; seed {args.seed}\n", flush=True)
    common.setup()
    results = {"header": common.header(), "quick": args.quick, "adaptive": {}}
    for name in tasks:
        result = measure(name, args.quick, args.data, common.log, args.plot, args.seed)
        print(result["text"] + "\n", flush=True)
        results["adaptive"][name] = result
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

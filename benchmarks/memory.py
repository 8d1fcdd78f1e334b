"""Memory: the peak of each structure against the documentation's code, one K·B step and a plain step, one fresh
process per figure.

    python -m benchmarks.memory FACTORY CONTENDER K      (one figure: prints {"peak": bytes, "params": bytes})

A figure is the growth of the process's peak resident memory (VmHWM) from just before the step, the Cells or the
executor is built to the end of two windows trained over a MindSpore dataset of the factory's samples (global batch
K·B = 32, the factory's SGD), read as the planner reads its trials (`ms_accum.tools.planner.process_status`). On CPU
MindSpore reports no peak memory of its own, and a fresh process's peak does not depend on the machine's load.

- ``activations``: the activation-heavy networks of `ms_accum.demo.models`, `conv_net` (3x96x96) and
  `char_transformer` (sequences of 256), K in {4, 8, 16}, as multiples of one micro-batch's plain step: accumulation
  is worth its name when a window of K x B costs about one B step, not one K·B step.
- ``parameters``: `wide_mlp`, 192 MiB of parameters, K=4 x B=8, as multiples of the parameters and over the plain
  step: what the buffer and each option that touches every gradient add.
- ``real_size``: real-size, parameter-heavy networks at B=1, K=4: `deep_mlp` (12 x Dense(2048, 2048), 192 MiB) and
  the BERT-shaped `encoder` (written-out layers; 12 x 768 at seq 512 by default, 418 MiB), with SGD, Momentum and
  AdamW: each structure's peak minus the plain step's, in units of the parameters' bytes (the buffer alone is
  1.00x), and what a final `mindspore.save_checkpoint` of the network adds above training's peak.

    python -m benchmarks.memory real FACTORY OPTIMIZER CONTENDER [--layers L] [--seq S]   (one real_size figure)

The ms_accum contenders run through the executor (`GradientAccumulation.train_process`); mindcv's `TrainStep` through
`mindspore.train.Model`, as its trainer runs it; the Accumulator, the documentation's code and the plain steps in the
loop their documentation writes.
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, List, Optional

from .common import MIB, fresh_process

GLOBAL_BATCH, WINDOWS = 32, 2
STRUCTURES = ("three_graphs", "fused", "window")
# option -> the executor's argument, its class in `ms_accum.train.options` and its fields; built by `executor_options`
# in the fresh process (building some of them loads MindSpore)
OPTIONS = {"statistics": ("statistics", "StatisticsOptions", {"norms": True}),
           "clip": ("window", "WindowOptions", {"clip_norm": 1.0}),
           "skip_microbatch": ("guard", "GuardOptions", {"policy": "skip_microbatch"}),
           "outliers": ("statistics", "StatisticsOptions", {"skip_outliers": 6.0})}
# contender -> what it is, as the tables name it
CONTENDERS = {
    "one_b": "plain step on B (nn.TrainOneStepCell)",
    "one_kb": "one K·B step",
    "docs_page": "docs page: @jit_class Accumulator",
    "docs_tutorial": "docs tutorial: 3 Cells",
    "mindcv": "mindcv TrainStep, through Model",
    "accumulator": "ms_accum Accumulator, @ms.jit step",
    "accumulator_weighted": "  ... given num_samples (each gradient weighted)",
    "three_graphs": "ms_accum default ('three_graphs')",
    **{f"three_graphs+{option}": f"  ... {option}" for option in OPTIONS},
    "fused": "ms_accum 'fused'",
    "window": "ms_accum 'window'",
}
ACTIVATION_NETS = ("conv_net", "char_transformer")
ACTIVATION_COLUMNS = ("one_kb", "docs_page", "docs_tutorial", "mindcv", "accumulator", "three_graphs", "fused",
                      "window")
PARAMETER_ROWS = ("one_b", "one_kb", "docs_page", "docs_tutorial", "mindcv", "accumulator", "accumulator_weighted",
                  "three_graphs", *(f"three_graphs+{option}" for option in OPTIONS), "fused", "window")
GOAL = 1.15  # a window's peak: at most this many one-B steps, plus the buffer (1x the parameters)
REAL_FACTORIES = ("deep_mlp", "encoder")
REAL_OPTIMIZERS = ("sgd", "momentum", "adamw")
REAL_CONTENDERS = ("one_b", *STRUCTURES)
REAL_K, REAL_WINDOWS = 4, 2
REAL_GOALS = {"three_graphs": 1.10, "fused": 1.25, "window": 1.25}  # over the plain step, x the parameters (issue 37)


# ------------------------------------------------------------------------------------------- in the fresh process
def executor_options(option: str) -> dict:
    """The executor's keyword arguments for `option` of `OPTIONS` (none for ``""``)."""
    if not option:
        return {}
    from ms_accum.train import options
    argument, kind, fields = OPTIONS[option]
    return {argument: getattr(options, kind)(**fields)}


def measure(factory: str, contender: str, k: int):
    """(peak RSS growth, trainable bytes) of `contender` training two windows of `factory`'s network, here."""
    import mindspore.dataset as ds
    from ms_accum.demo import models
    from ms_accum.tools.planner import process_status
    from ms_accum.train.options import QUIET
    from .common import (accumulator_step, docs_page_step, docs_tutorial, executor, mindcv_model, model_train,
                         one_step_cell, over, setup, sync)
    setup()
    net, loss, opt, sample = getattr(models, factory)()
    micro = GLOBAL_BATCH // k
    x, y = sample(GLOBAL_BATCH * WINDOWS)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(
        GLOBAL_BATCH if contender == "one_kb" else micro, drop_remainder=True)
    start = process_status("VmRSS")
    structure, _, option = contender.partition("+")
    if structure in STRUCTURES:
        executor(net, loss, opt, structure, **executor_options(option)).train_process(1, dataset, k, checkpoints=None,
                                                                                     log=QUIET)
    elif contender == "docs_tutorial":
        sync(docs_tutorial(net, loss, opt).run(dataset.create_tuple_iterator(num_epochs=1), k))
    elif contender == "mindcv":
        model_train(mindcv_model(net, loss, opt, k), dataset)(0)
    else:
        steps = {"one_b": lambda: one_step_cell(net, loss, opt), "one_kb": lambda: one_step_cell(net, loss, opt),
                 "docs_page": lambda: docs_page_step(net, loss, opt, k),
                 "accumulator": lambda: accumulator_step(net, loss, opt, k),
                 "accumulator_weighted": lambda: accumulator_step(net, loss, opt, k, micro)}
        over(dataset, steps[contender]())(0)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in net.trainable_params()))


def measure_real(factory: str, optimizer: str, contender: str, layers: Optional[int] = None,
                 seq: Optional[int] = None):
    """(training's peak RSS growth, the final save's addition above it, trainable bytes) of `contender` training
    two windows of K=4 micro-batches of 1 sample of `factory`'s network with `optimizer`, here."""
    import os
    import tempfile
    import mindspore as ms
    import mindspore.dataset as ds
    from ms_accum.demo import models
    from ms_accum.tools.planner import process_status
    from ms_accum.train.options import QUIET
    from .common import executor, one_step_cell, over, setup
    setup()
    sizes = {name: value for name, value in (("layers", layers), ("seq", seq)) if value is not None}
    net, loss, opt, sample = getattr(models, factory)(optimizer, **sizes)
    x, y = sample(REAL_K * REAL_WINDOWS)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(1, drop_remainder=True)
    start = process_status("VmRSS")
    if contender == "one_b":
        over(dataset, one_step_cell(net, loss, opt))(0)
    else:
        executor(net, loss, opt, contender).train_process(1, dataset, REAL_K, checkpoints=None, log=QUIET)
    train = process_status("VmHWM") - start
    with tempfile.TemporaryDirectory() as folder:  # what the executor's final checkpoint does
        ms.save_checkpoint(net, os.path.join(folder, "final.ckpt"))
    return train, process_status("VmHWM") - start - train, int(sum(p.nbytes for p in net.trainable_params()))


def main(argv=None) -> None:
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["real"]:
        parser = argparse.ArgumentParser(description="one real_size figure")
        parser.add_argument("factory", choices=REAL_FACTORIES)
        parser.add_argument("optimizer", choices=REAL_OPTIMIZERS)
        parser.add_argument("contender", choices=REAL_CONTENDERS)
        parser.add_argument("--layers", type=int)
        parser.add_argument("--seq", type=int)
        args = parser.parse_args(argv[1:])
        peak, save, params = measure_real(args.factory, args.optimizer, args.contender, args.layers, args.seq)
        print(json.dumps({"peak": int(peak), "save": int(save), "params": params}), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("factory", choices=ACTIVATION_NETS + ("wide_mlp",))
    parser.add_argument("contender", choices=list(CONTENDERS))
    parser.add_argument("k", type=int)
    args = parser.parse_args(argv)
    peak, params = measure(args.factory, args.contender, args.k)
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)


# ---------------------------------------------------------------------------------------------------- the tables
def figure(factory: str, contender: str, k: int, repeats: int, log: Optional[Callable[[str], None]] = None) -> dict:
    """The median peak over `repeats` fresh processes, every process's peak, and the trainable bytes."""
    if log:
        log(f"   {factory} {contender} K={k}")
    runs = [fresh_process(["-m", "benchmarks.memory", factory, contender, str(k)]) for _ in range(repeats)]
    peaks = [run["peak"] for run in runs]
    return {"factory": factory, "contender": contender, "k": k, "peak": statistics.median(peaks), "peaks": peaks,
            "params": runs[0]["params"]}


def activations(ks=(4, 8, 16), nets=ACTIVATION_NETS, columns=ACTIVATION_COLUMNS, repeats: int = 3,
                log=None) -> List[dict]:
    """Figures of every (net, K, contender); the K·B step, the same for every K, is measured once per net."""
    rows = []
    for net in nets:
        big = figure(net, "one_kb", ks[0], repeats, log) if "one_kb" in columns else None
        for k in ks:
            rows += [figure(net, "one_b", k, repeats, log)] + ([{**big, "k": k}] if big else [])
            rows += [figure(net, contender, k, repeats, log) for contender in columns if contender != "one_kb"]
    return rows


def render_activations(rows: List[dict]) -> str:
    columns = list(dict.fromkeys(r["contender"] for r in rows if r["contender"] != "one_b"))
    lines = [f"== activations. peak RSS growth over two windows, as a multiple of one B step's (K x B = "
             f"{GLOBAL_BATCH}; median of {len(rows[0]['peaks'])} fresh process(es) per figure)",
             f"   goal for a window: <= {GOAL} x one B step + the buffer (1x the parameters); '!!' marks a figure "
             f"above it",
             "   columns: " + "; ".join(f"{name} = {CONTENDERS[name]}" for name in columns),
             f"   {'network':<18}{'K x B':>7}{'one B MiB':>11}" + "".join(f"{name:>15}" for name in columns)]
    for net, k in dict.fromkeys((r["factory"], r["k"]) for r in rows):
        group = {r["contender"]: r for r in rows if r["factory"] == net and r["k"] == k}
        one_b = group["one_b"]["peak"]
        limit = GOAL * one_b + group["one_b"]["params"]
        marks = {c: "" if c == "one_kb" or group[c]["peak"] <= limit else " !!" for c in columns}
        cells = "".join(f"{group[c]['peak'] / one_b:>12.2f}{marks[c]:<3}" for c in columns)
        lines.append(f"   {net:<18}{f'{k}x{GLOBAL_BATCH // k}':>7}{one_b / MIB:>11.0f}{cells}")
    return "\n".join(lines)


def parameters(contenders=PARAMETER_ROWS, k: int = 4, repeats: int = 3, log=None) -> List[dict]:
    return [figure("wide_mlp", contender, k, repeats, log) for contender in contenders]


def render_parameters(rows: List[dict]) -> str:
    params = rows[0]["params"]
    plain = next(r["peak"] for r in rows if r["contender"] == "one_b")
    width = max(len(CONTENDERS[r["contender"]]) for r in rows) + 2
    lines = [f"== parameters. peak RSS growth over two windows of wide_mlp ({params / MIB:.0f} MiB of parameters, "
             f"K=4 x B=8, SGD; median of {len(rows[0]['peaks'])} fresh process(es) per figure)",
             "   the buffer alone is 1.00x the parameters; the plain step's gradients are transient",
             f"   {'contender':<{width}}{'MiB':>8}{'x params':>10}{'over the plain step':>21}"]
    for row in rows:
        lines.append(f"   {CONTENDERS[row['contender']]:<{width}}{row['peak'] / MIB:>8.0f}{row['peak'] / params:>10.2f}"
                     f"{(row['peak'] - plain) / params:>+21.2f}")
    return "\n".join(lines)


def real_size(networks, optimizers=REAL_OPTIMIZERS, contenders=REAL_CONTENDERS, repeats: int = 3,
              log=None) -> List[dict]:
    """Figures of every (network, optimizer, contender); `networks` holds `(factory, layers, seq)`, None for the
    factory's default."""
    rows = []
    for factory, layers, seq in networks:
        sizes = [flag for name, value in (("--layers", layers), ("--seq", seq)) if value is not None
                 for flag in (name, str(value))]
        for optimizer in optimizers:
            for contender in contenders:
                if log:
                    log(f"   {factory} {' '.join(sizes)} {optimizer} {contender}")
                runs = [fresh_process(["-m", "benchmarks.memory", "real", factory, optimizer, contender, *sizes],
                                      timeout=3600) for _ in range(repeats)]
                rows.append({"factory": factory, "layers": layers, "seq": seq, "optimizer": optimizer,
                             "contender": contender, "peak": statistics.median(r["peak"] for r in runs),
                             "peaks": [r["peak"] for r in runs], "save": statistics.median(r["save"] for r in runs),
                             "params": runs[0]["params"]})
    return rows


def render_real_size(rows: List[dict]) -> str:
    structures = [c for c in REAL_CONTENDERS if c != "one_b" and any(r["contender"] == c for r in rows)]
    lines = [f"== real_size. peak RSS growth over two windows of K={REAL_K} x B=1 above the plain step's, in units of "
             f"the parameters' bytes (the buffer alone: +1.00x; median of {len(rows[0]['peaks'])} fresh process(es))",
             "   goals: " + ", ".join(f"{name} <= +{REAL_GOALS[name]:.2f}x" for name in structures)
             + "; '!!' marks a figure above its goal; save: a final save_checkpoint's addition above training's peak",
             f"   {'network':<22}{'optimizer':>10}{'params MiB':>11}{'plain MiB':>10}"
             + "".join(f"{name:>15}" for name in structures) + f"{'save':>8}"]
    for key in dict.fromkeys((r["factory"], r["layers"], r["seq"], r["optimizer"]) for r in rows):
        group = {r["contender"]: r for r in rows if (r["factory"], r["layers"], r["seq"], r["optimizer"]) == key}
        plain, params = group["one_b"]["peak"], group["one_b"]["params"]
        name = key[0] + "".join(f" {label}{value}" for label, value in (("L", key[1]), ("seq", key[2]))
                                if value is not None)
        cells = ""
        for contender in structures:
            over_plain = (group[contender]["peak"] - plain) / params
            cells += f"{over_plain:>+12.2f}{' !!' if over_plain > REAL_GOALS[contender] else '':<3}"
        saves = [group[c]["save"] for c in structures] or [group["one_b"]["save"]]
        lines.append(f"   {name:<22}{key[3]:>10}{params / MIB:>11.0f}{plain / MIB:>10.0f}{cells}"
                     f"{max(saves) / params:>+7.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

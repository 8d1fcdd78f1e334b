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

The ms_accum contenders run through the executor (`GradientAccumulation.train_process`); the Accumulator, the
documentation's code and the plain steps in the loop their documentation writes.
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, List, Optional

from .common import MIB, fresh_process

GLOBAL_BATCH, WINDOWS = 32, 2
STRUCTURES = ("three_graphs", "fused", "window")
OPTIONS = {"statistics": {"statistics": True}, "clip": {"clip_norm": 1.0},
           "skip_microbatch": {"policy": "skip_microbatch"}, "outliers": {"skip_outliers": 6.0}}
# contender -> what it is, as the tables name it
CONTENDERS = {
    "one_b": "plain step on B (nn.TrainOneStepCell)",
    "one_kb": "one K·B step",
    "docs_page": "docs page: @jit_class Accumulator",
    "docs_tutorial": "docs tutorial: 3 Cells",
    "accumulator": "ms_accum Accumulator, @ms.jit step",
    "accumulator_weighted": "  ... given num_samples (each gradient weighted)",
    "three_graphs": "ms_accum default ('three_graphs')",
    **{f"three_graphs+{option}": f"  ... {option}" for option in OPTIONS},
    "fused": "ms_accum 'fused'",
    "window": "ms_accum 'window'",
}
ACTIVATION_NETS = ("conv_net", "char_transformer")
ACTIVATION_COLUMNS = ("one_kb", "docs_page", "docs_tutorial", "accumulator", "three_graphs", "fused", "window")
PARAMETER_ROWS = ("one_b", "one_kb", "docs_page", "docs_tutorial", "accumulator", "accumulator_weighted",
                  "three_graphs", *(f"three_graphs+{option}" for option in OPTIONS), "fused", "window")
GOAL = 1.15  # a window's peak: at most this many one-B steps, plus the buffer (1x the parameters)


# ------------------------------------------------------------------------------------------- in the fresh process
def measure(factory: str, contender: str, k: int):
    """(peak RSS growth, trainable bytes) of `contender` training two windows of `factory`'s network, here."""
    import mindspore.dataset as ds
    from ms_accum.demo import models
    from ms_accum.tools.planner import process_status
    from .common import (accumulator_step, docs_page_step, docs_tutorial, executor, one_step_cell, over, setup,
                         sync)
    setup()
    net, loss, opt, sample = getattr(models, factory)()
    micro = GLOBAL_BATCH // k
    x, y = sample(GLOBAL_BATCH * WINDOWS)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(
        GLOBAL_BATCH if contender == "one_kb" else micro, drop_remainder=True)
    start = process_status("VmRSS")
    structure, _, option = contender.partition("+")
    if structure in STRUCTURES:
        executor(net, loss, opt, structure, **OPTIONS.get(option, {})).train_process(1, dataset, k, ckpt_dir=None,
                                                                                     verbose=False)
    elif contender == "docs_tutorial":
        sync(docs_tutorial(net, loss, opt).run(dataset.create_tuple_iterator(num_epochs=1), k))
    else:
        steps = {"one_b": lambda: one_step_cell(net, loss, opt), "one_kb": lambda: one_step_cell(net, loss, opt),
                 "docs_page": lambda: docs_page_step(net, loss, opt, k),
                 "accumulator": lambda: accumulator_step(net, loss, opt, k),
                 "accumulator_weighted": lambda: accumulator_step(net, loss, opt, k, micro)}
        over(dataset, steps[contender]())(0)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in net.trainable_params()))


def main(argv=None) -> None:
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


if __name__ == "__main__":
    main()

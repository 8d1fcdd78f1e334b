"""The peer: mindcv's accumulation, `TrainStep(..., gradient_accumulation_steps=K)` through `mindspore.train.Model`
as mindcv's `create_trainer` runs it, against ms_accum's structures, plain steps of B and one K·B step.

    python -m benchmarks.peer NETWORK CONTENDER      (one memory figure: prints {"peak": bytes, "params": bytes})

Networks the other sections do not time (the conv net's speed is `conv_net`'s, its memory `activations'`):

- ``mlp``: parameter-heavy, `deep_mlp` at 8 x Dense(1024, 1024) (32 MiB of parameters), Momentum(0.01, 0.9), B=32;
- ``recipe``: the fine-tuning recipe's model at its defaults (`tutorials/finetune_bert.py`: the BERT-shaped
  `BertClassifier`, 2 layers of width 128 at sequence 128, dropout 0.1, AdamW on its warm-up-then-decay schedule),
  B=16, on its Tiny Shakespeare sentence pairs, without its clipping (mindcv would clip each micro-batch).

Speed: interleaved rounds in one process, each contender over a dataset of its micro-batches (the K·B step: of K·B),
ms per window. Memory: one fresh process per figure, the growth of the peak resident memory (VmHWM) from just before
the contender is built over two windows. Exactness, on these and on `conv_net` (B=8): every contender trains three
windows from the same weights on the same samples (the recipe with dropout off), and its largest weight difference
to the K·B step's, compared by position (mindcv renames the parameters); the clipped contenders, mindcv's
``clip_grad=True`` (each micro-batch's gradient clipped) and ms_accum's ``clip_norm`` (the window's), against a K·B
step clipped alike (mindcv's `TrainStep` without accumulation).
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, Dict, List, Optional

from .common import (K, MIB, Table, build, executor, fresh_process, interleave, log, mindcv_model, model_train,
                     one_step_cell, over, recipe_module, setup)

NETWORKS = {"mlp": 32, "recipe": 16, "conv_net": 8}  # name -> micro-batch B; conv_net only for the exactness
SPEED_NETWORKS = ("mlp", "recipe")
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
    return build("deep_mlp", layers=8, width=1024) if name == "mlp" else build(name)


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
def speed(name: str, windows: int, rounds: int, warmup: int = 1) -> Table:
    """`name` over a dataset of `windows` windows a round, ms per window."""
    micro = NETWORKS[name]
    contenders = {}
    for contender, title in CONTENDERS.items():
        network, loss, optimizer, sample = parts(name)
        contenders[title] = runner(contender, network, loss, optimizer, sample(windows * K * micro), micro)
    log(f"   {len(contenders)} contenders built; {warmup} warm-up round(s), then {rounds} timed")
    table = Table(f"peer {name}", f"{name} over a dataset of its samples, {windows} windows of K={K} x B={micro} a "
                  "round (ms_accum through GradientAccumulation.train_process, mindcv through Model.train)",
                  f"window of {K * micro} samples", CONTENDERS["one_kb"])
    table.rows = interleave(contenders, rounds, windows, warmup)
    structures = [CONTENDERS[s] for s in ("three_graphs", "fused", "window")]
    table.note_goal([(s, CONTENDERS[to]) for to in ("mindcv", "one_b") for s in structures], 1.00)
    return table


# ----------------------------------------------------------------------------------------------------------- memory
def measure(name: str, contender: str):
    """(peak RSS growth, trainable bytes) of `contender` training two windows of `name`, here."""
    from ms_accum.tools.planner import process_status
    setup()
    network, loss, optimizer, sample = parts(name)
    columns = sample(2 * K * NETWORKS[name])
    start = process_status("VmRSS")
    runner(contender, network, loss, optimizer, columns, NETWORKS[name])(0)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in network.trainable_params()))


def memory(names=SPEED_NETWORKS, contenders=tuple(CONTENDERS), repeats: int = 3, log=None) -> List[dict]:
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
    parser = argparse.ArgumentParser(description="one peer memory figure")
    parser.add_argument("network", choices=SPEED_NETWORKS)
    parser.add_argument("contender", choices=list(CONTENDERS))
    args = parser.parse_args(argv)
    peak, params = measure(args.network, args.contender)
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)


if __name__ == "__main__":
    main()

"""Dropout: ms_accum's seeded streams (`ms_accum.core.dropout`) against MindSpore's own kernel, in memory and time.

- memory: a BERT-shaped encoder (`ms_accum.demo.models.encoder`, width 768, dropout 0.1 on the embeddings, every
  attention probability and every block's output, AdamW, micro-batch 1), one fresh process per figure
  (`tests/memory_scripts/dropout.py`): a plain training step with dropout off, with MindSpore's kernel and with the
  streams, and the executor's structures (K=4) above the plain step in units of the parameters. Bytes per dropped
  value: (peak - peak with dropout off) / the values dropped in one step.
- memory, the fine-tuning recipe's model (`tutorials/finetune_bert.py --measure-one`): a plain step of B with
  MindSpore's dropout and with the streams, and the executor's K x B.
- time: plain `nn.TrainOneStepCell` steps in training mode, the same network built twice from one seed, one copy
  drawing from the streams, timed in interleaved rounds.
"""
from __future__ import annotations

import os
import statistics
from typing import Callable, List, Optional

from .common import MIB, Table, fresh_process, interleave, recipe_module, setup

SCRIPT = os.path.join("tests", "memory_scripts", "dropout.py")
RECIPE = os.path.join("tutorials", "finetune_bert.py")
STRUCTURES = ("three_graphs", "fused", "window")
TIME_GOAL = 1.05


def dropped_values(layers: int, seq: int, width: int = 768) -> int:
    """Values the encoder drops in one sample's forward: the embeddings, each layer's attention probabilities (heads
    x seq x seq) and its two block outputs."""
    heads = max(1, width // 64)
    return seq * width + layers * (heads * seq * seq + 2 * seq * width)


def memory(layers: int, seq: int, repeats: int, log: Optional[Callable[[str], None]] = None) -> dict:
    """Median peaks (bytes) over `repeats` fresh processes of each encoder configuration, and the recipe's."""
    def figure(*args: str) -> dict:
        if log:
            log(f"   dropout memory: {' '.join(args)}")
        runs = [fresh_process([SCRIPT, *args, str(layers), str(seq)], env={"GLOG_v": "3"}) for _ in range(repeats)]
        return {"peak": statistics.median(r["peak"] for r in runs), "params": runs[0]["params"],
                "peaks": [r["peak"] for r in runs]}

    encoder = {f"plain_{kind}": figure("plain", kind) for kind in ("none", "kernel", "seeded")}
    encoder.update({structure: figure(structure, "seeded") for structure in STRUCTURES})
    recipe = {}
    for mode in ("micro_step", "micro_step_seeded", "accumulated"):
        if log:
            log(f"   dropout memory: recipe {mode}")
        runs = [fresh_process([RECIPE, "--measure-one", mode], env={"GLOG_v": "3"}) for _ in range(repeats)]
        recipe[mode] = statistics.median(r["peak_mib"] for r in runs)
    return {"layers": layers, "seq": seq, "values": dropped_values(layers, seq), "encoder": encoder,
            "recipe_mib": recipe}


def render_memory(figures: dict) -> str:
    encoder, values = figures["encoder"], figures["values"]
    params = encoder["plain_seeded"]["params"]
    none = encoder["plain_none"]["peak"]
    lines = [f"== dropout memory. BERT-shaped encoder, {figures['layers']} x 768, sequence {figures['seq']}, dropout "
             f"0.1, AdamW, B=1 ({params / MIB:.0f} MiB of parameters, {values / 1e6:.1f} million values dropped "
             f"per step); peak RSS growth, median of {len(encoder['plain_none']['peaks'])} fresh process(es)",
             f"   {'contender':<44}{'MiB':>8}{'bytes / dropped value':>24}{'above plain seeded':>20}"]
    for name, what in (("plain_none", "plain step, dropout off"), ("plain_kernel", "plain step, MindSpore's kernel"),
                       ("plain_seeded", "plain step, ms_accum's streams")):
        peak = encoder[name]["peak"]
        lines.append(f"   {what:<44}{peak / MIB:>8.0f}{(peak - none) / values:>24.2f}")
    for structure in STRUCTURES:
        peak = encoder[structure]["peak"]
        above = (peak - encoder["plain_seeded"]["peak"]) / params
        lines.append(f"   {f'executor {structure!r}, K=4':<44}{peak / MIB:>8.0f}{'':>24}{above:>+19.2f}x")
    seeded, kernel = encoder["plain_seeded"]["peak"], encoder["plain_kernel"]["peak"]
    worst = max((encoder[s]["peak"] - seeded) / params for s in STRUCTURES)
    lines.append(f"   goals: streams <= kernel {'met' if seeded <= kernel else 'NOT met'} "
                 f"({(seeded - kernel) / MIB:+.0f} MiB); executor <= plain + 1.10x the parameters "
                 f"{'met' if worst <= 1.10 else 'NOT met'} (worst {worst:+.2f}x)")
    recipe = figures["recipe_mib"]
    lines.append(f"   fine-tuning recipe (tutorials/finetune_bert.py defaults), ru_maxrss MiB: plain step of B with "
                 f"MindSpore's dropout {recipe['micro_step']:.0f}, with the streams {recipe['micro_step_seeded']:.0f}, "
                 f"the executor's K x B {recipe['accumulated']:.0f}")
    return "\n".join(lines)


def speed(layers: int, seq: int, rounds: int, steps: int, warmup: int = 1) -> List[Table]:
    """ms per plain training step, MindSpore's kernel against the streams: the encoder and the recipe's model."""
    import mindspore as ms
    from mindspore import Tensor, nn
    from ms_accum.core.dropout import DropoutStreams
    from ms_accum.demo import models
    from .common import sync
    setup()

    def encoder():
        ms.set_seed(0)
        net, loss, opt, sample = models.encoder("adamw", layers=layers, seq=seq)
        x, y = sample(1)
        return net, nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train(), (Tensor(x), Tensor(y))

    def recipe():
        module = recipe_module()
        _, args = module.parse([])
        vocab, columns, _ = module.prepare(args)
        net, loss, opt = module.build(args, vocab, total_steps=100)
        step = nn.TrainOneStepCell(module.WithLossColumns(net, loss), opt).set_train()
        return net, step, tuple(Tensor(c[:args.micro_batch]) for c in columns)

    tables = []
    for key, title, build in (("dropout_encoder", f"plain training step, BERT-shaped encoder {layers} x 768, sequence "
                                                  f"{seq}, B=1, AdamW, dropout 0.1", encoder),
                              ("dropout_recipe", "plain training step, the fine-tuning recipe's model "
                                                 "(tutorials/finetune_bert.py defaults)", recipe)):
        _, kernel_step, inputs = build()
        seeded_net, seeded_step, _ = build()
        streams = DropoutStreams(seeded_net)

        def kernel(n: int) -> None:
            for _ in range(n):
                sync(kernel_step(*inputs))

        def seeded(n: int) -> None:
            with streams.drawing():
                for _ in range(n):
                    sync(seeded_step(*inputs))

        table = Table(key, title, "step")
        table.rows = interleave({"MindSpore's dropout kernel": kernel, "ms_accum's streams": seeded}, rounds, steps,
                                warmup)
        table.note_goal([("ms_accum's streams", "MindSpore's dropout kernel")], TIME_GOAL)
        tables.append(table)
    return tables

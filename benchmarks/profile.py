"""Where a micro-step's time goes: MindSpore's profiler (op types), ONEDNN_VERBOSE=1 (oneDNN primitives and
their implementations), and torch.profiler for the same LeNet5 step. Each trace runs in its own worker process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict

from .common import REPO, version

WARMUP = 32  # micro-batches worker.py runs before the profiled ones
CATEGORIES = [  # (category, regex over MindSpore op types, regex over torch op names)
    ("max pooling (fwd + grad)", r"MaxPool", r"max_pool"),
    ("convolution (fwd + grads)", r"Conv2D", r"conv|_slow_conv"),
    ("dense (MatMul, bias)", r"MatMul|BiasAdd", r"addmm|aten::mm|aten::t$|linear"),
    ("relu (fwd + grad)", r"Relu|ReLU", r"relu|threshold"),
]


def _worker(contender: str, n: int, trace: str = "none", onednn: bool = False):
    env = {**os.environ, **({"ONEDNN_VERBOSE": "1"} if onednn else {})}
    out = subprocess.run([sys.executable, "-m", "benchmarks.worker", contender, "--profile", str(n), "--trace", trace],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    wall = next(float(line.split()[1]) for line in out if line.startswith("WALL "))
    ops = {line[3:].rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in out if line.startswith("OP ")}
    exec_lines = [line for line in out if line.startswith("onednn_verbose") and ",exec," in line]
    return wall, ops, exec_lines


def _onednn(lines, n: int):
    """ms per micro-batch by (primitive, implementation, propagation, shape) over the last n micro-batches."""
    per_micro = len(lines) / (WARMUP + n)
    lines = lines[-int(round(per_micro * n)):] if lines else []
    total = defaultdict(float)
    for line in lines:
        fields = line.split(",")
        total[(fields[5], fields[6], fields[7], fields[-2])] += float(fields[-1]) / n
    return sorted(total.items(), key=lambda item: -item[1])


def _categorize(ops: dict, column: int):
    sums = defaultdict(float)
    for op, value in ops.items():
        name = next((c[0] for c in CATEGORIES if re.search(c[column], op)), "other")
        sums[name] += value
    return sums


def breakdown(n: int, quick: bool = False) -> str:
    wall, ms_ops, _ = _worker("ms_cell", n, trace="mindspore")
    jit_wall, jit_ops, _ = (None, {}, None) if quick else _worker("ms_jit", n, trace="mindspore")
    dnn_wall, _, dnn_lines = _worker("ms_cell", n, onednn=True)
    have_torch = version("torch") != "absent"
    torch_wall, torch_ops = (_worker("torch", n, trace="torch")[:2] if have_torch else (None, {}))

    lines = [f"== profile. where a LeNet5 b32 micro-step's time goes ({n} micro-batches, K=4, after warm-up)"]
    for title, ops, wall_ms in (("TrainAccumulationCell", ms_ops, wall), ("Accumulator + @ms.jit", jit_ops, jit_wall)):
        if not ops:
            continue
        total = sum(ops.values())
        lines.append(f"   MindSpore profiler, {title}: wall {wall_ms:.2f} ms/micro-batch (unprofiled run), "
                     f"op time {total:.2f} ms")
        for op, value in sorted(ops.items(), key=lambda item: -item[1])[:8]:
            lines.append(f"      {op:<36}{value:>8.3f} ms  {value / total:>5.1%}")
    dnn_total = 0.0
    lines.append(f"   oneDNN primitives (ONEDNN_VERBOSE=1, TrainAccumulationCell; wall {dnn_wall:.2f} ms with "
                 "verbose):")
    for (prim, impl, prop, shape), value in _onednn(dnn_lines, n):
        dnn_total += value
        lines.append(f"      {prim:<12}{impl:<16}{prop:<17}{shape:<48}{value:>7.3f} ms")
    lines.append(f"      {'total oneDNN':<93}{dnn_total:>7.3f} ms")
    if have_torch:
        total = sum(torch_ops.values())
        lines.append(f"   torch.profiler, same step in PyTorch: wall {torch_wall:.2f} ms/micro-batch, "
                     f"self CPU {total:.2f} ms")
        for op, value in sorted(torch_ops.items(), key=lambda item: -item[1])[:8]:
            lines.append(f"      {op:<44}{value:>8.3f} ms  {value / total:>5.1%}")
    ms_cat, torch_cat = _categorize(ms_ops, 1), _categorize(torch_ops, 2)
    lines.append(f"   by category, ms per micro-batch:  {'MindSpore (Cell)':>18}{'torch':>10}")
    for name in [c[0] for c in CATEGORIES] + ["other"]:
        torch_value = f"{torch_cat[name]:>10.3f}" if have_torch else f"{'-':>10}"
        lines.append(f"      {name:<30}{ms_cat[name]:>18.3f}{torch_value}")
    return "\n".join(lines)

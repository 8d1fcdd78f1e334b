"""Shared pieces of the benchmarks: the machine header, interleaved timing, tables, data and the LeNet5 setup.

Importing this module loads neither MindSpore nor torch; the functions that need MindSpore import it when
called, after `run_all.py` has set the process up (oneDNN's ISA must be chosen before MindSpore loads).
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 32          # the tutorial's micro-batch
K = 4               # the tutorial's mini_steps
LR, MOMENTUM = 0.01, 0.9


# ----------------------------------------------------------------------------------------------- header
def cpu_info() -> Dict[str, str]:
    model, flags = platform.processor() or "?", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return {"model": model, "cores": str(len(os.sched_getaffinity(0))), "isa": " ".join(isa) or "none"}


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def source_revision() -> str:
    """ms_accum's git revision (+dirty when the working tree differs), and whether it is this checkout's."""
    import subprocess
    import ms_accum
    where = os.path.dirname(os.path.dirname(os.path.abspath(ms_accum.__file__)))
    try:
        rev = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "ms_accum"], capture_output=True,
                               text=True, check=True).stdout.strip()
        rev += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        rev = "not a git checkout"
    # No absolute path: reports are kept in the repository.
    return f"{'this checkout' if os.path.samefile(where, REPO) else 'another checkout'} ({rev})"


def header() -> str:
    cpu = cpu_info()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join([
        f"machine : {cpu['model']}, {cpu['cores']} cores, ISA flags: {cpu['isa']}",
        f"python  : {platform.python_version()}   mindspore {version('mindspore')}   numpy {version('numpy')}"
        f"   torch {version('torch')}",
        f"ms_accum: {source_revision()}",
        f"env     : ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}   "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}   load average {load} (1/5/15 min)",
    ])


# ----------------------------------------------------------------------------------------------- memory
def peak_in_fresh_process(module: str, *args: str) -> Dict[str, int]:
    """Run `python -m benchmarks.<module> ARGS`, which prints ``PEAK <bytes> PARAMS <bytes>``, and read both."""
    import subprocess
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO, env=os.environ,
                         capture_output=True, text=True, check=True).stdout.split()
    return {"peak": int(out[out.index("PEAK") + 1]), "params": int(out[out.index("PARAMS") + 1])}


# ----------------------------------------------------------------------------------------------- timing
def interleave(contenders: Dict[str, Callable[[int], None]], rounds: int, calls: int,
               warmup: int = 1) -> Dict[str, List[float]]:
    """Time each contender `rounds` times, `calls` units per round, alternating between them.

    Each contender is `fn(n)`: run n units and return when they are done (synchronized). Warm-up rounds are
    run first and discarded. The order rotates every round, so no contender always follows the same one.
    Returns ms per unit, one sample per round.
    """
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name](calls)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            contenders[name](calls)
            samples[name].append((time.perf_counter() - start) * 1e3 / calls)
    return samples


def quantiles(values: List[float]):
    values = sorted(values)
    if len(values) < 4:
        return statistics.median(values), values[0], values[-1]
    q = statistics.quantiles(values, n=4)
    return q[1], q[0], q[2]


# ----------------------------------------------------------------------------------------------- tables
@dataclass
class Table:
    """One benchmark's result: rows of ms per unit, each with its ratio to the baseline row."""

    key: str
    title: str
    unit: str                       # what one timed unit is, e.g. "micro-batch of 32"
    images_per_unit: int
    baseline: str
    target: Optional[str] = None    # e.g. "<= 1.02"
    target_rows: List[str] = field(default_factory=list)
    rows: Dict[str, List[float]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    def stats(self):
        base = quantiles(self.rows[self.baseline])[0]
        out = []
        for name, values in self.rows.items():
            med, lo, hi = quantiles(values)
            out.append({"name": name, "median_ms": med, "p25_ms": lo, "p75_ms": hi,
                        "images_per_s": self.images_per_unit / med * 1e3, "ratio": med / base,
                        "target": self.target if name in self.target_rows else None,
                        "met": _met(med / base, self.target) if name in self.target_rows else None,
                        "rounds": len(values)})
        return out

    def render(self) -> str:
        width = max(len(name) for name in self.rows) + 2
        lines = [f"== {self.key}. {self.title}",
                 f"   unit: {self.unit}; median over {len(next(iter(self.rows.values())))} interleaved rounds; "
                 f"ratio = median / median of '{self.baseline}'",
                 f"   {'contender':<{width}}{'median ms':>10}{'p25-p75 ms':>16}{'images/s':>10}{'ratio':>8}  target"]
        for row in self.stats():
            mark = ""
            if row["target"]:
                mark = f"{row['target']} {'MET' if row['met'] else 'NOT MET'}"
            base = " (baseline)" if row["name"] == self.baseline else ""
            lines.append(f"   {row['name']:<{width}}{row['median_ms']:>10.3f}"
                         f"{row['p25_ms']:>8.3f}-{row['p75_ms']:<7.3f}{row['images_per_s']:>10.0f}"
                         f"{row['ratio']:>8.3f}  {mark}{base}")
        lines += [f"   note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"key": self.key, "title": self.title, "unit": self.unit, "baseline": self.baseline,
                "target": self.target, "rows": self.stats(), "notes": self.notes,
                "samples_ms": self.rows}


def note_per_round_ratios(table: Table) -> None:
    """Adds to `table`'s notes each row's median of per-round ratios to its baseline (rounds are interleaved, so a
    round's ratio cancels what moved both)."""
    base = np.asarray(table.rows[table.baseline])
    table.notes.append("median of per-round ratios: " + "; ".join(
        f"{name}: {np.median(np.asarray(values) / base):.3f}" for name, values in table.rows.items()
        if name != table.baseline))


def _met(ratio: float, target: Optional[str]) -> Optional[bool]:
    if not target:
        return None
    op, value = target.split()
    return ratio <= float(value) if op == "<=" else ratio >= float(value)


# ----------------------------------------------------------------------------------------------- data
def mnist_dir(path: Optional[str] = None) -> Optional[str]:
    """Real MNIST: --data, else $MS_ACCUM_MNIST, else ../shared/data/MNIST_Data beside the checkout."""
    candidates = [path, os.environ.get("MS_ACCUM_MNIST"), os.path.join(REPO, "..", "shared", "data", "MNIST_Data")]
    for candidate in candidates:
        if candidate and os.path.isdir(os.path.join(candidate, "train")):
            return os.path.abspath(candidate)
    return None


def micro_batches(count: int, data_dir: Optional[str], batch: int = BATCH):
    """`count` (images, labels) numpy batches of LeNet5 input: real MNIST through create_dataset, else random."""
    if data_dir is not None:
        from ms_accum.demo.data import create_dataset
        dataset = create_dataset(data_dir, batch, num_samples=count * batch, seed=0)
        batches = [(x, y) for x, y in dataset.create_tuple_iterator(output_numpy=True)]
        if len(batches) == count:
            return batches
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((batch, 1, 32, 32), dtype=np.float32), rng.integers(0, 10, batch).astype(np.int32))
            for _ in range(count)]


# ----------------------------------------------------------------------------------------------- MindSpore
def setup_mindspore() -> None:
    """CPU, graph mode. oneDNN's ISA cap (AVX-512 machines only) must already be set: see run_all.py."""
    import mindspore as ms
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)


_instances = [0]


def lenet(seed: int = 0):
    """(network, loss, Momentum optimizer): the tutorial's LeNet5 setup; the same seed gives the same weights.

    Every copy's parameters get a unique name prefix: `@ms.jit` functions of one process reject two Parameters
    of the same name ("its name 'conv1.weight' already exists").
    """
    import mindspore as ms
    from mindspore import nn
    from ms_accum.demo.models import LeNet5
    ms.set_seed(seed)
    net = LeNet5()
    _instances[0] += 1
    for param in net.trainable_params():
        param.name = f"net{_instances[0]}.{param.name}"
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, loss, nn.Momentum(net.trainable_params(), LR, MOMENTUM)


def tensors(batches):
    from mindspore import Tensor
    return [(Tensor(x), Tensor(y)) for x, y in batches]


def window_tensors(batches, k: int = K):
    """numpy (images, labels) micro-batches -> TrainWindowCell's inputs: (K, B, ...) Tensors, one pair per window."""
    from mindspore import Tensor
    return [(Tensor(np.stack([x for x, _ in batches[i:i + k]])), Tensor(np.stack([y for _, y in batches[i:i + k]])))
            for i in range(0, len(batches) - k + 1, k)]


def epochs(model, dataset):
    """fn(n) for `interleave`: one epoch of the executor `model` over `dataset` (K micro-batches a window, no
    checkpoints), whatever n (the dataset fixes the micro-batches)."""
    return lambda _n: model.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False)


def cycle_calls(fn, inputs):
    """fn(n): call `fn(*inputs[i % len])` n times, then wait for the last result."""
    def run(n: int) -> None:
        out = None
        for i in range(n):
            out = fn(*inputs[i % len(inputs)])
        sync(out)
    return run


def sync(out) -> None:
    """Wait for an asynchronous MindSpore result (reading one value forces the queue to drain)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "asnumpy"):
        out.asnumpy()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

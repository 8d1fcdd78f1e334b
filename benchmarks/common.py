"""What the benchmark's sections share: the header (machine and date), contenders timed side by side, tables, data,
and the training steps every section builds.

Importing this module loads no MindSpore: the functions that need it import it when called, after `benchmarks`
(its `__init__`) has let ms_accum choose oneDNN's CPU ISA, which MindSpore reads only when it loads.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K = 4                 # micro-batches per window, the tutorial's mini_steps
MIB = 2 ** 20


# ------------------------------------------------------------------------------------------------------------ header
def cpu() -> str:
    """The CPU's model name, family and model numbers, cores this process may use and the ISA flags that matter."""
    fields, flags = {}, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "flags":
                    flags = set(value.split())
                elif key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value
    except OSError:
        pass
    isa = " ".join(flag for flag in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if flag in flags)
    return (f"{fields.get('model name', platform.processor() or '?')} (family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')}), {len(os.sched_getaffinity(0))} cores, ISA flags: {isa or 'none'}")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _ms_accum_version() -> str:
    import ms_accum  # imports no MindSpore
    return ms_accum.__version__


def _revision() -> str:
    """This checkout's git revision, +dirty when ms_accum/ differs from it."""
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "ms_accum"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"


def header() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join([
        f"date    : {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"cpu     : {cpu()}",
        f"software: python {platform.python_version()}, mindspore {_version('mindspore')}, numpy "
        f"{_version('numpy')}, ms_accum {_ms_accum_version()} ({_revision()})",
        f"env     : ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, load average {load} (1/5/15 min)",
    ])


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------ timing
def interleave(contenders: Dict[str, Callable[[int], None]], rounds: int, units: int,
               warmup: int = 1) -> Dict[str, List[float]]:
    """Times each contender `rounds` times, `units` units per round, alternating between them.

    A contender is ``fn(n)``: run n units and return when they are done (synchronized). The warm-up rounds (graph
    compilation, first allocations) are run first and discarded; the order rotates every round, so no contender
    always follows the same one. Returns ms per unit, one sample per round.
    """
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name](units)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            contenders[name](units)
            samples[name].append((time.perf_counter() - start) * 1e3 / units)
    return samples


def short(name: str) -> str:
    """A contender's name up to its first colon, comma or parenthesis: "docs page", "ms_accum default"."""
    for mark in (":", ",", " ("):
        name = name.split(mark)[0]
    return name


def _quartiles(values: List[float]) -> Tuple[float, float, float]:
    values = sorted(values)
    if len(values) < 4:
        return statistics.median(values), values[0], values[-1]
    q = statistics.quantiles(values, n=4)
    return q[1], q[0], q[2]


@dataclass
class Table:
    """One timed table: each contender's ms per unit over interleaved rounds, and its ratios to the first row and to
    the `reference` row: the ratio of the medians, and in parentheses the median of the per-round ratios (a round's
    ratio cancels what slowed both contenders in that round)."""

    key: str
    title: str
    unit: str
    reference: Optional[str] = None
    rows: Dict[str, List[float]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    @property
    def baseline(self) -> str:
        return next(iter(self.rows))

    def ratio(self, name: str, to: Optional[str] = None) -> Tuple[float, float]:
        """(ratio of medians, median of per-round ratios) of row `name` to row `to` (the baseline)."""
        mine, theirs = np.asarray(self.rows[name]), np.asarray(self.rows[to or self.baseline])
        return float(np.median(mine) / np.median(theirs)), float(np.median(mine / theirs))

    def note_goal(self, pairs, goal: float) -> None:
        """One note: each (name, to) pair's ratio against `goal`, the most a ratio may be."""
        figures = []
        for name, to in pairs:
            medians, per_round = self.ratio(name, to)
            figures.append(f"{short(name)} / {short(to)} {medians:.3f} ({per_round:.3f}) "
                           f"{'met' if medians <= goal else 'NOT met'}")
        self.notes.append(f"goal <= {goal:.2f}: " + "; ".join(figures))

    def render(self) -> str:
        width = max(len(name) for name in self.rows) + 2
        rounds = len(next(iter(self.rows.values())))
        against = [self.baseline] + ([self.reference] if self.reference else [])
        lines = [f"== {self.key}. {self.title}",
                 f"   ms per {self.unit}, {rounds} interleaved round(s); x: the ratio of the medians to that row's "
                 f"(median of per-round ratios)",
                 f"   {'contender':<{width}}{'median':>10}{'p25-p75':>20}" +
                 "".join(f"{'x ' + short(name):>22}" for name in against)]
        for name, values in self.rows.items():
            median, low, high = _quartiles(values)
            ratios = "".join(f"{self.ratio(name, to)[0]:>12.3f}{f'({self.ratio(name, to)[1]:.3f})':>10}"
                             for to in against)
            digits = 2 if median < 100 else 1 if median < 1000 else 0
            lines.append(f"   {name:<{width}}{median:>10.{digits}f}{f'{low:.{digits}f}-{high:.{digits}f}':>20}{ratios}")
        lines += [textwrap.fill(note, 117, initial_indent="   ", subsequent_indent="     ") for note in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"key": self.key, "title": self.title, "unit": self.unit, "reference": self.reference,
                "samples_ms": self.rows, "notes": self.notes}


# ------------------------------------------------------------------------------------------------------------- data
def mnist_dir(path: Optional[str] = None) -> Optional[str]:
    """Real MNIST: `path`, else $MS_ACCUM_MNIST, else ../shared/data/MNIST_Data beside the checkout."""
    for candidate in (path, os.environ.get("MS_ACCUM_MNIST"), os.path.join(REPO, "..", "shared", "data",
                                                                             "MNIST_Data")):
        if candidate and os.path.isdir(os.path.join(candidate, "train")):
            return os.path.abspath(candidate)
    return None


def fresh_process(args: List[str], env: Optional[dict] = None, timeout: float = 900) -> dict:
    """Runs ``python ARGS`` from the repository's root and returns the JSON object its last output line holds."""
    done = subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


# -------------------------------------------------------------------------------------------------------- MindSpore
def setup() -> None:
    """CPU, graph mode (oneDNN's ISA is already chosen: `benchmarks/__init__.py`)."""
    from ms_accum import set_device
    set_device("CPU")


_copies = [0]


def build(factory: str, seed: int = 0, **sizes):
    """(network, loss, Momentum(0.01, 0.9), sample) of a demo factory (`ms_accum.demo.models`, given `sizes`): the
    same seed gives the same weights. Each copy's parameters get a name prefix of their own, because two `@ms.jit`
    functions of one process reject Parameters of the same name; so the optimizer is built after the renaming."""
    import mindspore as ms
    from mindspore import nn
    from ms_accum.demo import models
    ms.set_seed(seed)
    network, loss, _, sample = getattr(models, factory)(**sizes)
    _copies[0] += 1
    for param in network.trainable_params():
        param.name = f"copy{_copies[0]}.{param.name}"
    return network, loss, nn.Momentum(network.trainable_params(), 0.01, 0.9), sample


def weighted(loss) -> bool:
    """Whether `loss` returns ``(loss, weight)``, for ``reduction="weighted_mean"`` (`TokenCrossEntropy`)."""
    from ms_accum import TokenCrossEntropy
    return isinstance(loss, TokenCrossEntropy)


def plain_loss(loss):
    """The loss alone, for the steps that take no weight: plain steps, the documentation's code, the Accumulator."""
    from ms_accum.core import LossOnly
    return LossOnly(loss) if weighted(loss) else loss


def one_step_cell(network, loss, optimizer):
    from mindspore import nn
    from ms_accum.core import WithLossColumns
    return nn.TrainOneStepCell(WithLossColumns(network, plain_loss(loss)), optimizer).set_train()


def mindcv_model(network, loss, optimizer, k: int = K, clip: Optional[float] = None):
    """mindcv's accumulation as its `create_trainer` builds it (`mindcv/utils/trainer_factory.py`): its `TrainStep`
    with ``gradient_accumulation_steps=k`` handed to `mindspore.train.Model`, trained by ``model.train`` over a
    dataset of micro-batches (`model_train`). `clip`: ``clip_grad=True, clip_value=clip``, which clips each
    micro-batch's gradient before accumulating it. ``scale_sense`` is a Tensor, as `create_trainer` passes it (the
    default, a float, is refused by MindSpore 2.10). It renames the network's parameters: compare them by position."""
    import mindspore as ms
    from mindcv.utils.train_step import TrainStep
    from mindspore.train import Model
    from ms_accum.core import WithLossColumns
    step = TrainStep(WithLossColumns(network, plain_loss(loss)), optimizer, scale_sense=ms.Tensor(1.0, ms.float32),
                     clip_grad=clip is not None, clip_value=clip or 15.0, gradient_accumulation_steps=k)
    return Model(step.set_train())


def recipe_module():
    """The fine-tuning recipe, `tutorials/finetune_bert.py`, imported by name: graph mode parses a Cell's construct
    in the namespace of its module, found by name."""
    import importlib
    sys.path.insert(0, os.path.join(REPO, "tutorials"))
    return importlib.import_module("finetune_bert")


def accumulator_step(network, loss, optimizer, k: int = K, num_samples: Optional[int] = None):
    """ms_accum's Accumulator as MindSpore's page uses its own: `value_and_grad` and an `@ms.jit` train step (each
    micro-batch weighted by `num_samples` when given)."""
    import mindspore as ms
    from mindspore import ops
    from ms_accum import Accumulator
    loss = plain_loss(loss)
    accumulator = Accumulator(optimizer, k)

    def forward_fn(x, y):
        return loss(network(x), y)

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    @ms.jit
    def train_step(x, y):
        value, grads = grad_fn(x, y)
        return ops.depend(value, accumulator(grads, num_samples))

    return train_step


def docs_page_step(network, loss, optimizer, k: int = K):
    """The documentation page's `@ms.jit` train step around its `@jit_class` Accumulator (`doc_impls.py`)."""
    from . import doc_impls
    return doc_impls.accumulator_page_train_step(network, plain_loss(loss), optimizer, k)[0]


def docs_tutorial(network, loss, optimizer):
    """The Cell-graph tutorial's three Cells; its loop is the object's ``run(batches, k)`` (`doc_impls.py`)."""
    from . import doc_impls
    return doc_impls.DocGradientAccumulation(network, plain_loss(loss), optimizer)


def executor(network, loss, optimizer, structure: str = "auto", **options):
    """`GradientAccumulation` with the reduction `loss` needs; `options` are its `guard` and `statistics` objects."""
    from ms_accum import GradientAccumulation
    from ms_accum.train.options import WindowOptions
    reduction = "weighted_mean" if weighted(loss) else "mean"
    window = options.pop("window", None) or WindowOptions()
    return GradientAccumulation(network, loss, optimizer, structure=structure,
                                window=WindowOptions(reduction, window.clip_norm, window.buffer_dtype), **options)


def sync(out) -> None:
    """Waits for an asynchronous MindSpore result (reading a value drains the queue)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "asnumpy"):
        out.asnumpy()


def loop(step, batches) -> Callable[[int], None]:
    """fn(n) for `interleave`: `step(*batch)` over a pre-loaded list of batches, n of them (cycled), then a wait."""
    def run(n: int) -> None:
        out = None
        for i in range(n):
            out = step(*batches[i % len(batches)])
        sync(out)
    return run


def model_train(model, dataset) -> Callable[[int], None]:
    """fn(n) for `interleave`: ``model.train(1, dataset)`` of a `mindspore.train.Model` (one pass of `dataset`,
    whatever n), then a wait for its last step's outputs."""
    from mindspore.train import Callback

    class Wait(Callback):
        def on_train_end(self, run_context):
            sync(run_context.original_args().net_outputs)

    return lambda _n: model.train(1, dataset, callbacks=[Wait()])


def over(dataset, step) -> Callable[[int], None]:
    """fn(n) for `interleave`: `step(*batch)` over one pass of `dataset` (which fixes the batches, whatever n)."""
    def run(_n: int) -> None:
        out = None
        for batch in dataset.create_tuple_iterator(num_epochs=1):
            out = step(*batch)
        sync(out)
    return run

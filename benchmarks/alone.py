"""Speed of each contender alone in a fresh process, over real MNIST: what a user's process holds.

In one process, the graphs of the other contenders change how MindSpore runs every graph: with `"fused"` and
`"window"`, whose graphs have control flow, in the same process, the tutorial's loop and the default structure both
ran faster and apart (measured: benchmarks/README.md, `epoch_alone`). A user's process holds one structure's graphs,
so this section starts one process per contender and round, alternating, and compares them round by round.

    python -m benchmarks.alone CONTENDER DATA_DIR IMAGES     # one timed run; prints ms per micro-batch
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Dict, List

from .common import Table, log

CONTENDERS = {  # row name -> what `run` trains
    "docs tutorial: 3 Cells, Python loop": "tutorial",
    "ms_accum default ('three_graphs')": "auto",
    "one K·B step: nn.TrainOneStepCell on K·B": "big",
}
K, B = 4, 32


def table(data_dir: str, images: int, rounds: int) -> Table:
    """Each contender in `rounds` fresh processes of `images` images, alternated; ms per micro-batch of 32."""
    samples: Dict[str, List[float]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out = subprocess.run([sys.executable, "-m", "benchmarks.alone", CONTENDERS[name], data_dir, str(images)],
                                 capture_output=True, text=True, timeout=900, env=_env())
            if out.returncode != 0:
                raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
            samples[name].append(float(out.stdout.strip().splitlines()[-1]))
        log(f"   round {r + 1} of {rounds} done")
    result = Table("epoch_alone", f"LeNet5 over real MNIST, {images} images, B={B}, K={K}, each contender alone in a "
                   "fresh process (its graphs compiled on a first pass, then two timed passes)",
                   "micro-batch of 32 images", names[2])
    result.rows = samples
    result.note_goal([(names[1], names[0])], 1.05)
    return result


def _env() -> dict:
    import os
    return {**os.environ, "GLOG_v": "3"}


def run(which: str, data_dir: str, images: int) -> float:
    """ms per micro-batch of `which` over `images` images, after a first pass that compiles."""
    import ms_accum
    from ms_accum.demo.data import create_dataset
    from ms_accum.train.options import QUIET
    from .common import build, docs_tutorial, executor, one_step_cell, sync
    ms_accum.set_device("CPU")
    net, loss, opt, _ = build("lenet5")
    if which == "big":
        cell, dataset = one_step_cell(net, loss, opt), create_dataset(data_dir, B * K, num_samples=images, seed=0)

        def once():
            out = None
            for x, y in dataset.create_tuple_iterator(num_epochs=1):
                out = cell(x, y)
            sync(out)
    elif which == "tutorial":
        doc, dataset = docs_tutorial(net, loss, opt), create_dataset(data_dir, B, num_samples=images, seed=0)

        def once():
            sync(doc.run(dataset.create_tuple_iterator(num_epochs=1), K))
    else:
        model, dataset = executor(net, loss, opt, which), create_dataset(data_dir, B, num_samples=images, seed=0)

        def once():
            model.train_process(1, dataset, K, checkpoints=None, log=QUIET)
    once()
    start = time.perf_counter()
    once()
    once()
    return (time.perf_counter() - start) * 1e3 / (2 * images / B)


if __name__ == "__main__":
    print(f"{run(sys.argv[1], sys.argv[2], int(sys.argv[3])):.4f}")

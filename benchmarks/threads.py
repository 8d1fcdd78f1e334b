"""Section d: LeNet5 training vs the equivalent PyTorch CPU loop, and MindSpore's thread settings.

Every contender is a worker process (worker.py), because thread settings are process-wide and can be set
once, and so torch's OpenMP pool and MindSpore's thread pool never compete inside one process. All workers
are started and warmed up first; then the parent asks them in turn, one at a time, to run a block of
micro-batches (round-robin, order rotating each round), so they are measured side by side in one run.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from .common import BATCH, REPO, Table, interleave, log, version

# (row name, contender, setting, extra environment)
WORKERS = [
    ("torch: SGD(momentum) loop, K=4, set_num_threads(cores)", "torch", "default", {}),
    ("ms_accum TrainAccumulationCell, defaults", "ms_cell", "default", {}),
    ("ms_accum TrainWindowCell (one call per window), defaults", "ms_window", "default", {}),
    ("ms_accum Accumulator + @ms.jit, defaults", "ms_jit", "default", {}),
    ("user path: torch over a DataLoader (batch 32), K=4", "torch_loader", "default", {}),
    ("user path: executor default over a MindSpore dataset", "ms_executor", "default", {}),
    ("user path: executor 'fused' over a MindSpore dataset", "ms_executor_fused", "default", {}),
    ("user path: executor 'window' over a MindSpore dataset", "ms_executor_window", "default", {}),
    ("user path: nn.TrainOneStepCell loop over a MindSpore dataset", "ms_loop_one_step", "default", {}),
    # What a script that imports mindspore before ms_accum runs on an AVX-512 CPU (the same as the default elsewhere).
    ("user path: executor default, oneDNN not capped (ONEDNN_MAX_CPU_ISA=ALL)", "ms_executor", "default",
     {"ONEDNN_MAX_CPU_ISA": "ALL"}),
    ("TrainAccumulationCell, op threads_num(1)", "ms_cell", "threads_num=1", {}),
    ("TrainAccumulationCell, op threads_num(2)", "ms_cell", "threads_num=2", {}),
    ("TrainAccumulationCell, dispatch_threads_num(1)", "ms_cell", "dispatch_threads_num=1", {}),
    ("TrainAccumulationCell, set_cpu_affinity(True)", "ms_cell", "cpu_affinity", {}),
    ("TrainAccumulationCell, OMP_NUM_THREADS=1", "ms_cell", "env", {"OMP_NUM_THREADS": "1"}),
    ("torch, set_num_threads(1)", "torch", "threads_num=1", {}),
]
QUICK_WORKERS = 3  # --quick: torch, the library's default structure and its one-call-per-window Cell


class Worker:
    """One contender process speaking worker.py's --serve protocol."""

    def __init__(self, contender: str, setting: str, env: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", contender, "--setting", setting, "--serve"],
            cwd=REPO, env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def wait_ready(self) -> None:
        self._expect("READY")

    def __call__(self, n: int) -> None:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        self._expect("MS ")

    def _expect(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line
        raise RuntimeError(f"worker {self.proc.args} ended (exit {self.proc.wait()}) before printing {prefix!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def replicated_workers(rows: dict, rounds: int, calls: int, replicas: int):
    """{name: (contender, setting, env)} -> ({name: one sample per round, the mean of its processes}, a note giving
    each process's median): `replicas` worker processes per row, all timed side by side (`timed_workers`).

    A process keeps its own speed for its whole life (the same contender measured 0.96 in one run and 1.10 in the
    next against the same baseline), so a figure that should resolve a few percent averages several processes."""
    samples = timed_workers({(name, r): row for name, row in rows.items() for r in range(replicas)}, rounds, calls)
    means = {name: [float(v) for v in np.mean([samples[(name, r)] for r in range(replicas)], axis=0)] for name in rows}
    note = "each process's median over the rounds, ms: " + "; ".join(
        f"{name.split(' (')[0].split(':')[0]}: " + ", ".join(f"{np.median(samples[(name, r)]):.2f}"
                                                            for r in range(replicas)) for name in rows)
    return means, note


def timed_workers(rows: dict, rounds: int, calls: int) -> dict:
    """{name: (contender, setting, env)} -> {name: ms per micro-batch, one sample per round}: one worker process each,
    all started and warmed up first, then timed side by side (`interleave`), then closed."""
    workers = {name: Worker(*row) for name, row in rows.items()}
    try:
        for worker in workers.values():
            worker.wait_ready()
        return interleave(workers, rounds, calls, warmup=1)
    finally:
        for worker in workers.values():
            worker.close()


def torch_vs_mindspore(rounds: int, calls: int, quick: bool = False) -> Table:
    have_torch = version("torch") != "absent"
    rows = WORKERS[:QUICK_WORKERS] if quick else WORKERS
    if not have_torch:
        log("   torch is not installed: section d measures MindSpore's settings only "
            "(pip install torch==2.13.0 to compare)")
        rows = [row for row in rows if not row[1].startswith("torch")]
    samples = timed_workers({name: (contender, setting, env) for name, contender, setting, env in rows}, rounds, calls)
    baseline = rows[0][0]
    table = Table("d", "LeNet5 b32, K=4: MindSpore vs the PyTorch CPU loop, and MindSpore thread settings "
                  "(one process per row)", "one micro-batch of 32", BATCH, baseline,
                  "<= 1.00" if have_torch else None, [name for name, *_ in rows[1:4]] if have_torch else [])
    table.rows = samples
    table.notes.append("ratio <= 1.00 means MindSpore trains at least as fast as torch (throughput >= 1.0x).")
    if not have_torch:
        table.notes.append("torch absent: ratios are to MindSpore's defaults.")
    return table

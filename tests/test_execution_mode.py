"""MindSpore runs a small straight-line graph synchronously when its runtime has one actor thread, and a graph past 100
kernels on the actor threads (README, "Known MindSpore behaviour": small straight-line graphs). Benchmark section x
and the README's speed figures rest on it; this reads it from MindSpore's own INFO log, with no timing, so an upgrade
that changes it fails here."""
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = 8
SCRIPT = f"""
from benchmarks.common import micro_batches, setup_mindspore, tensors
from benchmarks.execution_mode import _ours
setup_mindspore()
inputs = tensors(micro_batches(2, None))
for cell in (_ours(), _ours("pad")):  # ms_accum's TrainForwardBackward on LeNet5, as it is, then padded
    for i in range({CALLS}):
        cell(*inputs[i % 2]).asnumpy()
"""
STRATEGY = re.compile(r"\] (\S+) execution count: (\d+), .* multi thread or not: ([01])")


def test_the_default_micro_batch_graph_runs_synchronously_and_the_padded_one_threaded():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env={**os.environ, "GLOG_v": "1"},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    threads = re.search(r"The actor thread number: (\d+)", out.stderr)
    assert threads, "MindSpore's INFO log no longer names its actor threads"
    if int(threads.group(1)) > 1:
        pytest.skip(f"{threads.group(1)} actor threads: MindSpore times both modes and keeps the faster")
    modes = {}  # graph -> the modes of its calls after the first, in the order the graphs first ran
    for graph, count, mode in STRATEGY.findall(out.stderr):
        if int(count) > 1:
            modes.setdefault(graph, set()).add(mode == "1")
    assert list(modes.values()) == [{False}, {True}], modes

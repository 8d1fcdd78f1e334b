"""Accumulation must save memory: the executor's default keeps one micro-batch's activations, not the window's, and
what it does to a window's gradient (measuring it, clipping it) copies no tensor of it.

Peak resident memory in a fresh process does not depend on load, so it can be asserted. Each figure is the
growth of a fresh process's peak RSS (`memory_scripts/peak.py`), training two windows over a MindSpore dataset:
- activations: an activation-heavy, parameter-light conv net (`ms_accum.demo.models.conv_net`): the executor with its
  default structure at K=8 x B=4, against plain `nn.TrainOneStepCell` steps on B=4 and on K·B=32;
- gradients: an MLP of three 4096 x 4096 weights, a third of the parameters each (`ms_accum.demo.models.wide_mlp`),
  the executor's default structure as it is, with statistics, with clipping, leaving micro-batches out.
"""
import functools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_scripts", "peak.py")
K = 8


def concurrently(*calls):
    """The results of `calls`, each of which measures fresh processes, run two at a time. A process's peak is its own,
    whatever runs beside it; starting one (importing MindSpore, compiling) keeps one core busy, so the second core
    measures the next."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda call: call(), calls))


def measured(factory: str, contender: str, k: int, *options: str) -> dict:
    """``{"peak": bytes, "params": bytes}`` of one configuration, from a fresh process."""
    out = subprocess.run([sys.executable, SCRIPT, factory, contender, str(k), *options], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def peak(contender: str, *options: str) -> int:
    return measured("conv_net", contender, K, *options)["peak"]


def medians_of_3(*configurations) -> dict:
    """The median peak of 3 fresh processes of each configuration (contender, options...), all run two at a time."""
    runs = concurrently(*[functools.partial(peak, *config) for config in configurations for _ in range(3)])
    return {config: sorted(runs[3 * i:3 * i + 3])[1] for i, config in enumerate(configurations)}


@pytest.fixture(scope="module")
def peaks():
    # The median of 3 fresh processes for the two figures compared within 1.15x: one process's peak moves by up to
    # about 0.15x one B step (docs/mindspore.md, no peak memory on CPU).
    runs = concurrently(functools.partial(peak, "one_kb"), *[functools.partial(peak, "one_b")] * 3,
                        *[functools.partial(peak, "auto")] * 3)
    return {"one_kb": runs[0], "one_b": sorted(runs[1:4])[1], "executor": sorted(runs[4:])[1]}


@pytest.mark.slow  # make test-all: seven fresh processes (make test proves the equivalence, not the memory)
def test_default_executor_costs_about_one_micro_batch_not_the_window(peaks):
    one_b, one_kb, executor = peaks["one_b"], peaks["one_kb"], peaks["executor"]
    report = f"peak RSS growth MiB: one B step {one_b / 2**20:.0f}, one K*B step {one_kb / 2**20:.0f}, " \
             f"executor default {executor / 2**20:.0f}"
    assert executor < 0.6 * one_kb, report
    # The goal is 1.10x; measured 1.02x here and 1.08x by the benchmark's harness on an AVX2-only EPYC, since no eager
    # pass runs on the way to training. It was 1.12-1.22x while an eager pass checked the network's output before
    # the first graph call (docs/mindspore.md, an eager pass's memory); 1.15x leaves one process's noise above the goal.
    assert executor < 1.15 * one_b, report


@pytest.mark.slow  # make test-all
def test_measure_sees_activations(peaks):
    # The measure can fail: a step on the K-times larger batch costs clearly more than one on B.
    assert peaks["one_kb"] > 1.6 * peaks["one_b"]


ONE_GRAPH_CASES = [
    ("fused", "--partial", "a partial window ran through TrainForwardBackward: 363 against 262 MiB"),
    ("fused", "--ramp", "one TrainAccumulationCell per K: 370 against 246 MiB"),
    ("window", "--partial", "a partial window ran through TrainForwardBackward: 412 against 272 MiB"),
    ("window", "--ramp", "one TrainWindowCell per K: 387 against 272 MiB")]


@pytest.fixture(scope="module")
def structure_peaks():
    """The median of 3 fresh processes of each structure, as it is and with each option of the test below."""
    configurations = sorted({(structure,) for structure, _, _ in ONE_GRAPH_CASES}
                            | {(structure, option) for structure, option, _ in ONE_GRAPH_CASES})
    return medians_of_3(*configurations)


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("structure, option, before", ONE_GRAPH_CASES)
def test_a_structure_runs_every_window_through_one_graph(peaks, structure_peaks, structure, option, before):
    # Each graph of the network holds activation memory of its own (docs/mindspore.md, each graph's memory): an epoch's
    # partial window, or a window of another K in a schedule, must run through the Cell that runs the others (the
    # fused one closes it on the host; the window one trains the first micro-batches of a stack of K). `before`: the
    # second graph's cost, measured.
    whole, other = structure_peaks[(structure,)], structure_peaks[(structure, option)]
    assert other - whole < 0.3 * peaks["one_b"], (f"peak RSS growth MiB: {structure} {whole / 2**20:.0f}, {option} "
                                                  f"{other / 2**20:.0f} (before the fix, {before})")


@pytest.fixture(scope="module")
def window_peaks():
    # The executor's default structure, K=4 x B=8, as it is and with each option that touches every gradient.
    options = ("statistics", "clip", "skip_microbatch", "outliers")
    runs = concurrently(functools.partial(measured, "wide_mlp", "three_graphs", 4),
                        *[functools.partial(measured, "wide_mlp", "three_graphs", 4, "--option", o) for o in options])
    return {"three_graphs": runs[0], **{f"three_graphs_{option}": run for option, run in zip(options, runs[1:])}}


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("option, bound, before", [
    ("statistics", 0.25, "each gradient waited for the whole micro-batch norm before the buffer's add: +0.37x "
                         "(earlier, squaring a large gradient with Mul before ReduceSum held a copy of it: +0.37x)"),
    ("clip", 0.25, "the guard read the clipped buffer again, and MindSpore copied its large tensors: +0.67x (earlier, "
                   "summing the global norm as ops.clip_by_global_norm does, Square and ReduceSum: +0.66x)"),
    ("skip_microbatch", 0.85, "a select of every gradient against zeros_like: +7.4x"),
    ("outliers", 0.85, "a select of every gradient against zeros_like: +7.4x")])
def test_an_option_on_the_window_costs_no_copy_of_a_gradient(window_peaks, option, bound, before):
    # Each weight is a third of the parameters, so a copy of any one of them exceeds the 0.25x allowed; the graphs'
    # own memory is about 0.01-0.11x (measured: statistics +0.05x, clipping +0.01x). `before`: what the option cost
    # when it held copies (measured). Leaving a micro-batch out (`skip_microbatch`, `outliers`) needs its whole
    # gradient's finiteness, or norm, before any of it is added: every gradient is alive at once until that tensor
    # `if`, 1.00x the parameters, where the plain default adds and frees each as the backward makes it (about one
    # weight's, 0.33x). That +0.67x is inherent, with the control flow's own 0.1x: measured +0.77x and +0.76x; 0.85x
    # still fails on one more copy of a weight's gradient (docs/memory.md).
    plain, peak = window_peaks["three_graphs"], window_peaks[f"three_graphs_{option}"]
    report = "peak RSS growth MiB: " + ", ".join(f"{name} {run['peak'] / 2**20:.0f}"
                                                 for name, run in window_peaks.items())
    assert peak["peak"] - plain["peak"] < bound * plain["params"], f"{report} (before the fix, {before})"


REAL_SIZE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_scripts", "real_size.py")


def real_size(optimizer: str, contender: str) -> dict:
    """``{"peak": bytes, "params": bytes}`` of `memory_scripts/real_size.py` (12 x Dense(2048, 2048), B=1, K=4)."""
    out = subprocess.run([sys.executable, REAL_SIZE_SCRIPT, optimizer, contender], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


REAL_SIZE_CASES = [
    ("sgd", "three_graphs", 1.25, "+1.86x: every gradient alive before its assign_add (a forward HyperMap)"),
    ("adamw", "three_graphs", 0.60, "+1.16x, the issue's figure"),
    ("adamw", "fused", 0.35, "+0.42x: the optimizer in a branch of the micro-batch's graph, after the backward")]


@pytest.fixture(scope="module")
def real_sizes():
    """`real_size` of every configuration the test below compares, the plain step's once per optimizer."""
    configurations = sorted({(optimizer, "one_b") for optimizer, _, _, _ in REAL_SIZE_CASES}
                            | {(optimizer, structure) for optimizer, structure, _, _ in REAL_SIZE_CASES})
    return dict(zip(configurations, concurrently(*[functools.partial(real_size, *c) for c in configurations])))


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("optimizer, structure, bound, before", REAL_SIZE_CASES)
def test_a_window_costs_its_buffer_on_a_parameter_heavy_network(real_sizes, optimizer, structure, bound, before):
    # The buffer is 1.00x the parameters; a plain step's gradients are transient. The default structure measured
    # +1.03-1.11x with SGD and +0.17-0.20x with AdamW (whose plain step peaks at the optimizer's temporaries beside the
    # gradients), "fused" +0.20x with AdamW, one process's figure moving by about 0.08x: `bound` leaves that margin
    # and fails on the regression `before` describes (docs/memory.md).
    plain, window = real_sizes[(optimizer, "one_b")], real_sizes[(optimizer, structure)]
    above = (window["peak"] - plain["peak"]) / plain["params"]
    assert above < bound, (f"{optimizer}: the {structure} structure's peak is +{above:.2f}x the parameters above the "
                           f"plain step's ({plain['peak'] / 2**20:.0f} / {window['peak'] / 2**20:.0f} MiB; before "
                           f"the fix, {before})")

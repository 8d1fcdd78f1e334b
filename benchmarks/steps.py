"""Sections a, b, c: train-step structures timed side by side in one process on pre-loaded tensors.

a. ms_accum's micro-step vs the fastest plain MindSpore step (nn.TrainOneStepCell), and the executor's loop
   vs a plain loop over the same in-memory dataset;
b. ms_accum vs the documentation's two implementations (the benchmark's own copies, doc_impls.py);
c. a window of 4 x b32 vs one step on b128, for each structure.
LeNet5, Momentum(0.01, 0.9), micro-batch 32, K = 4, every contender on its own identically initialised copy.
"""
from __future__ import annotations

import numpy as np

from .common import BATCH, K, Table, cycle_calls, interleave, lenet, sync, tensors, window_tensors


def _one_step_cell(seed=0):
    from mindspore import nn
    net, loss, opt = lenet(seed)
    return nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()


def _accumulation_cell(seed=0):
    from mindspore import nn
    from ms_accum import TrainAccumulationCell
    net, loss, opt = lenet(seed)
    return TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K).set_train()


def _window_cell(seed=0):
    from mindspore import nn
    from ms_accum import TrainWindowCell
    net, loss, opt = lenet(seed)
    return TrainWindowCell(nn.WithLossCell(net, loss), opt, K).set_train()


def per_micro_batch(window_fn):
    """fn(n) over micro-batches from fn(n) over windows of K (n is a multiple of K in every section)."""
    return lambda n: window_fn(n // K)


def micro_step(batches, rounds: int, calls: int) -> Table:
    """a1: one micro-batch through each structure, the Cells called directly on pre-loaded tensors."""
    inputs = tensors(batches)
    default = "three graphs K=4 (the executor's default)"
    table = Table("a1", "ms_accum micro-step vs plain nn.TrainOneStepCell (LeNet5 b32, pre-loaded tensors)",
                  "one micro-batch of 32", BATCH, "nn.TrainOneStepCell (no accumulation)", "<= 1.02",
                  [default, "TrainAccumulationCell K=4", "TrainWindowCell K=4, one call per window"])
    net, loss, opt = lenet()
    contenders = {
        "nn.TrainOneStepCell (no accumulation)": cycle_calls(_one_step_cell(), inputs),
        default: _three_graphs(net, loss, opt, inputs),
        "TrainAccumulationCell K=4": cycle_calls(_accumulation_cell(), inputs),
        "TrainWindowCell K=4, one call per window":
            per_micro_batch(cycle_calls(_window_cell(), window_tensors(batches))),
    }
    table.rows = interleave(contenders, rounds, calls)
    table.notes.append("the three graphs run as the executor runs them: TrainForwardBackward per micro-batch, then "
                       "per window a check graph and the step graph chosen on the host; TrainAccumulationCell is "
                       "structure='fused', one call per micro-batch; TrainWindowCell takes the 4 micro-batches "
                       "stacked, (4, 32, 1, 32, 32), in one call.")
    return table


class _Batches:
    """A random-access source of pre-made batches for GeneratorDataset: a pipeline with ~no work of its own."""

    def __init__(self, batches):
        self.batches = batches

    def __getitem__(self, index):
        return self.batches[index]

    def __len__(self):
        return len(self.batches)


def executor_loop(batches, rounds: int) -> Table:
    """a2: GradientAccumulation.train_process (default) vs a plain loop, both over one in-memory dataset."""
    import mindspore.dataset as ds
    from ms_accum import GradientAccumulation
    dataset = ds.GeneratorDataset(_Batches(batches), ["image", "label"], shuffle=False)
    step = _one_step_cell()

    def plain(_n):
        loss = None
        for x, y in dataset.create_tuple_iterator(num_epochs=1):
            loss = step(x, y)
        sync(loss)

    net, loss_fn, opt = lenet()
    executor = GradientAccumulation(net, loss_fn, opt)

    def accumulate(_n):
        executor.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False)

    fused_name, fused_loop = _fused_loop(dataset)
    table = Table("a2", f"executor loop vs plain loop over one in-memory dataset ({len(batches)} batches of 32 "
                  "per round, iterator start included)", "one micro-batch of 32", BATCH,
                  "plain loop: nn.TrainOneStepCell", "<= 1.02",
                  ["GradientAccumulation.train_process (default)", fused_name])
    table.rows = interleave({"plain loop: nn.TrainOneStepCell": plain,
                             "GradientAccumulation.train_process (default)": accumulate,
                             fused_name: fused_loop}, rounds, len(batches))
    table.notes.append("train_process reads each window's losses back (asnumpy) to log the step; the plain loop "
                       "never waits for a result until its last step.")
    return table


def _fused_loop(dataset):
    """train_process with one graph call per micro-batch (structure='fused'), over the same dataset."""
    from ms_accum import GradientAccumulation
    net, loss_fn, opt = lenet()
    executor = GradientAccumulation(net, loss_fn, opt, structure="fused")
    return ("GradientAccumulation.train_process (structure='fused')",
            lambda _n: executor.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False))


def jit_accumulator_step(net, loss_fn, opt, k: int = K, num_samples=None):
    """ms_accum's Accumulator used as MindSpore's page uses its own: value_and_grad + an @ms.jit train_step (each
    micro-batch weighted by `num_samples` when given)."""
    import mindspore as ms
    from mindspore import ops
    from ms_accum import Accumulator
    accumulator = Accumulator(opt, k)

    def forward_fn(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        return ops.depend(loss, accumulator(grads, num_samples))

    return train_step


def _three_graphs(net, loss_fn, opt, inputs):
    """ms_accum's three graphs as the executor runs them (its runner), in the tutorial's loop: TrainForwardBackward per
    micro-batch; per window, the check graph, then the step graph chosen on the host."""
    from ms_accum import GradientAccumulation
    runner = GradientAccumulation(net, loss_fn, opt, structure="three_graphs").runner(K)
    calls = [0]

    def run(n):
        loss = None
        for _ in range(n):
            loss = runner.forward_backward(*inputs[calls[0] % len(inputs)])
            calls[0] += 1
            if calls[0] % K == 0:
                runner.close()
        sync(loss)
    return run


# The rows of b and b3 that compare ours with the documentation implementation it replaces (`_replacement_ratios`)
DOC_PAGE = "docs page: @jit_class Accumulator + @ms.jit step"
OURS_ACCUMULATOR = "ms_accum Accumulator + @ms.jit step"
DOC_TUTORIAL = "docs tutorial: 3 Cells + Python loop"
OURS_THREE_GRAPHS = "ms_accum three graphs (the executor's default)"


def documentation(batches, rounds: int, calls: int, reverse_build: bool = False) -> Table:
    """b: ms per micro-batch of ms_accum's structures vs the documentation's two implementations.

    Which graph a process compiles first moves its speed by up to about 5 % (seen in section s), so run it twice, the
    second time with `reverse_build` (the contenders built, and compiled, in the opposite order), and read both.

    Every contender trains its own copy from the same initial weights on the same micro-batches, so the exact
    ones (all but the tutorial's, whose step is K times larger, and the plain step) must end with equal weights:
    checked after timing, so a contender that silently skipped work would be caught.
    """
    from mindspore import nn
    from ms_accum import TrainAccumulationCell, TrainWindowCell
    from . import doc_impls

    inputs = tensors(batches)
    builders = {  # name -> (net, loss, opt) -> fn(n)
        DOC_PAGE:
            lambda net, loss, opt: cycle_calls(doc_impls.accumulator_page_train_step(net, loss, opt, K)[0], inputs),
        DOC_TUTORIAL:
            lambda net, loss, opt: _cell_graph_tutorial(doc_impls.DocGradientAccumulation(net, loss, opt), inputs),
        OURS_ACCUMULATOR: lambda net, loss, opt: cycle_calls(jit_accumulator_step(net, loss, opt), inputs),
        OURS_THREE_GRAPHS: lambda net, loss, opt: _three_graphs(net, loss, opt, inputs),
        "ms_accum TrainAccumulationCell (structure='fused')": lambda net, loss, opt: cycle_calls(
            TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K).set_train(), inputs),
        "ms_accum TrainWindowCell (structure='window')": lambda net, loss, opt: per_micro_batch(cycle_calls(
            TrainWindowCell(nn.WithLossCell(net, loss), opt, K).set_train(), window_tensors(batches))),
        "nn.TrainOneStepCell (no accumulation)": lambda net, loss, opt: cycle_calls(
            nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train(), inputs),
    }
    contenders, optimizers = {}, {}
    for name, build in (reversed if reverse_build else iter)(list(builders.items())):
        net, loss, opt = lenet()
        contenders[name], optimizers[name] = build(net, loss, opt), opt
        contenders[name](len(inputs))  # compiled now, in this order (whole windows, every input once)
    contenders = {name: contenders[name] for name in builders}  # timed in the table's order either way

    table = Table("b", "ms_accum vs MindSpore's documented implementations (LeNet5 b32, K=4, own copies)",
                  "one micro-batch of 32", BATCH, DOC_PAGE)
    table.rows = interleave(contenders, rounds, calls)
    reference = optimizers["ms_accum TrainAccumulationCell (structure='fused')"].parameters
    diffs = {name: max(float(np.abs(a.asnumpy() - b.asnumpy()).max()) for a, b in zip(opt.parameters, reference))
             for name, opt in optimizers.items()}
    table.notes.append("exactness after the run, max |weight - TrainAccumulationCell's weight| (same init, same "
                       "micro-batches): " + "; ".join(f"{name.split(':')[0].split(' (')[0]}: {diff:.1e}"
                                                        for name, diff in diffs.items()))
    table.notes.append("the docs tutorial sums K mean losses (a K-times larger step) and the plain step updates "
                       "every micro-batch, so only those two should differ.")
    _replacement_ratios(table)
    return table


# b3: (row name, worker.py contender)
PROCESS_ROWS = [(DOC_PAGE, "doc_page"), (OURS_ACCUMULATOR, "ms_jit"), (DOC_TUTORIAL, "doc_tutorial"),
                (OURS_THREE_GRAPHS, "ms_three_graphs")]


def documentation_processes(rounds: int, calls: int, replicas: int = 3) -> Table:
    """b3: section b's two comparisons with every contender in processes of its own, `replicas` processes each.

    In one process, which graph compiles first moves the speed of the others by up to about 5 %; here each process
    compiles one contender, and the parent asks them in turn (order rotating each round) to run a block of
    micro-batches, so they are still measured side by side (`threads.replicated_workers`).
    """
    from .threads import replicated_workers
    table = Table("b3", f"section b's comparisons, {replicas} processes per contender (LeNet5 b32, K=4)",
                  "one micro-batch of 32, the mean of a contender's processes", BATCH, DOC_PAGE)
    table.rows, note = replicated_workers({name: (contender, "default", {}) for name, contender in PROCESS_ROWS},
                                          rounds, calls, replicas)
    table.notes.append(note)
    _replacement_ratios(table)
    return table


def _replacement_ratios(table: Table) -> None:
    """Notes ours / the documentation's implementation it replaces, for both pairs, against the 1.02 target."""
    medians = {name: np.median(values) for name, values in table.rows.items()}
    for theirs, ours in ((DOC_PAGE, OURS_ACCUMULATOR), (DOC_TUTORIAL, OURS_THREE_GRAPHS)):
        ratio = medians[ours] / medians[theirs]
        paired = np.median(np.asarray(table.rows[ours]) / np.asarray(table.rows[theirs]))
        table.notes.append(f"{ours.split(' (')[0]} / {theirs.split(':')[0]}, the implementation it replaces: "
                           f"{ratio:.3f} (median of per-round ratios {paired:.3f}; target <= 1.02 "
                           f"{'MET' if ratio <= 1.02 else 'NOT MET'})")


def _cell_graph_tutorial(executor, inputs):
    return lambda n: sync(executor.run([inputs[i % len(inputs)] for i in range(n)], K))


def window(batches, rounds: int, windows: int):
    """c: one window of 4 x b32 vs one b128 step, including TrainWindowCell. Returns (table, max diff)."""
    from mindspore import Tensor

    stacked = window_tensors(batches)
    big = [(Tensor(x.asnumpy().reshape((-1,) + x.shape[2:])), Tensor(y.asnumpy().reshape(-1))) for x, y in stacked]
    micro = tensors(batches)
    accumulation = cycle_calls(_accumulation_cell(), micro)
    three_graphs = _three_graphs(*lenet(), micro)
    small_steps = cycle_calls(_one_step_cell(), micro)
    contenders = {
        "nn.TrainOneStepCell on b128": cycle_calls(_one_step_cell(), big),
        "three graphs (default), 4 + 2 calls": lambda n: three_graphs(K * n),
        "TrainAccumulationCell, 4 calls of b32": lambda n: accumulation(K * n),
        "TrainWindowCell, 1 call of (4,32,...)": cycle_calls(_window_cell(), stacked),
        "nn.TrainOneStepCell, 4 calls of b32 (4 updates)": lambda n: small_steps(K * n),
    }
    table = Table("c", "a window of 4 x b32 vs one step on b128", "one window of 128 images", K * BATCH,
                  "nn.TrainOneStepCell on b128", "<= 1.00",
                  ["three graphs (default), 4 + 2 calls", "TrainAccumulationCell, 4 calls of b32",
                   "TrainWindowCell, 1 call of (4,32,...)"])
    table.rows = interleave(contenders, rounds, windows)
    diff = _window_vs_big_batch(stacked, big)
    table.notes.append(f"TrainWindowCell vs TrainOneStepCell(b128) after 3 windows, same init: max |param diff| = "
                       f"{diff:.2e} (float32 summation order only)")
    win, acc = (np.median(table.rows[name]) for name in ("TrainWindowCell, 1 call of (4,32,...)",
                                                            "TrainAccumulationCell, 4 calls of b32"))
    table.notes.append(f"TrainWindowCell: {win / K:.3f} ms per micro-batch, {win / acc:.3f}x the time of 4 separate "
                       f"TrainAccumulationCell calls ({'beats' if win < acc else 'does not beat'} them)")
    return table, diff


def _window_vs_big_batch(stacked, big) -> float:
    """Max |param difference| after 3 windows: TrainWindowCell on K micro-batches vs TrainOneStepCell on K*B."""
    big_cell, win_cell = _one_step_cell(seed=1), _window_cell(seed=1)
    for window_inputs, big_inputs in list(zip(stacked, big))[:3]:
        big_cell(*big_inputs)
        win_cell(*window_inputs)
    return max(float(np.abs(a.asnumpy() - b.asnumpy()).max())
               for a, b in zip(big_cell.optimizer.parameters, win_cell.optimizer.parameters))

"""Speed: ms_accum against the documentation's code, mindcv's accumulation (its `TrainStep` through `Model`), one
large K·B step and a plain loop, timed side by side.

Every contender trains its own copy of the network from the same initial weights, with Momentum(0.01, 0.9) and
K = 4; the contenders of a table run in one process in interleaved rounds (`common.interleave`), so what slows the
machine slows them alike. The documentation's code is the benchmark's own copy of it (`doc_impls.py`).

- ``step``: LeNet5, micro-batch 32, the steps alone, called on pre-loaded tensors: what each structure costs
  without a data pipeline. Afterwards every contender that should equal the K·B step is compared with it.
- ``epoch``: LeNet5 over real MNIST (`ms_accum.demo.data.create_dataset`), ms_accum through its executor
  (`GradientAccumulation.train_process`), mindcv through `Model.train`, the others in the loop their documentation
  writes: what users run.
- ``conv_net``, ``char_transformer``: the compute-heavy networks of `ms_accum.demo.models` (the activation-heavy conv
  net on 3x96x96, the Shakespeare tutorial's transformer on sequences of 256), K=4 x B=8, over a dataset of their
  samples.
"""
from __future__ import annotations

import numpy as np
from ms_accum.train.options import QUIET, StatisticsOptions

from .common import (K, Table, accumulator_step, build, docs_page_step, docs_tutorial, executor, interleave, log,
                     loop, mindcv_model, model_train, one_step_cell, over, short, sync)

PLAIN = "plain loop: nn.TrainOneStepCell on B"
BIG = "one K·B step: nn.TrainOneStepCell on K·B"
DOC_PAGE = "docs page: @jit_class Accumulator, @ms.jit step"
OURS_PAGE = "ms_accum Accumulator, @ms.jit step"
DOC_TUTORIAL = "docs tutorial: 3 Cells, Python loop"
DEFAULT = "ms_accum default ('three_graphs')"
FUSED = "ms_accum 'fused'"
WINDOW = "ms_accum 'window'"
STATISTICS = "ms_accum statistics=True (default structure)"
MINDCV = "mindcv TrainStep: K=4, through Model"
STRUCTURES = (DEFAULT, FUSED, WINDOW)
# Ours and the documentation's implementation it replaces
REPLACES = ((OURS_PAGE, DOC_PAGE), (DEFAULT, DOC_TUTORIAL))


def _timed(contenders, rounds: int, units: int, warmup: int):
    log(f"   {len(contenders)} contenders built; {warmup} warm-up round(s), then {rounds} timed")
    return interleave(contenders, rounds, units, warmup)


def _notes(table: Table) -> None:
    """Ours against the documentation's code it replaces, every structure against the one K·B step and, where it
    ran, against mindcv's accumulation."""
    table.note_goal(REPLACES, 1.02)
    table.note_goal([(structure, BIG) for structure in STRUCTURES], 1.00)
    if MINDCV in table.rows:
        table.note_goal([(structure, MINDCV) for structure in STRUCTURES], 1.00)


# ------------------------------------------------------------------------------------------------------------- step
def step(batches, rounds: int, units: int, warmup: int = 1) -> Table:
    """LeNet5 b32 on pre-loaded tensors, ms per micro-batch. `batches`: numpy (images, labels) micro-batches, a
    multiple of K of them; `units`, the micro-batches per round, a multiple of K too."""
    from mindspore import Tensor, nn
    from ms_accum.graphs import TrainAccumulationCell, TrainWindowCell
    micro = [(Tensor(x), Tensor(y)) for x, y in batches]
    windows = [(np.stack([x for x, _ in batches[i:i + K]]), np.stack([y for _, y in batches[i:i + K]]))
               for i in range(0, len(batches), K)]
    big = [(Tensor(x.reshape((-1,) + x.shape[2:])), Tensor(y.reshape(-1))) for x, y in windows]
    stacked = [(Tensor(x), Tensor(y)) for x, y in windows]

    def per_window(run):
        return lambda n: run(n // K)

    def three_graphs(net, loss, opt):
        runner = executor(net, loss, opt, "three_graphs").runner(K)

        def run(n):
            for w in range(n // K):  # the runner reads each window's verdict back: synchronized
                runner.run(micro[(w * K) % len(micro):][:K], K)
        return run

    def tutorial(net, loss, opt):
        doc = docs_tutorial(net, loss, opt)
        return lambda n: sync(doc.run([micro[i % len(micro)] for i in range(n)], K))

    builders = {
        PLAIN: lambda net, loss, opt: loop(one_step_cell(net, loss, opt), micro),
        BIG: lambda net, loss, opt: per_window(loop(one_step_cell(net, loss, opt), big)),
        DOC_PAGE: lambda net, loss, opt: loop(docs_page_step(net, loss, opt), micro),
        OURS_PAGE: lambda net, loss, opt: loop(accumulator_step(net, loss, opt), micro),
        DOC_TUTORIAL: tutorial,
        DEFAULT: three_graphs,
        FUSED: lambda net, loss, opt: loop(TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K).set_train(),
                                           micro),
        WINDOW: lambda net, loss, opt: per_window(loop(
            TrainWindowCell(nn.WithLossCell(net, loss), opt, K).set_train(), stacked)),
    }
    contenders, optimizers = {}, {}
    for name, make in builders.items():
        net, loss, opt, _ = build("lenet5")
        contenders[name], optimizers[name] = make(net, loss, opt), opt
    table = Table("step", "LeNet5 b32, K=4, the steps alone on pre-loaded tensors", "micro-batch of 32 images", BIG)
    table.rows = _timed(contenders, rounds, units, warmup)
    _notes(table)
    reference = [p.asnumpy() for p in optimizers[BIG].parameters]
    differences = {name: max(float(np.abs(p.asnumpy() - r).max()) for p, r in zip(opt.parameters, reference))
                   for name, opt in optimizers.items() if name != BIG}
    table.notes.append("max |weight - the K·B step's| after the run (same initial weights, same samples): " +
                       "; ".join(f"{short(name)} {diff:.1e}" for name, diff in differences.items()))
    table.notes.append("expected: float32 rounding for every accumulating contender but the docs tutorial, whose "
                       "window sums K mean losses (a K-times larger step); the plain loop updates every micro-batch.")
    return table


# ------------------------------------------------------------------------------------------------------------ epoch
def epoch(data_dir: str, images: int, rounds: int, warmup: int = 1) -> Table:
    """LeNet5 over `images` real MNIST images per round, ms per micro-batch of 32 (the K·B loop: per 32 images)."""
    from ms_accum.demo.data import create_dataset

    def data(batch):
        return create_dataset(data_dir, batch, num_samples=images, seed=0)

    def trained(structure="auto", **options):
        def make(net, loss, opt):
            model, dataset = executor(net, loss, opt, structure, **options), data(32)
            return lambda _n: model.train_process(1, dataset, K, checkpoints=None, log=QUIET)
        return make

    def tutorial(net, loss, opt):
        doc, dataset = docs_tutorial(net, loss, opt), data(32)
        return lambda _n: sync(doc.run(dataset.create_tuple_iterator(num_epochs=1), K))

    builders = {
        PLAIN: lambda net, loss, opt: over(data(32), one_step_cell(net, loss, opt)),
        BIG: lambda net, loss, opt: over(data(32 * K), one_step_cell(net, loss, opt)),
        DOC_PAGE: lambda net, loss, opt: over(data(32), docs_page_step(net, loss, opt)),
        OURS_PAGE: lambda net, loss, opt: over(data(32), accumulator_step(net, loss, opt)),
        DOC_TUTORIAL: tutorial,
        MINDCV: lambda net, loss, opt: model_train(mindcv_model(net, loss, opt), data(32)),
        DEFAULT: trained(),
        FUSED: trained("fused"),
        WINDOW: trained("window"),
        STATISTICS: trained(statistics=StatisticsOptions(norms=True)),
    }
    contenders = {name: make(*build("lenet5")[:3]) for name, make in builders.items()}
    table = Table("epoch", f"LeNet5 over real MNIST, {images} images a round, B=32, K=4 (ms_accum through "
                  "GradientAccumulation.train_process)", "micro-batch of 32 images", BIG)
    table.rows = _timed(contenders, rounds, images // 32, warmup)
    _notes(table)
    table.note_goal([(STATISTICS, DEFAULT)], 1.02)
    return table


# ------------------------------------------------------------------------------------------------------------ heavy
def heavy(factory: str, windows: int, rounds: int, warmup: int = 1, micro: int = 8) -> Table:
    """A compute-heavy demo network over a dataset of `windows` windows of its samples a round, ms per window."""
    import mindspore.dataset as ds
    x, y = build(factory)[3](windows * K * micro)

    def data(batch):
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=True)

    def trained(structure="auto"):
        def make(net, loss, opt):
            model, dataset = executor(net, loss, opt, structure), data(micro)
            return lambda _n: model.train_process(1, dataset, K, checkpoints=None, log=QUIET)
        return make

    def tutorial(net, loss, opt):
        doc, dataset = docs_tutorial(net, loss, opt), data(micro)
        return lambda _n: sync(doc.run(dataset.create_tuple_iterator(num_epochs=1), K))

    builders = {
        PLAIN: lambda net, loss, opt: over(data(micro), one_step_cell(net, loss, opt)),
        BIG: lambda net, loss, opt: over(data(micro * K), one_step_cell(net, loss, opt)),
        DOC_PAGE: lambda net, loss, opt: over(data(micro), docs_page_step(net, loss, opt)),
        OURS_PAGE: lambda net, loss, opt: over(data(micro), accumulator_step(net, loss, opt)),
        DOC_TUTORIAL: tutorial,
        MINDCV: lambda net, loss, opt: model_train(mindcv_model(net, loss, opt), data(micro)),
        DEFAULT: trained(),
        FUSED: trained("fused"),
        WINDOW: trained("window"),
    }
    contenders = {name: make(*build(factory)[:3]) for name, make in builders.items()}
    table = Table(factory, f"{factory} over a dataset of its samples, {windows} windows of K=4 x B={micro} a round "
                  "(ms_accum through GradientAccumulation.train_process)", f"window of {K * micro} samples", BIG)
    table.rows = _timed(contenders, rounds, windows, warmup)
    _notes(table)
    return table

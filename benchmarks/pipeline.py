"""Section e: the LeNet5 tutorial's epoch end to end (real MNIST through ms_accum.demo.data.create_dataset) vs the
step alone on pre-loaded tensors, and the pipeline alone, with dataset options; all interleaved in one process.

Each round of an end-to-end contender is a fresh iterator over `num_samples` shuffled training images, so its
start-up is paid every round as at every epoch's start.
"""
from __future__ import annotations

import time

from .common import BATCH, K, Table, cycle_calls, interleave, lenet, log, sync, tensors


def _dataset(data_dir: str, num_samples: int, workers: int):
    from ms_accum.demo.data import create_dataset
    return create_dataset(data_dir, BATCH, num_samples=num_samples, num_parallel_workers=workers, seed=0)


def _cell():
    from mindspore import nn
    from ms_accum import TrainAccumulationCell
    net, loss, opt = lenet()
    return TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K).set_train()


def epoch(data_dir: str, batches, rounds: int, num_samples: int, quick: bool) -> Table:
    from ms_accum import GradientAccumulation

    def pipeline_only(workers, do_copy=True):
        dataset = _dataset(data_dir, num_samples, workers)

        def run(_n):
            for _ in dataset.create_tuple_iterator(num_epochs=1, do_copy=do_copy):
                pass
        return run

    def executor(workers):
        dataset = _dataset(data_dir, num_samples, workers)
        net, loss, opt = lenet()
        model = GradientAccumulation(net, loss, opt)
        return lambda _n: model.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False)

    def cell_loop(workers, do_copy):
        dataset, cell = _dataset(data_dir, num_samples, workers), _cell()

        def run(_n):
            loss = None
            for x, y in dataset.create_tuple_iterator(num_epochs=1, do_copy=do_copy):
                loss = cell(x, y)
            sync(loss)
        return run

    step_alone = "step alone: TrainAccumulationCell on pre-loaded tensors"
    contenders = {
        step_alone: cycle_calls(_cell(), tensors(batches)),
        "pipeline alone, num_parallel_workers=1 (default)": pipeline_only(1),
        "pipeline alone, num_parallel_workers=2": pipeline_only(2),
        "pipeline alone, workers=1, do_copy=False": pipeline_only(1, do_copy=False),
        "epoch: GradientAccumulation.train_process, workers=1 (default)": executor(1),
        "epoch: GradientAccumulation.train_process, workers=2": executor(2),
        "epoch: TrainAccumulationCell loop, workers=1, do_copy=False": cell_loop(1, False),
        "epoch: TrainAccumulationCell loop, workers=2, do_copy=False": cell_loop(2, False),
    }
    if quick:  # the smoke run keeps the step, the pipeline's capacity and the library's default epoch
        contenders = {name: fn for name, fn in contenders.items() if "do_copy" not in name and "=2" not in name}
    table = Table("e", f"LeNet5 epoch end to end on real MNIST ({num_samples} images per round) vs the step alone",
                  "one micro-batch of 32", BATCH, step_alone)
    table.rows = interleave(contenders, rounds, num_samples // BATCH)
    if not quick:
        log("   e: one full epoch (60000 images) with the library defaults ...")
        dataset = _dataset(data_dir, None, 1)
        net, loss, opt = lenet()
        model = GradientAccumulation(net, loss, opt)
        start = time.perf_counter()
        model.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False)
        seconds = time.perf_counter() - start
        images = dataset.get_dataset_size() * BATCH
        table.notes.append(f"one full epoch, GradientAccumulation defaults (first call: compilation included): "
                           f"{seconds:.1f} s, {images / seconds:.0f} images/s")
    table.notes.append("ratio > 1 for an 'epoch' row is the time the pipeline adds to the step (starvation or "
                       "competition for the 2 cores); 'pipeline alone' rows give the pipeline's own capacity.")
    return table

"""One resumable training run, optionally killed with SIGKILL at a chosen point (used by test_resume.py).

    python resume_worker.py CKPT_DIR STRUCTURE FAULT [MINI_STEPS SAMPLES KEEP_LAST RESUME DROPOUT]
    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True resume_worker.py CKPT_DIR STRUCTURE FAULT ...

FAULT is ``none``, ``micro:N`` (killed right after the N-th micro-batch of this process ran; with the window
structure, after the window call that ran it; with the cached one, pass 1 and pass 2 of a micro-batch count one each),
``boundary:S``
(killed right after the training state of optimizer step S was saved) or ``save:S`` (killed while the state of
step S is being written: the temporary file is left torn). The run always asks to resume, so a second run of
the same command continues where the killed one stopped. It prints one JSON line, the result.

Every run reads its data through MindSpore's DistributedSampler (``num_shards``: the ranks, 1 without msrun), in
micro-batches of BATCH on each rank, so runs on different numbers of ranks read the same global order. Under msrun each
rank writes its final parameters to CKPT_DIR/params_rank<r>.npz; ``FAULT@R`` injects the fault on rank R only.
KEEP_LAST 0 keeps every state; RESUME is ``latest`` (the newest state, if any) or a state file. MINI_STEPS is K or a
schedule, ``samples:K,...`` (`ms_accum.train.schedule.parse_schedule`), or ``adaptive:K_MIN:K_MAX:RULE``: an
`AdaptiveK` deciding every 2 windows of K_MIN from 4 on, with the noise scale and outlier skipping on
(test_adaptive.py). DROPOUT (default 0) above 0 trains a small network with an `nn.Dropout` of that rate instead of
the MLP (test_dropout.py).
"""
import json
import os
import signal
import sys

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

import ms_accum.train.checkpoint
from ms_accum import AdaptiveK, GradientAccumulation, StatisticsOptions
from ms_accum.train.options import QUIET, Checkpoints
from ms_accum.demo.models import MLP
from ms_accum.graphs.cached import _CachedPass
from ms_accum.graphs.cells import HostSteppedAccumulationCell, TrainForwardBackward, _ThreadedForwardBackward
from ms_accum.graphs.window import HostSteppedWindowCell
from ms_accum.train.distributed import distributed_launch, init_data_parallel
from ms_accum.train.resume import StateCheckpoints
from ms_accum.train.schedule import parse_schedule

EPOCHS, MINI_STEPS, BATCH, SAMPLES = 2, 3, 8, 100  # 13 batches an epoch: 4 full windows and a partial one
SAVE_EVERY, KEEP_LAST = 2, 2


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def inject(fault: str) -> None:
    kind, _, value = fault.partition(":")
    if kind == "micro":
        calls = {"n": 0}
        for cls in (HostSteppedAccumulationCell, TrainForwardBackward, _ThreadedForwardBackward, HostSteppedWindowCell,
                    _CachedPass):
            original = cls.__call__

            def counted(self, *inputs, _original=original, _cls=cls):
                out = _original(self, *inputs)
                if type(self) is not _cls:  # the window Cell inherits the fused Cell's wrapper: count once
                    return out
                loss = out[0] if isinstance(out, tuple) else out  # (loss, verdict) or (loss, statistics)
                loss.asnumpy()  # the micro-batch (or window) has run
                # A window call returns one loss per micro-batch; a cached pass, the micro-batch's outputs.
                calls["n"] += 1 if _cls is _CachedPass else loss.size
                if calls["n"] >= int(value):
                    die()
                return out
            cls.__call__ = counted
    elif kind == "boundary":
        original_save = StateCheckpoints.window_closed

        def save_then_die(self, position, stopping=False):
            original_save(self, position, stopping)
            if position.step == int(value):
                die()
        StateCheckpoints.window_closed = save_then_die
    elif kind == "save":
        original_ms_save = ms_accum.train.checkpoint.ms.save_checkpoint

        def torn_save(save_obj, path, *args, **kwargs):
            original_ms_save(save_obj, path, *args, **kwargs)
            if f"-{int(value):09d}" in path:
                with open(path, "r+b") as handle:  # half written when the power went
                    handle.truncate(os.path.getsize(path) // 2)
                die()
        ms_accum.train.checkpoint.ms.save_checkpoint = torn_save
    elif kind != "none":
        raise SystemExit(f"unknown fault {fault!r}")


def main(ckpt_dir: str, structure: str, fault: str, mini_steps: str = str(MINI_STEPS), samples: str = str(SAMPLES),
         keep_last: str = str(KEEP_LAST), resume: str = "latest", dropout: str = "0") -> None:
    info = None if distributed_launch() is None else init_data_parallel()  # first: msrun's scheduler stops here
    fault, _, fault_rank = fault.partition("@")
    if not fault_rank or info.rank == int(fault_rank):
        inject(fault)
    ranks, rank = (1, 0) if info is None else (info.group_size, info.rank)
    ds.config.set_seed(7)  # the shuffle order, which resuming relies on
    ms.set_seed(1)
    rng = np.random.RandomState(0)
    data = {"image": rng.rand(int(samples), 1, 28, 28).astype(np.float32),
            "label": rng.randint(0, 10, int(samples)).astype(np.int32)}
    dataset = ds.NumpySlicesDataset(data, shuffle=True, num_shards=ranks, shard_id=rank).batch(BATCH)
    net = MLP() if not float(dropout) else nn.SequentialCell(
        [nn.Flatten(), nn.Dense(28 * 28, 64), nn.ReLU(), nn.Dropout(p=float(dropout)), nn.Dense(64, 10)])
    # Adam: its moments and beta powers are state that must survive the kill too.
    optimizer = nn.Adam(net.trainable_params(), 1e-3)
    adaptive = mini_steps.startswith("adaptive:")
    statistics = StatisticsOptions(noise_scale=True, skip_outliers=2.0, outlier_warmup=8) if adaptive else None
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), optimizer,
                                    structure=structure, statistics=statistics)
    if adaptive:
        _, k_min, k_max, rule = mini_steps.split(":")
        window = int(k_min) * BATCH * ranks
        schedule = AdaptiveK(int(k_min), int(k_max), lr_rule=rule, min_samples=4 * window, every=2 * window,
                             threshold=0.1)
    else:
        schedule = parse_schedule(mini_steps) if ":" in mini_steps else int(mini_steps)
    checkpoints = Checkpoints(ckpt_dir, "run", save_every=SAVE_EVERY, keep_last=int(keep_last) or None,
                              resume=True if resume == "latest" else resume)
    result = executor.train_process(EPOCHS, dataset, schedule, checkpoints=checkpoints, log=QUIET)
    if info is not None:
        np.savez(os.path.join(ckpt_dir, f"params_rank{info.rank}.npz"),
                 **{p.name: p.asnumpy() for p in net.trainable_params()})
    print(json.dumps({"checkpoint": result.checkpoint, "resumed_from": result.resumed_from,
                      "steps": [record.step for record in result.steps],
                      "k": [record.accumulate_step for record in result.steps],
                      "noise_scale": [record.noise_scale for record in result.steps],
                      "lr_scale": [record.lr_scale for record in result.steps],
                      "skipped_micro_batches": result.skipped_micro_batches}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""One resumable cached-structure run (test_cached.py), alone or under msrun, optionally killed with SIGKILL.

    python cached_worker.py CKPT_DIR FAULT [OPTIMIZER]
    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True cached_worker.py CKPT_DIR none [OPTIMIZER]

The InfoNCE two-tower model of `cached_models.py`, AdamW (its moments must survive a kill; OPTIMIZER ``sgd``: SGD),
2 epochs of 10 micro-batches of 8 on each rank in windows of 4 (the third a partial one of 2), the state saved every
2 windows. FAULT is ``none`` or ``micro:N``: killed right after the N-th micro-batch of pass 2 (mid-window: gradients
are in the buffer, the window is not closed). The run always asks to resume. It writes its final parameters to
CKPT_DIR/params.npz (params_rank<r>.npz under msrun) and prints one JSON line.
"""
import json
import os
import signal
import sys

import numpy as np
import mindspore.dataset as ds
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cached_models import build  # noqa: E402
from ms_accum import GradientAccumulation  # noqa: E402
from ms_accum.graphs import cached  # noqa: E402
from ms_accum.train.distributed import distributed_launch, init_data_parallel  # noqa: E402

EPOCHS, MINI_STEPS, BATCH, BATCHES = 2, 4, 8, 10


def inject(fault: str) -> None:
    kind, _, value = fault.partition(":")
    if kind == "none":
        return
    if kind != "micro":
        raise SystemExit(f"unknown fault {fault!r}")
    calls = {"n": 0}
    original = cached._CachedPass.__call__

    def counted(self, backward, *inputs):
        out = original(self, backward, *inputs)
        if not bool(backward.asnumpy()):  # pass 1
            return out
        (out[0] if isinstance(out, tuple) else out).asnumpy()  # the micro-batch's gradient is in the buffer
        calls["n"] += 1
        if calls["n"] >= int(value):
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    cached._CachedPass.__call__ = counted


def main(ckpt_dir: str, fault: str, opt: str = "adamw") -> None:
    info = None if distributed_launch() is None else init_data_parallel()  # first: msrun's scheduler stops here
    inject(fault)
    ranks, rank = (1, 0) if info is None else (info.group_size, info.rank)
    ds.config.set_seed(7)
    net, loss, data = build("infonce")
    x, y = data(BATCHES * BATCH * ranks)
    dataset = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False, num_shards=ranks,
                                    shard_id=rank).batch(BATCH)
    optimizer = (nn.AdamWeightDecay(net.trainable_params(), 1e-2, weight_decay=0.01) if opt == "adamw" else
                 nn.SGD(net.trainable_params(), 0.1))
    executor = GradientAccumulation(net, loss, optimizer, structure="cached")
    result = executor.train_process(EPOCHS, dataset, MINI_STEPS, ckpt_dir=ckpt_dir, ckpt_name="run", verbose=False,
                                    save_every=2, resume=True)
    out = "params.npz" if info is None else f"params_rank{rank}.npz"
    np.savez(os.path.join(ckpt_dir, out), **{p.name: p.asnumpy() for p in net.trainable_params()})
    print(json.dumps({"resumed_from": result.resumed_from, "steps": [r.step for r in result.steps],
                      "losses": result.losses}), flush=True)


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    main(*sys.argv[1:])

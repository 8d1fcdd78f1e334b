"""Gradient caching (``structure="cached"``): a contrastive window's memory and time against one micro-batch's step and
one large step.

    python -m benchmarks.cached CONTENDER K     (one memory figure, here: prints {"peak": bytes, "params": bytes})

The encoder is the activation-heavy `ConvNet` of `ms_accum.demo.models` (four conv3x3 x 32 channels on 3x96x96, its
10 outputs taken as the embedding), the loss a supervised-contrastive one over the whole batch (every sample against
every other), SGD. The global batch is 32 = K x B for K in {4, 8, 16}.

- memory (a fresh process per figure, peak RSS growth over two windows, as `benchmarks.memory` measures): a plain step
  on B (``one_b``), one step on the K·B batch (``one_kb``, the update caching equals), and the executor with
  ``structure="cached"`` over a dataset of micro-batches of B (``cached``);
- time, side by side in one process (interleaved rounds): ms per window of ``TrainCachedWindowCell.train_window`` on
  pre-loaded micro-batches against the K·B step (two forwards and one backward per micro-batch against one of each).
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, List, Optional

from .common import MIB, Table, fresh_process, interleave

GLOBAL_BATCH, WINDOWS = 32, 2
KS = (4, 8, 16)
CONTENDERS = {"one_b": "plain step on B", "one_kb": "one K·B step", "cached": "structure='cached'"}
MEMORY_GOAL = 1.2  # a cached window's peak: at most this many one-B steps (plus the window's outputs, a few KiB)
TIME_GOAL = 1.4    # a cached window's time: at most this many K·B steps


def _parts(seed: int = 0):
    """(encoder, supervised-contrastive loss, SGD, sample) on the conv net."""
    import mindspore as ms
    from mindspore import nn, ops
    from ms_accum.demo import models

    class SupCon(nn.Cell):
        """Supervised contrastive (Khosla et al. 2020): each anchor against every other sample, its class positive."""

        def construct(self, emb, labels):
            z = emb / ops.sqrt((emb * emb).sum(1, keepdims=True) + 1e-12)
            n = ops.shape(z)[0]
            eye = ops.eye(n, n, ms.float32)
            logits = ops.matmul(z, z.T) / 0.5 - eye * 1e4
            log_prob = logits - ops.logsumexp(logits, 1, True)
            positives = ops.cast(ops.expand_dims(labels, 1) == ops.expand_dims(labels, 0), ms.float32) * (1.0 - eye)
            return -((positives * log_prob).sum(1) / ops.maximum(positives.sum(1), 1.0)).mean()

    ms.set_seed(seed)
    network, _, optimizer, sample = models.conv_net()
    return network, SupCon(), optimizer, sample


# ------------------------------------------------------------------------------------------- in the fresh process
def measure(contender: str, k: int):
    """(peak RSS growth, trainable bytes) of `contender` training two windows, here."""
    import mindspore.dataset as ds
    from mindspore import nn
    from ms_accum import GradientAccumulation
    from ms_accum.tools.planner import process_status
    from ms_accum.train.options import QUIET
    from .common import over, setup
    setup()
    net, loss, opt, sample = _parts()
    micro = GLOBAL_BATCH // k
    x, y = sample(GLOBAL_BATCH * WINDOWS)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(
        GLOBAL_BATCH if contender == "one_kb" else micro, drop_remainder=True)
    start = process_status("VmRSS")
    if contender == "cached":
        GradientAccumulation(net, loss, opt, structure="cached").train_process(1, dataset, k, checkpoints=None,
                                                                               log=QUIET)
    else:
        over(dataset, nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train())(0)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in net.trainable_params()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=list(CONTENDERS))
    parser.add_argument("k", type=int)
    args = parser.parse_args(argv)
    peak, params = measure(args.contender, args.k)
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)


# ---------------------------------------------------------------------------------------------------- the tables
def memory(ks=KS, repeats: int = 3, log: Optional[Callable[[str], None]] = None) -> List[dict]:
    """The median peak over `repeats` fresh processes of every (K, contender); the K·B step is measured once."""
    def figure(contender: str, k: int) -> dict:
        if log:
            log(f"   cached: {contender} K={k}")
        peaks = [fresh_process(["-m", "benchmarks.cached", contender, str(k)])["peak"] for _ in range(repeats)]
        return {"contender": contender, "k": k, "peak": statistics.median(peaks), "peaks": peaks}

    big = figure("one_kb", ks[0])
    return [row for k in ks for row in (figure("one_b", k), {**big, "k": k}, figure("cached", k))]


def render_memory(rows: List[dict]) -> str:
    lines = [f"== cached memory. peak RSS growth over two windows of a supervised-contrastive conv net (K x B = "
             f"{GLOBAL_BATCH}, 3x96x96; median of {len(rows[0]['peaks'])} fresh process(es) per figure)",
             f"   goal: structure='cached' <= {MEMORY_GOAL} x one B step (the window's outputs are {GLOBAL_BATCH} x 10 "
             f"floats); '!!' marks a figure above it",
             f"   {'K x B':>7}{'one B MiB':>11}{'one K·B MiB':>13}{'cached MiB':>12}{'cached / one B':>16}"
             f"{'one K·B / one B':>17}"]
    for k in dict.fromkeys(r["k"] for r in rows):
        group = {r["contender"]: r["peak"] for r in rows if r["k"] == k}
        ratio = group["cached"] / group["one_b"]
        lines.append(f"   {f'{k}x{GLOBAL_BATCH // k}':>7}{group['one_b'] / MIB:>11.0f}{group['one_kb'] / MIB:>13.0f}"
                     f"{group['cached'] / MIB:>12.0f}{ratio:>13.2f}{' !!' if ratio > MEMORY_GOAL else '   '}"
                     f"{group['one_kb'] / group['one_b']:>17.2f}")
    return "\n".join(lines)


def speed(k: int = 4, rounds: int = 5, windows: int = 2, warmup: int = 1) -> Table:
    """ms per window: the cached window against one K·B step, on pre-loaded tensors."""
    from mindspore import Tensor, nn
    from ms_accum.graphs import TrainCachedWindowCell
    from .common import setup, sync
    setup()
    net, loss, opt, sample = _parts()
    big_net, big_loss, big_opt, _ = _parts()
    x, y = sample(GLOBAL_BATCH)
    micro = GLOBAL_BATCH // k
    window = [(Tensor(x[i * micro:(i + 1) * micro]), Tensor(y[i * micro:(i + 1) * micro])) for i in range(k)]
    cell = TrainCachedWindowCell(net, loss, opt).set_train()
    step = nn.TrainOneStepCell(nn.WithLossCell(big_net, big_loss), big_opt).set_train()
    big = (Tensor(x), Tensor(y))

    def cached(n: int) -> None:
        for _ in range(n):
            sync(cell.train_window(window)[0])

    def one_kb(n: int) -> None:
        for _ in range(n):
            sync(step(*big))

    names = {"one K·B step": one_kb, f"structure='cached' ({k} x {micro})": cached}
    table = Table("cached time", f"conv net, supervised contrastive, global batch {GLOBAL_BATCH}", "window",
                  reference=None, rows=interleave(names, rounds, windows, warmup))
    table.note_goal([(f"structure='cached' ({k} x {micro})", "one K·B step")], TIME_GOAL)
    return table


if __name__ == "__main__":
    main()

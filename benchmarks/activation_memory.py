"""Section m: activation memory. Peak memory of each structure as a multiple of one micro-batch's step.

    python -m benchmarks.activation_memory NET CONTENDER K [--partial] [--ramp]     (one measurement)

Accumulation exists so that a window of K micro-batches of B costs about one B step's memory, not one K·B
step's. Each measurement runs in a fresh process and prints ``PEAK <bytes> PARAMS <bytes>``: the growth of the
process's peak resident memory (VmHWM) from just before the Cell is built to the end of two windows, while
training over a MindSpore dataset (`NumpySlicesDataset`) as a user does. MindSpore reports no peak device memory
on CPU (`mindspore.runtime.max_memory_allocated()` answers 0 there), so RSS is the measure.

Networks, both activation-heavy and parameter-light (SGD, graph mode, global batch K·B = 32):
- ``conv``: four 3x3 convolutions of 32 channels on 3x96x96 images, global average pooling, a dense head;
- ``transformer``: the Shakespeare tutorial's model (`ms_accum.CharTransformer`: character embedding, learned
  positions, 2 causal `nn.TransformerEncoderLayer` blocks, d=64, 4 heads) on sequences of 256, its longest bucket,
  with its loss (`TokenCrossEntropy`; the executor's windows token-weighted).

Contenders: ``one_b`` / ``one_kb`` (`nn.TrainOneStepCell` on B, on K·B), ``window`` / ``fused`` /
``three_graphs`` (the executor forced to that structure), ``executor`` (its default, ``"auto"``), and
``accumulator`` (the `Accumulator` in an `@ms.jit` step). ``--partial`` adds one micro-batch after the two windows,
so the run ends with a partial window, as an epoch does whose micro-batches K does not divide; ``--ramp`` gives the
executor the schedule ``{0: K/2, K·B: K}`` (two windows of K/2, then one of K, a batch ramp-up).
"""
from __future__ import annotations

import argparse
import statistics
from typing import List

import numpy as np

from .common import peak_in_fresh_process

NETS = ("conv", "transformer")
CONTENDERS = ("one_b", "one_kb", "window", "fused", "three_graphs", "executor", "accumulator")
STRUCTURES = ("window", "fused", "three_graphs")
GLOBAL_BATCH = 32
WINDOWS = 2
GOAL = 1.15  # x the one-B step's growth, plus the buffer (1x the parameters)
VOCAB, SEQ, WIDTH = 65, 256, 64


def build(net_name: str):
    """(network, loss, reduction, numpy inputs, numpy labels) for `net_name`; the data is GLOBAL_BATCH * WINDOWS
    samples."""
    import mindspore as ms
    from mindspore import nn
    rng = np.random.default_rng(0)
    n = GLOBAL_BATCH * WINDOWS
    ms.set_seed(0)
    if net_name == "conv":
        class ConvNet(nn.Cell):
            def __init__(self):
                super().__init__()
                layers = []
                for channels in (3, 32, 32, 32):
                    layers += [nn.Conv2d(channels, 32, 3), nn.ReLU()]
                self.body = nn.SequentialCell(layers)
                self.head = nn.Dense(32, 10)

            def construct(self, x):
                return self.head(self.body(x).mean(axis=(2, 3)))

        x = rng.standard_normal((n, 3, 96, 96)).astype(np.float32)
        y = rng.integers(0, 10, (n,)).astype(np.int32)
        return ConvNet(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), "mean", x, y

    from ms_accum import TokenCrossEntropy
    from ms_accum.demo.models import CharTransformer
    # The Shakespeare tutorial's model and loss, on its longest bucket (every position a real character).
    x = rng.integers(0, VOCAB, (n, SEQ)).astype(np.int32)
    y = rng.integers(0, VOCAB, (n, SEQ)).astype(np.int32)
    return CharTransformer(VOCAB, WIDTH, 4, 2, SEQ), TokenCrossEntropy(), "weighted_mean", x, y


def factory(net_name: str):
    """`net_name`'s network, loss and SGD optimizer with ``sample(n)``, as `ms_accum.plan` takes a model."""
    from mindspore import nn
    net, loss, _, x, y = build(net_name)

    def sample(n: int):
        reps = -(-n // len(x))
        return np.concatenate([x] * reps)[:n], np.concatenate([y] * reps)[:n]

    return net, loss, nn.SGD(net.trainable_params(), 0.01), sample


def conv_model():
    """The conv net as a factory (``benchmarks.activation_memory:conv_model``)."""
    return factory("conv")


def transformer_model():
    """The CharTransformer as a factory (``benchmarks.activation_memory:transformer_model``)."""
    return factory("transformer")


def measure(net_name: str, contender: str, k: int, partial: bool = False, ramp: bool = False):
    """Peak RSS growth (bytes) and trainable bytes of one contender, in this (fresh) process; `partial`: one more
    micro-batch after the two windows; `ramp`: the executor's K ramped from K/2 to K."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from .peak_memory import status
    from .steps import jit_accumulator_step
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    net, loss, reduction, x, y = build(net_name)
    params = sum(p.nbytes for p in net.trainable_params())
    opt = nn.SGD(net.trainable_params(), 0.01)
    micro = GLOBAL_BATCH // k
    batch = GLOBAL_BATCH if contender == "one_kb" else micro
    if partial:
        x, y = np.concatenate([x, x[:micro]]), np.concatenate([y, y[:micro]])
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=True)
    start = status("VmRSS")
    if contender in STRUCTURES or contender == "executor":
        from ms_accum import GradientAccumulation
        structure = "auto" if contender == "executor" else contender
        GradientAccumulation(net, loss, opt, reduction=reduction, structure=structure).train_process(
            1, dataset, {0: k // 2, GLOBAL_BATCH: k} if ramp else k, ckpt_dir=None, verbose=False)
        return status("VmHWM") - start, params
    if reduction == "weighted_mean":  # the plain steps take the loss alone
        from ms_accum import LossOnly
        loss = LossOnly(loss)
    if contender == "accumulator":
        step = jit_accumulator_step(net, loss, opt, k)
        for data, label in dataset.create_tuple_iterator():
            out = step(data, label)
        out.asnumpy()
    else:
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
        for data, label in dataset.create_tuple_iterator():
            out = cell(data, label)
        out.asnumpy()
    return status("VmHWM") - start, params


def table(ks=(4, 8, 16), nets=NETS, repeats: int = 1, log=None) -> List[dict]:
    """Rows {net, k, contender, peak (median over `repeats` processes), peaks, params}."""
    rows = []
    for net_name in nets:
        for k in ks:
            for contender in CONTENDERS:
                if contender == "one_kb" and k != ks[0]:  # the same K·B step for every K
                    rows.append({**next(r for r in rows if r["net"] == net_name and r["contender"] == "one_kb"),
                                 "k": k})
                    continue
                if log:
                    log(f"   m: {net_name} K={k} {contender}")
                runs = [peak_in_fresh_process("activation_memory", net_name, contender, str(k))
                        for _ in range(repeats)]
                peaks = [r["peak"] for r in runs]
                rows.append({"net": net_name, "k": k, "contender": contender, "peak": statistics.median(peaks),
                             "peaks": peaks, "params": runs[0]["params"]})
    return rows


def render(rows: List[dict]) -> str:
    lines = [f"== m. activation memory: peak RSS growth while training 2 windows over a dataset, as a multiple of "
             f"one B step's (K x B = {GLOBAL_BATCH}; one fresh process per figure, median of "
             f"{len(rows[0]['peaks'])}); goal for what 'auto' may pick: <= {GOAL} x one B + the buffer",
             f"   {'net':<12}{'K x B':>7}{'one B MiB':>11}" + "".join(f"{c:>14}" for c in CONTENDERS[1:])]
    for (net_name, k) in dict.fromkeys((r["net"], r["k"]) for r in rows):
        group = {r["contender"]: r for r in rows if r["net"] == net_name and r["k"] == k}
        one_b = group["one_b"]["peak"]
        limit = GOAL * one_b + group["one_b"]["params"]
        cells = []
        for contender in CONTENDERS[1:]:
            peak = group[contender]["peak"]
            mark = "" if contender == "one_kb" else (" ok" if peak <= limit else " !!")
            cells.append(f"{peak / one_b:>11.2f}{mark:<3}")
        lines.append(f"   {net_name:<12}{f'{k}x{GLOBAL_BATCH // k}':>7}{one_b / 2**20:>11.0f}" + "".join(cells))
    lines.append("   ok / !!: within / above the goal. Noise: the same configuration in repeated processes moved by "
                 "up to about 0.15 x one B step here (MindSpore's CPU runtime runs independent kernels on a thread "
                 "pool); 'peaks' in results.json has every run.")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("net", choices=NETS)
    parser.add_argument("contender", choices=CONTENDERS)
    parser.add_argument("k", type=int)
    parser.add_argument("--partial", action="store_true", help="end with a partial window of one micro-batch")
    parser.add_argument("--ramp", action="store_true", help="the executor's K ramped from K/2 to K")
    args = parser.parse_args(argv)
    peak, params = measure(args.net, args.contender, args.k, args.partial, args.ramp)
    print(f"PEAK {peak} PARAMS {params}", flush=True)


if __name__ == "__main__":
    main()

"""Peak memory of one training configuration, measured in this fresh process; prints one JSON line
``{"peak": <bytes>, "params": <bytes>}``.

    python tests/memory_scripts/peak.py FACTORY CONTENDER K [--option NAME] [--partial] [--ramp]

FACTORY names a network of `ms_accum.demo.models` (``conv_net``: activation-heavy; ``wide_mlp``: parameter-heavy).
Two windows of K micro-batches, global batch 32, are trained over a MindSpore dataset of the factory's samples, as a
user trains. CONTENDER is ``one_b`` or ``one_kb`` (plain `nn.TrainOneStepCell` steps on B = 32 / K, or on K·B = 32)
or a structure of the executor (``auto``, ``three_graphs``, ``fused``, ``window``). The peak is the growth of the
process's peak resident memory (VmHWM) from just before the Cell or the executor is built; `params` the trainable
bytes.

--option adds one executor option that touches every gradient: ``statistics``, ``clip`` (clip_norm=1.0),
``skip_microbatch`` (the policy) or ``outliers`` (skip_outliers=6). --partial trains one micro-batch more after the
two windows (an epoch that K does not divide ends with a partial window); --ramp gives the executor the schedule
``{0: K/2, 32: K}`` (two windows of K/2, then one of K).
"""
import argparse
import json

import ms_accum  # noqa: F401  (before MindSpore: oneDNN's CPU ISA is chosen when MindSpore loads)
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation, set_device
from ms_accum.demo import models
from ms_accum.tools.planner import process_status

GLOBAL_BATCH, WINDOWS = 32, 2
OPTIONS = {"statistics": {"statistics": True}, "clip": {"clip_norm": 1.0},
           "skip_microbatch": {"policy": "skip_microbatch"}, "outliers": {"skip_outliers": 6.0}}


def measure(factory: str, contender: str, k: int, option=None, partial=False, ramp=False):
    set_device("CPU")
    net, loss, opt, sample = getattr(models, factory)()
    micro = GLOBAL_BATCH // k
    x, y = sample(GLOBAL_BATCH * WINDOWS + (micro if partial else 0))
    batch = GLOBAL_BATCH if contender == "one_kb" else micro
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=True)
    start = process_status("VmRSS")
    if contender in ("one_b", "one_kb"):
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
        for data, label in dataset.create_tuple_iterator():
            out = cell(data, label)
        out.asnumpy()
    else:
        executor = GradientAccumulation(net, loss, opt, structure=contender, **OPTIONS.get(option, {}))
        executor.train_process(1, dataset, {0: k // 2, GLOBAL_BATCH: k} if ramp else k, ckpt_dir=None,
                               verbose=False)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in net.trainable_params()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("factory", choices=("conv_net", "wide_mlp"))
    parser.add_argument("contender", choices=("one_b", "one_kb", "auto", "three_graphs", "fused", "window"))
    parser.add_argument("k", type=int)
    parser.add_argument("--option", choices=sorted(OPTIONS))
    parser.add_argument("--partial", action="store_true")
    parser.add_argument("--ramp", action="store_true")
    args = parser.parse_args()
    peak, params = measure(args.factory, args.contender, args.k, args.option, args.partial, args.ramp)
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)


if __name__ == "__main__":
    main()

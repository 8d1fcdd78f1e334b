"""Peak memory of a real-size, parameter-heavy training at B=1, K=4, measured in this fresh process; prints one JSON
line ``{"peak": <bytes>, "params": <bytes>}``.

    python tests/memory_scripts/real_size.py OPTIMIZER CONTENDER

The network is `ms_accum.demo.models.deep_mlp` (12 x Dense(2048, 2048), 192 MiB of float32 parameters) with OPTIMIZER
(``sgd``, ``momentum`` or ``adamw``); two windows of four micro-batches of one sample are trained over a MindSpore
dataset. CONTENDER is ``one_b`` (plain `nn.TrainOneStepCell` steps on each micro-batch) or a structure of the
executor (``three_graphs``, ``fused``, ``window``). The peak is the growth of the process's peak resident memory
(VmHWM) from just before the Cell or the executor is built (the optimizer's state is allocated by its first step, so
it is inside); `params` the trainable bytes.
"""
import argparse
import json

import ms_accum  # noqa: F401  (before MindSpore: oneDNN's CPU ISA is chosen when MindSpore loads)
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation, set_device
from ms_accum.demo import models
from ms_accum.tools.planner import process_status

K, WINDOWS = 4, 2


def measure(optimizer: str, contender: str):
    set_device("CPU")
    net, loss, opt, sample = models.deep_mlp(optimizer)
    x, y = sample(K * WINDOWS)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(1, drop_remainder=True)
    start = process_status("VmRSS")
    if contender == "one_b":
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
        for data, label in dataset.create_tuple_iterator():
            out = cell(data, label)
        out.asnumpy()
    else:
        GradientAccumulation(net, loss, opt, structure=contender).train_process(1, dataset, K, ckpt_dir=None,
                                                                                verbose=False)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in net.trainable_params()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("optimizer", choices=models.REAL_SIZE_OPTIMIZERS)
    parser.add_argument("contender", choices=("one_b", "three_graphs", "fused", "window"))
    args = parser.parse_args()
    peak, params = measure(args.optimizer, args.contender)
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)


if __name__ == "__main__":
    main()

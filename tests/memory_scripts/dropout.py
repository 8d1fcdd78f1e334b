"""Peak memory of training a dropout-heavy BERT-shaped encoder, measured in this fresh process; prints one JSON line
``{"peak": <bytes>, "params": <bytes>}``.

    python tests/memory_scripts/dropout.py CONTENDER DROPOUT LAYERS SEQ

The network is `ms_accum.demo.models.encoder` (width 768, LAYERS layers, sequences of SEQ tokens, dropout 0.1 on the
embeddings, every attention probability and every block's output) with AdamW, micro-batch 1. CONTENDER is ``plain``
(two `nn.TrainOneStepCell` steps in training mode) or a structure of the executor (``three_graphs``, ``fused``,
``window``: two windows of K=4); DROPOUT is ``kernel`` (MindSpore's own dropout), ``seeded`` (ms_accum's streams;
the executor always draws from them) or ``none`` (every rate set to 0: what dropout adds is measured against it).
The peak is the growth of the process's peak resident memory (VmHWM) from just before the Cell or the executor is
built; `params` the trainable bytes.
"""
import contextlib
import json
import sys

import ms_accum  # noqa: F401  (before MindSpore: oneDNN's CPU ISA is chosen when MindSpore loads)
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation, set_device
from ms_accum.core.dropout import DropoutStreams
from ms_accum.demo import models
from ms_accum.tools.planner import process_status
from ms_accum.train.options import QUIET

K, WINDOWS = 4, 2


def measure(contender: str, dropout: str, layers: int, seq: int):
    set_device("CPU")
    ms.set_seed(0)
    net, loss, opt, sample = models.encoder("adamw", layers=layers, seq=seq)
    x, y = sample(K * WINDOWS)
    if dropout == "none":
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.Dropout):
                cell.p, cell.keep_prob = 0.0, 1.0  # nn.Dropout then returns its input
    start = process_status("VmRSS")
    if contender == "plain":
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
        with DropoutStreams(net).drawing() if dropout == "seeded" else contextlib.nullcontext():
            for i in range(2):
                out = cell(ms.Tensor(x[i:i + 1]), ms.Tensor(y[i:i + 1]))
            out.asnumpy()
    else:
        dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(1)
        GradientAccumulation(net, loss, opt, structure=contender).train_process(1, dataset, K, checkpoints=None,
                                                                                log=QUIET)
    return process_status("VmHWM") - start, int(sum(p.nbytes for p in net.trainable_params()))


if __name__ == "__main__":
    contender, dropout, layers, seq = sys.argv[1:5]
    peak, params = measure(contender, dropout, int(layers), int(seq))
    print(json.dumps({"peak": int(peak), "params": params}), flush=True)

"""A short training of a network with dropout through `GradientAccumulation`, with whatever kernel cache, compiler and
``PATH`` the environment gives (test_dropout.py: the kernel cache's faults, each in a process of its own, since a bad
library kills the process that loads it).

    python tests/fault_scripts/kernel_cache.py

The executor is built twice (a warning said once per process is said once), and the second trains one epoch of 3
micro-batches of 8, K=3, from weights and data seeded alike in every run: with ms_accum's seeded dropout two runs end
with the same parameters exactly. Prints one JSON line: how many `nn.Dropout` cells drew from ms_accum's streams
(``seeded``), the optimizer steps taken, the final parameters, and every warning's message.
"""
import json
import warnings

import numpy as np

import ms_accum  # noqa: F401  (before MindSpore: oneDNN's CPU ISA is chosen when MindSpore loads)
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation, set_device
from ms_accum.train.options import QUIET

K, BATCH = 3, 8


def main() -> None:
    set_device("CPU")
    ms.set_seed(0)
    ds.config.set_seed(0)
    net = nn.SequentialCell([nn.Dense(20, 32), nn.ReLU(), nn.Dropout(p=0.3), nn.Dense(32, 4), nn.Dropout(p=0.1)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((K * BATCH, 20)).astype(np.float32),
            "y": rng.integers(0, 4, K * BATCH).astype(np.int32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            executor = GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), 0.1))
        result = executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(BATCH), K, log=QUIET)
    print(json.dumps({"seeded": len(executor.dropout), "steps": len(result.steps),
                      "params": [p.asnumpy().tolist() for p in net.trainable_params()],
                      "warnings": [str(w.message) for w in caught]}))


if __name__ == "__main__":
    main()

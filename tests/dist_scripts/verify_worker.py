"""One msrun worker of tests/test_verify.py: `verify_equivalence` on the data-parallel window.

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True verify_worker.py OUT_DIR

Each rank verifies every structure on its share of each micro-batch (the same global batch on every rank), shares of
unequal size, the sharded optimizer, a dropout network, and the host's reduction broken on purpose (`Closer.all_reduce` reduces nothing);
OUT_DIR/verify_rank<r>.json holds each report's verdict lines, whether it passed, its ranks and its reference.
"""
import json
import os
import sys

from ms_accum.train.distributed import init_data_parallel  # first: msrun runs this script as the scheduler too

PARALLEL = init_data_parallel()

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

from ms_accum import verify_equivalence  # noqa: E402
from ms_accum.train.structures import base  # noqa: E402


def network(dropout: float = 0.0) -> nn.Cell:
    ms.set_seed(0)
    cells = [nn.Dense(8, 16), nn.ReLU()] + ([nn.Dropout(p=dropout)] if dropout else []) + [nn.Dense(16, 3)]
    return nn.SequentialCell(cells)


def verify(net: nn.Cell, samples: int = 18, **options) -> dict:
    # The same global batch on every rank; 18 samples make shares of 3 and 2 (the window weighs them by their samples),
    # 16 equal shares, which gradient caching's gather of the ranks' outputs needs.
    rng = np.random.default_rng(0)
    batch = rng.standard_normal((samples, 8)).astype(np.float32), rng.integers(0, 3, samples).astype(np.int32)
    report = verify_equivalence(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                nn.Momentum(net.trainable_params(), 0.1, 0.9), batch, 4, **options)
    return {"passed": report.passed, "text": str(report), "ranks": report.ranks, "reference": report.reference,
            "first_failed_window": report.first_failed_window,
            "structures": {name: each.passed for name, each in report.by_structure.items()}}


def main(out_dir: str) -> None:
    results = {"all": verify(network(), 16, structure="all"),
               "unequal": verify(network(), structure="window"),
               "sharded": verify(network(), shard_optimizer=True),
               "dropout": verify(network(0.3), structure="fused")}
    real = base.Closer.all_reduce
    base.Closer.all_reduce = lambda self, buckets: None  # each rank applies its own share's window
    results["unreduced"] = verify(network())
    base.Closer.all_reduce = real
    with open(os.path.join(out_dir, f"verify_rank{PARALLEL.rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])

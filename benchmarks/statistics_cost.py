"""Section s: what measuring the window costs per micro-batch (ms_accum.statistics).

    python -m benchmarks.statistics_cost [--rounds N]

The executor's buffer measures every micro-batch's gradient norm in its graph (one sum of squares per parameter
tensor, added); an outlier filter also keeps running statistics and masks the gradient. Each table times one
`TrainAccumulationCell` micro-step (K=4, Momentum) on pre-loaded tensors with the buffer's statistics off (the
baseline), on, and with `skip_outliers`, interleaved in rounds. Target: at most 1.02x. Networks: LeNet5 on b32 (the
tutorial's) and section m's activation-heavy conv net on b8 (3x96x96).

Memory: statistics add no buffer, a scalar Parameter (the window's squared norm; the outlier filter's running
statistics are 5 more floats), counted in `tests/test_statistics.py`.
"""
from __future__ import annotations

import argparse

import numpy as np

from .common import BATCH, K, Table, cycle_calls, interleave, lenet, setup_mindspore

CONTENDERS = {"statistics off (AccumulationBuffer's default)": {},
              "statistics on (the executor's)": {"statistics": True},
              "statistics and skip_outliers=6": {"skip_outliers": 6.0, "outlier_warmup": 10 ** 6}}
BASELINE = next(iter(CONTENDERS))


def _cell(build, settings):
    from mindspore import nn
    from ms_accum import AccumulationBuffer, TrainAccumulationCell
    net, loss, opt = build()
    buffer = AccumulationBuffer(opt.parameters, **settings)
    return TrainAccumulationCell(nn.WithLossCell(net, loss), opt, K, buffer=buffer).set_train()


def _conv():
    """Section m's conv net with the LeNet5 setup's loss and optimizer."""
    import mindspore as ms
    from mindspore import nn
    from .activation_memory import build
    net, loss, _, _, _ = build("conv")
    for param in net.trainable_params():  # unique names, as `lenet` gives them
        param.name = f"conv{id(net)}.{param.name}"
    ms.set_seed(0)
    return net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9)


def cost(rounds: int, calls: int):
    """The two tables: LeNet5 b32 and the conv net b8."""
    from mindspore import Tensor
    rng = np.random.default_rng(0)
    tables = []
    for key, title, build, shape, batch in (
            ("s1", "statistics per micro-batch, LeNet5 b32", lenet, (1, 32, 32), BATCH),
            ("s2", "statistics per micro-batch, section m's conv net b8 (3x96x96)", _conv, (3, 96, 96), 8)):
        inputs = [(Tensor(rng.standard_normal((batch, *shape)).astype(np.float32)),
                   Tensor(rng.integers(0, 10, batch).astype(np.int32))) for _ in range(8)]
        table = Table(key, title, f"one micro-batch of {batch}", batch, BASELINE, "<= 1.02",
                      [name for name in CONTENDERS if name != BASELINE])
        table.rows = interleave({name: cycle_calls(_cell(build, settings), inputs)
                                 for name, settings in CONTENDERS.items()}, rounds, calls)
        table.notes.append("TrainAccumulationCell (structure 'fused'), K=4, one call per micro-batch; the outlier "
                           "filter judges every micro-batch but, with its warm-up never reached, leaves none out.")
        tables.append(table)
    return tables


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=32, help="micro-batches per round")
    args = parser.parse_args(argv)
    setup_mindspore()
    for table in cost(args.rounds, args.calls):
        print(table.render(), flush=True)


if __name__ == "__main__":
    main()

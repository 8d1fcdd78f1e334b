"""Errors name what the user called: `For 'Accumulator', ...`, `For 'GradientAccumulation', ...`,
`For 'GradientAccumulation.train_process', ...`, never a class or helper built inside it (the buffer, its guard, the
schedule, a Cell of the executor's). Each case checks the whole message."""
import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import Accumulator, GradientAccumulation, TrainForwardBackward, plan, verify_equivalence
from ms_accum.core import AccumulationBuffer
from ms_accum.graphs import TrainAccumulationCell
from ms_accum import Plan, SamplesLR
from ms_accum.train.schedule import parse_schedule
from conftest import raises_exactly

REDUCTIONS = "['mean', 'sum', 'weighted_mean']"
POLICIES = "['skip_window', 'skip_microbatch']"


class Parts:
    """A small network with its loss and optimizer, a dataset of 8 samples in batches of 2, and the executor."""

    def __init__(self):
        self.net = nn.Dense(3, 2)
        self.loss = nn.MSELoss()
        self.opt = nn.SGD(self.net.trainable_params(), 0.1)
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((8, 3)).astype(np.float32)
        self.y = rng.standard_normal((8, 2)).astype(np.float32)
        self.dataset = ds.NumpySlicesDataset({"x": self.x, "y": self.y}, shuffle=False).batch(2)

    def executor(self, **kwargs):
        return GradientAccumulation(self.net, self.loss, self.opt, **kwargs)

    def with_loss(self):
        return nn.WithLossCell(self.net, self.loss)


CASES = [
    ("executor-recompute-str", lambda p: p.executor(recompute="conv1"), TypeError,
     "For 'GradientAccumulation', the argument 'recompute' must be a list of cell paths, e.g. ['conv1'], but got the "
     "str 'conv1'."),
    ("accumulator-reduction", lambda p: Accumulator(p.opt, 4, reduction="avg"), ValueError,
     f"For 'Accumulator', the argument 'reduction' must be one of {REDUCTIONS}, but got 'avg'."),
    ("accumulator-step", lambda p: Accumulator(p.opt, 0), ValueError,
     "For 'Accumulator', the argument 'accumulate_step' must be a positive int, but got 0."),
    ("executor-policy", lambda p: p.executor(policy="bad"), ValueError,
     f"For 'GradientAccumulation', the argument 'policy' must be one of {POLICIES}, but got 'bad'."),
    ("executor-loss-scaler", lambda p: p.executor(loss_scaler=1024.0), TypeError,
     "For 'GradientAccumulation', the argument 'loss_scaler' must be StaticLossScaler or DynamicLossScaler, but got "
     "1024.0 of type float."),
    ("executor-reduction", lambda p: p.executor(reduction="avg"), ValueError,
     f"For 'GradientAccumulation', the argument 'reduction' must be one of {REDUCTIONS}, but got 'avg'."),
    ("executor-skip-outliers", lambda p: p.executor(skip_outliers=-1), ValueError,
     "For 'GradientAccumulation', the argument 'skip_outliers' must be a positive float, but got -1."),
    ("executor-outlier-warmup", lambda p: p.executor(skip_outliers=6.0, outlier_warmup=-1), ValueError,
     "For 'GradientAccumulation', the argument 'outlier_warmup' must be a non-negative int, but got -1."),
    ("executor-buffer-dtype", lambda p: p.executor(buffer_dtype=ms.int32), TypeError,
     "For 'GradientAccumulation', the argument 'buffer_dtype' must be a float mindspore.dtype (mindspore.float32, "
     "float16, bfloat16 or float64) or None, but got mindspore.int32."),
    ("executor-recompute", lambda p: p.executor(recompute=["layer9"]), ValueError,
     "For 'GradientAccumulation', the argument 'recompute' must hold sub-cells of the network, but got 'layer9'; "
     "valid paths: []."),
    ("fused-cell-policy", lambda p: TrainAccumulationCell(p.with_loss(), p.opt, 4, policy="bad"), ValueError,
     f"For 'TrainAccumulationCell', the argument 'policy' must be one of {POLICIES}, but got 'bad'."),
    ("fused-cell-loss-scaler", lambda p: TrainAccumulationCell(p.with_loss(), p.opt, 4, loss_scaler=1024.0),
     TypeError, "For 'TrainAccumulationCell', the argument 'loss_scaler' must be StaticLossScaler or "
                "DynamicLossScaler, but got 1024.0 of type float."),
    # TrainForwardBackward takes its loss scaler with its buffer: the buffer, which the user builds, names itself.
    ("forward-backward-loss-scaler",
     lambda p: TrainForwardBackward(p.with_loss(), p.opt, AccumulationBuffer(p.opt.parameters, loss_scaler=1024.0)),
     TypeError, "For 'AccumulationBuffer', the argument 'loss_scaler' must be StaticLossScaler or DynamicLossScaler, "
                "but got 1024.0 of type float."),
    ("forward-backward-buffer", lambda p: TrainForwardBackward(p.with_loss(), p.opt, None), TypeError,
     "For 'TrainForwardBackward', the argument 'buffer' must be AccumulationBuffer, but got None of type NoneType."),
    ("train-process-schedule", lambda p: p.executor().train_process(1, p.dataset, {0: 2, 10: 0}, ckpt_dir=None),
     ValueError, "For 'GradientAccumulation.train_process', the argument 'mini_steps[10]' must be a positive int, "
                 "but got 0."),
    ("train-process-partial-window",
     lambda p: p.executor().train_process(1, p.dataset, 4, partial_window="x", ckpt_dir=None), ValueError,
     "For 'GradientAccumulation.train_process', the argument 'partial_window' must be one of ['apply', 'drop'], but "
     "got 'x'."),
    ("train-process-callable-schedule",
     lambda p: p.executor().train_process(1, p.dataset, lambda samples: 0, ckpt_dir=None), ValueError,
     "For 'GradientAccumulation.train_process', the argument 'mini_steps(0)' must be a positive int, but got 0."),
    ("verify-reduction", lambda p: verify_equivalence(p.net, p.loss, p.opt, (p.x, p.y), 2, reduction="avg"),
     ValueError, f"For 'verify_equivalence', the argument 'reduction' must be one of {REDUCTIONS}, but got 'avg'."),
    ("plan-global-batch", lambda p: plan("mod:fn", global_batch=0), ValueError,
     "For 'plan', the argument 'global_batch' must be a positive int, but got 0."),
    ("plan-output-directory", lambda p: plan("mlp", 64, output="/"), ValueError,
     "For 'plan', the argument 'output' must be a file path that can be written, but got '/', a directory."),
    ("plan-check-fits-ranks",
     lambda p: Plan("mlp", 16, 2, 4, 2, "fused", "mean", 1.0, None, 9.0, 1.0, 1.0, "CPU").check_fits(p.net, 1),
     ValueError, "For 'Plan.check_fits', the plan for 'mlp' was made for 2 rank(s) (a global batch of 16 = K 2 x B 4 x "
                 "2 rank(s)), but this run has 1: plan again for 1 rank(s)."),
    ("parse-schedule-threshold-twice", lambda p: parse_schedule("0:2,100:4,100:8"), ValueError,
     "For 'parse_schedule', the argument 'text' must give each threshold once, but got 100 twice in "
     "'0:2,100:4,100:8'."),
    ("samples-lr-class", lambda p: SamplesLR(nn.WarmUpLR), TypeError,
     "For 'SamplesLR', the argument 'schedule' must be a LearningRateSchedule or a callable lr(samples), but got the "
     "class mindspore.nn.learning_rate_schedule.WarmUpLR: give an instance of it, e.g. WarmUpLR(...)."),
]


@pytest.mark.parametrize("call,error,message", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_the_error_names_what_the_user_called(call, error, message):
    parts = Parts()
    before = [p.asnumpy().copy() for p in parts.net.trainable_params()]
    with raises_exactly(error, message):
        call(parts)
    assert all(np.array_equal(b, p.asnumpy()) for b, p in zip(before, parts.net.trainable_params()))

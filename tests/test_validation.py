"""Validation during training: scores on held-out data every N optimizer steps, the best checkpoint, early stopping
that resumes (`ms_accum.train.validation`)."""
import os

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Accuracy

from ms_accum import GradientAccumulation
from ms_accum.train.checkpoint import load_checkpoint
from ms_accum.train.options import QUIET, Checkpoints, LogOptions
from ms_accum.train.validation import Validation
from conftest import raises_exactly

B, K = 8, 2


def data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    return {"x": x, "y": (x[:, 0] > 0).astype(np.int32)}


def executor():
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(6, 16), nn.ReLU(), nn.Dropout(p=0.2), nn.Dense(16, 2)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, loss, GradientAccumulation(net, loss, nn.Momentum(net.trainable_params(), 0.1, 0.9))


def held_out():
    return ds.NumpySlicesDataset(data(40, 1), shuffle=False).batch(B)


def train_set():
    return ds.NumpySlicesDataset(data(128, 0), shuffle=False).batch(B)  # 16 batches: 8 windows an epoch


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_scores_every_n_steps_and_after_the_last(tmp_path):
    net, loss, model = executor()
    seen = []  # what on_step sees: the last step's score too, though 8 is not a multiple of 3
    result = model.train_process(1, train_set(), K, checkpoints=None, eval_dataset=held_out(), eval_every=3,
                                 log=LogOptions(verbose=False, on_step=lambda r: seen.append(r.validation is not None)))
    scored = [r.step for r in result.steps if r.validation is not None]
    assert scored == [3, 6, 8] and [i for i, s in enumerate(seen, 1) if s] == scored
    scores = result.steps[-1].validation
    assert set(scores) == {"loss", "accuracy"}
    # The scores are the network's in inference mode (dropout off) over every held-out sample.
    net.set_train(False)
    x, y = data(40, 1)["x"], data(40, 1)["y"]
    logits = net(ms.Tensor(x)).asnumpy()
    assert abs(scores["accuracy"] - float((logits.argmax(-1) == y).mean())) < 1e-6
    assert abs(scores["loss"] - float(loss(ms.Tensor(logits), ms.Tensor(y)).asnumpy())) < 1e-5
    assert net.training is False  # as left by this test; training had it on
    net.set_train(True)


def test_metrics_the_best_checkpoint_and_early_stopping_that_resumes(tmp_path):
    net, _, model = executor()
    calls = []

    def stop_at_four(record):
        calls.append(record.step)
        return record.step == 4  # early stopping: the run ends after this window

    validation = Validation(every=2, metrics={"mindspore_accuracy": Accuracy()}, keep_best="loss")
    result = model.train_process(1, train_set(), K, checkpoints=Checkpoints(str(tmp_path), "run"),
                                 log=LogOptions(verbose=False, on_step=stop_at_four), eval_dataset=held_out(),
                                 eval_every=validation)
    assert result.stopped and calls == [1, 2, 3, 4] and [r.step for r in result.steps] == [1, 2, 3, 4]
    scores = result.steps[1].validation
    assert set(scores) == {"loss", "accuracy", "mindspore_accuracy"}
    assert abs(scores["accuracy"] - scores["mindspore_accuracy"]) < 1e-6  # MindSpore's metric agrees
    best = min((r.validation["loss"], r.step) for r in result.steps if r.validation)
    assert result.best_checkpoint == str(tmp_path / "run-best.ckpt")
    _, meta = load_checkpoint(result.best_checkpoint)
    assert meta["step"] == best[1] and abs(meta["loss"] - best[0]) < 1e-6
    assert os.path.exists(tmp_path / "run-000000004.ckpt")  # the stopped run's state, to resume from
    # Resumed, it goes on from step 4 to the end of the epoch.
    _, _, again = executor()
    resumed = again.train_process(1, train_set(), K, checkpoints=Checkpoints(str(tmp_path), "run", resume=True),
                                  log=QUIET, eval_dataset=held_out(), eval_every=validation)
    assert resumed.resumed_from.endswith("run-000000004.ckpt") and [r.step for r in resumed.steps] == [5, 6, 7, 8]
    assert resumed.best_checkpoint == str(tmp_path / "run-best.ckpt")  # the best so far, the resumed run's or before


def test_validation_arguments_are_checked_before_training():
    _, _, model = executor()
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'eval_every' needs "
                                    "'eval_dataset', but 'eval_dataset' is None."):
        model.train_process(1, train_set(), K, checkpoints=None, log=QUIET, eval_every=2)
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'eval_every' must be a "
                                    "positive int, but got 0."):
        model.train_process(1, train_set(), K, checkpoints=None, log=QUIET, eval_dataset=held_out(), eval_every=0)


class OneLogit(nn.Cell):
    """A binary classifier of this test's own: one logit a sample, as (B, 1) or, `squeezed`, (B,)."""

    def __init__(self, squeezed):
        super().__init__()
        self.dense, self.squeezed = nn.Dense(6, 1), squeezed

    def construct(self, x):
        out = self.dense(x)
        return out.squeeze(-1) if self.squeezed else out


@pytest.mark.parametrize("squeezed", [False, True])
def test_a_one_logit_binary_classifier_gets_its_accuracy(squeezed):
    ms.set_seed(0)
    net, loss = OneLogit(squeezed), nn.BCEWithLogitsLoss()
    model = GradientAccumulation(net, loss, nn.SGD(net.trainable_params(), 0.1))

    def binary(n, seed):
        columns = data(n, seed)
        y = columns["y"].astype(np.float32)
        return {"x": columns["x"], "y": y if squeezed else y[:, None]}
    result = model.train_process(1, ds.NumpySlicesDataset(binary(32, 0), shuffle=False).batch(B), K,
                                 checkpoints=None, log=QUIET,
                                 eval_dataset=ds.NumpySlicesDataset(binary(40, 1), shuffle=False).batch(B))
    scores = result.steps[-1].validation
    net.set_train(False)
    x, y = binary(40, 1)["x"], binary(40, 1)["y"]
    logits = net(ms.Tensor(x)).asnumpy()
    assert set(scores) == {"loss", "accuracy"}
    assert scores["accuracy"] == float(((logits > 0) == (y == 1)).mean())  # a logit above 0 says 1
    assert abs(scores["loss"] - float(loss(ms.Tensor(logits), ms.Tensor(y)).asnumpy())) < 1e-5

"""Files written by ms_accum 0.1 (tests/fixtures/state_v1, made by make_state_v1.py at commit 13ba68f) still resume
and evaluate: the executor's buffer was then named "grad_sum", and the loader once listed the state's names.

The fixture was written on another machine (an AVX2-only CPU). oneDNN picks its kernels by instruction set, so the same
arithmetic may round differently there: results written there are compared within a float32 tolerance, and
bit-for-bit equality is asserted only between two runs made here, in this session."""
import os
import shutil
import sys

import numpy as np
import pytest
import mindspore.dataset as ds
from mindspore import nn

from ms_accum.demo.evaluation import evaluate
from ms_accum.train.checkpoint import load_checkpoint, load_into

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
sys.path.insert(0, FIXTURES)
import make_state_v1 as v1  # noqa: E402  (the fixture's network, data and executor)

STATE = os.path.join(FIXTURES, "state_v1", "tiny-000000006.ckpt")
FINAL = os.path.join(FIXTURES, "state_v1", "tiny.ckpt")
# The resumed run makes two Momentum updates of weights of about 0.1 to 0.5. Another CPU's kernels sum in another
# order, which moves a float32 result by an ulp or two (measured: 1 of 30 weights, by 1.5e-8, on an AVX-512 CPU
# against the AVX2 one that wrote the fixture). rtol 1e-6 is about 8 ulps; atol covers the weights near 0. A wrong
# resume (another position, another buffer, lost moments) moves weights by 1e-3 or more.
CROSS_MACHINE = {"rtol": 1e-6, "atol": 1e-7}


def resume_old_state(directory) -> tuple:
    os.makedirs(directory)
    shutil.copy(STATE, directory)
    seed = ds.config.get_seed()
    ds.config.set_seed(1)  # the seed the fixture's run recorded
    try:
        net = v1.TinyNet()
        result = v1.executor(net).train_process(2, v1.dataset(), 3, ckpt_dir=str(directory), ckpt_name="tiny",
                                                save_every=2, resume=True, verbose=False)
    finally:
        ds.config.set_seed(seed)
    return net, result


def test_old_training_state_resumes_to_the_old_uninterrupted_run(tmp_path):
    net, result = resume_old_state(tmp_path / "first")
    assert result.resumed_from.endswith("tiny-000000006.ckpt")
    assert [r.step for r in result.steps] == [7, 8]
    expected, _ = load_checkpoint(FINAL)
    for p in net.trainable_params():
        np.testing.assert_allclose(p.asnumpy(), expected[p.name].asnumpy(), **CROSS_MACHINE)
    saved, meta = load_checkpoint(os.path.join(tmp_path, "first", "tiny-000000008.ckpt"))
    assert meta["kind"] == "training_state" and "accumulate.mini_step" in saved  # re-saved under today's names
    # On one machine the same resume is bit for bit the same.
    again, _ = resume_old_state(tmp_path / "second")
    for p, q in zip(net.trainable_params(), again.trainable_params()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())


def numpy_loss_and_accuracy(params, x, y) -> tuple:
    """TinyNet (Dense 6-5, ReLU, Dense 5-3) and its mean cross-entropy, in float64 numpy from the file's weights."""
    w = {name: value.asnumpy().astype(np.float64) for name, value in params.items()}
    hidden = np.maximum(x @ w["0.weight"].T + w["0.bias"], 0.0)
    logits = hidden @ w["2.weight"].T + w["2.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean()), float((logits.argmax(axis=1) == y).mean())


def test_old_checkpoints_evaluate():
    x = np.random.default_rng(1).standard_normal((12, 6)).astype(np.float32)
    y = np.arange(12, dtype=np.int32) % 3
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
    for path, step in ((FINAL, 8), (STATE, 6)):
        net = v1.TinyNet()
        meta = load_into(net, path)  # strict: the network's parameters exactly, the training state set aside
        assert meta["step"] == step
        params, _ = load_checkpoint(path)
        for p in net.trainable_params():
            np.testing.assert_array_equal(p.asnumpy(), params[p.name].asnumpy())
        result = evaluate(net, data, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        loss, accuracy = numpy_loss_and_accuracy(params, x, y)  # what the loaded weights must give
        assert result.loss == pytest.approx(loss, rel=1e-5)
        assert result.accuracy == accuracy

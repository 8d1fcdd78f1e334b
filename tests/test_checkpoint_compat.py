"""Files written by ms_accum 0.1 (tests/fixtures/state_v1, made by make_state_v1.py at commit 13ba68f) still resume
and evaluate: the executor's buffer was then named "grad_sum", and the loader once listed the state's names."""
import os
import shutil
import sys

import numpy as np
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import evaluate
from ms_accum.checkpoint import load_checkpoint, load_into

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
sys.path.insert(0, FIXTURES)
import make_state_v1 as v1  # noqa: E402  (the fixture's network, data and executor)

STATE = os.path.join(FIXTURES, "state_v1", "tiny-000000006.ckpt")
FINAL = os.path.join(FIXTURES, "state_v1", "tiny.ckpt")


def test_old_training_state_resumes_to_the_old_uninterrupted_run(tmp_path):
    shutil.copy(STATE, tmp_path)
    seed = ds.config.get_seed()
    ds.config.set_seed(1)  # the seed the fixture's run recorded
    try:
        net = v1.TinyNet()
        result = v1.executor(net).train_process(2, v1.dataset(), 3, ckpt_dir=str(tmp_path), ckpt_name="tiny",
                                                save_every=2, resume=True, verbose=False)
    finally:
        ds.config.set_seed(seed)
    assert result.resumed_from.endswith("tiny-000000006.ckpt")
    assert [r.step for r in result.steps] == [7, 8]
    expected, _ = load_checkpoint(FINAL)
    for p in net.trainable_params():  # bit for bit: today's arithmetic is 0.1's
        np.testing.assert_array_equal(p.asnumpy(), expected[p.name].asnumpy())
    saved, meta = load_checkpoint(os.path.join(tmp_path, "tiny-000000008.ckpt"))
    assert meta["kind"] == "training_state" and "accumulate.mini_step" in saved  # re-saved under today's names


def test_old_checkpoints_evaluate():
    x = np.random.default_rng(1).standard_normal((12, 6)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": np.arange(12, dtype=np.int32) % 3}, shuffle=False).batch(4)
    for path, step in ((FINAL, 8), (STATE, 6)):
        net = v1.TinyNet()
        meta = load_into(net, path)  # strict: the network's parameters exactly, the training state set aside
        assert meta["step"] == step
        params, _ = load_checkpoint(path)
        for p in net.trainable_params():
            np.testing.assert_array_equal(p.asnumpy(), params[p.name].asnumpy())
        result = evaluate(net, data, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        assert np.isfinite(result.loss) and 0.0 <= result.accuracy <= 1.0

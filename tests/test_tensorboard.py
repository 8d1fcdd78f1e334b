"""Training figures for TensorBoard (`ms_accum.train.tensorboard`, tensorboardX): what `ms-accum train --tensorboard`
and `TensorBoardLog` write, read back from the event file."""
import glob
import os
import struct

import numpy as np
import pytest
from mindspore import nn

from ms_accum import cli
from ms_accum.train.tensorboard import learning_rate_at

tensorboardX = pytest.importorskip("tensorboardX")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def scalars(logdir):
    """{tag: [(step, value), ...]} of the event files in `logdir` (TFRecord: length, its CRC, the event, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event
    found = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_the_learning_rate_is_the_one_each_update_used():
    net = nn.Dense(2, 2)
    assert learning_rate_at(nn.SGD(net.trainable_params(), 0.25), 7) == 0.25
    listed = nn.SGD(net.trainable_params(), [0.1, 0.05, 0.02])
    assert [round(learning_rate_at(listed, s), 6) for s in (1, 2, 3)] == [0.1, 0.05, 0.02]
    decay = nn.SGD(net.trainable_params(), nn.ExponentialDecayLR(0.1, 0.5, 1))  # the optimizer's step count: s - 1
    assert [round(learning_rate_at(decay, s), 6) for s in (1, 2, 3)] == [0.1, 0.05, 0.025]


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_train_writes_its_figures_for_tensorboard(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)
    code = cli.main(["train", "--model", "tokens:three_inputs", "--accumulate-step", "4", "--batch-size", "8",
                     "--ckpt-dir", str(tmp_path / "ckpt"), "--eval-every", "8", "--tensorboard", str(tmp_path / "tb"),
                     "--statistics", "--no-eval", "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    import json
    summary = json.loads(out.strip().splitlines()[-1])
    found = scalars(str(tmp_path / "tb"))
    steps = list(range(1, 17))  # 512 samples in windows of 4 x 8
    assert [s for s, _ in found["train/loss"]] == steps
    assert found["train/loss"][-1][1] == pytest.approx(summary["final_loss"], rel=1e-6)
    assert [v for _, v in found["train/accumulate_step"]] == [4.0] * 16
    assert [v for _, v in found["train/learning_rate"]] == [0.5] * 16  # the factory's Momentum(0.5)
    assert np.allclose([v for _, v in found["train/grad_norm"]], summary["grad_norm"], rtol=1e-6)
    assert [s for s, _ in found["validation/accuracy"]] == [8, 16]
    assert [v for _, v in found["validation/loss"]] == pytest.approx([v["loss"] for v in summary["validation"]])
    # A directory it cannot write is refused before training, in the command's words.
    code = cli.main(["train", "--model", "tokens:three_inputs", "--ckpt-dir", str(tmp_path / "ckpt2"),
                     "--tensorboard", str(tmp_path / "tb" / os.listdir(tmp_path / "tb")[0]), "--quiet"])
    assert code == 1 and not os.path.exists(tmp_path / "ckpt2")  # refused before the checkpoints' directory
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"ms-accum train: error: For 'ms-accum train', the argument '--tensorboard' must be a writable directory, "
        f"but '{tmp_path / 'tb' / os.listdir(tmp_path / 'tb')[0]}' is a file.")

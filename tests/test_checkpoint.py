"""Checkpoints: metadata round trip, atomic replace, strict loading, corrupt files, discovery of the newest."""
import os

import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from ms_accum.train import checkpoint as ckpt
from ms_accum.train.checkpoint import CheckpointError, load_checkpoint, load_into, save_checkpoint
from conftest import make_net, params_of, raises_exactly


def dense(out=2, seed=0):
    ms.set_seed(seed)
    return nn.Dense(3, out)


def test_round_trip_with_metadata(tmp_path):
    net = make_net("mlp")
    path = save_checkpoint(net, str(tmp_path / "a.ckpt"), {"model": "mlp", "step": 7, "lr": 0.01, "done": True})
    params, meta = load_checkpoint(path)
    assert meta == {"model": "mlp", "step": 7, "lr": pytest.approx(0.01), "done": True}
    assert set(params) == {p.name for p in net.get_parameters()}
    other = make_net("mlp", seed=1)
    assert load_into(other, path, expected={"model": "mlp"}) == meta
    for a, b in zip(params_of(other), params_of(net)):
        np.testing.assert_array_equal(a, b)
    assert os.listdir(tmp_path) == ["a.ckpt"]  # no temporary file left behind
    # Readable by the group (MindSpore's own files are 0400), and written again over itself.
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert save_checkpoint(net, path) == path and os.stat(path).st_mode & 0o777 == 0o640


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "a.ckpt")
    save_checkpoint(dense(seed=0), path, {"step": 1})

    def torn_save(save_obj, name, **kwargs):
        with open(name, "wb") as handle:
            handle.write(b"\x00" * 10)  # half a file, then the "crash"
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.ms, "save_checkpoint", torn_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(dense(seed=1), path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)[1] == {"step": 1}
    assert os.listdir(tmp_path) == ["a.ckpt"]


def test_metadata_values_must_be_plain():
    with raises_exactly(TypeError, "For 'save_checkpoint', the argument 'metadata' must map names to int, float, bool "
                                   "or str, but 'x' is list."):
        save_checkpoint(dense(), "unused.ckpt", {"x": [1]})
    assert not os.path.exists("unused.ckpt")


# What MindSpore says of each damage, after the file's name (its own wording, the path included).
CAUSES = {"random": "Failed to read the checkpoint file {path}. The file may be corrupted, and the content cannot be "
                    "parsed.",
          "truncated": "Failed to read the checkpoint file {path}. The file may be corrupted, and the content cannot "
                       "be parsed.",
          "flipped": "Failed to read the checkpoint file {path}. May not have permission to read it, please check the "
                     "correct of the file.",
          "empty": "The loaded parameter dict is empty after filter or specify, please check whether 'filter_prefix' "
                   "or 'specify_prefix' are set correctly."}


@pytest.mark.parametrize("damage", ["missing", "random", "truncated", "flipped", "empty"])
def test_unreadable_files_name_the_file(tmp_path, damage):
    path = tmp_path / "a.ckpt"
    if damage != "missing":
        save_checkpoint(dense(), str(path))
        data = path.read_bytes()
        rng = np.random.default_rng(0)
        damaged = {"random": rng.bytes(len(data)), "truncated": data[: len(data) // 2], "empty": b"",
                   "flipped": data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:]}[damage]
        path.write_bytes(damaged)
    message = (f"Checkpoint '{path}' does not exist." if damage == "missing" else
               f"'{path}' is not a readable MindSpore checkpoint (truncated, corrupt or another format): "
               + CAUSES[damage].format(path=path))
    with raises_exactly(CheckpointError, message):
        load_checkpoint(str(path))


def test_strict_load_refuses_mismatch_and_leaves_network_untouched(tmp_path):
    path = save_checkpoint(dense(2), str(tmp_path / "a.ckpt"))
    target = dense(3, seed=5)  # same names, other shapes
    before = params_of(target)
    with raises_exactly(CheckpointError, f"Checkpoint '{path}' does not fit the network: parameter 'bias' has shape "
                                         f"(2,) and dtype Float32 in the file but (3,) and Float32 in the network."):
        load_into(target, path)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(target), before))

    lenet = make_net("lenet5")
    before = params_of(lenet)
    with raises_exactly(CheckpointError, f"Checkpoint '{path}' does not fit the network: missing parameter(s) "
                                         f"'conv1.weight', 'conv2.weight', 'fc1.bias', 'fc1.weight', 'fc2.bias' and 3 "
                                         f"more; unexpected parameter(s) 'bias', 'weight'."):
        load_into(lenet, path)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(lenet), before))


def test_expected_metadata_mismatch(tmp_path):
    path = save_checkpoint(make_net("mlp"), str(tmp_path / "a.ckpt"), {"model": "mlp"})
    with raises_exactly(CheckpointError, f"Checkpoint '{path}' was saved with model='mlp', but model='lenet5' was "
                                         f"asked for."):
        load_into(make_net("mlp"), path, expected={"model": "lenet5"})


def test_non_strict_load_skips_missing(tmp_path):
    source = nn.SequentialCell([nn.Dense(3, 2)])
    path = save_checkpoint(source, str(tmp_path / "a.ckpt"))
    target = nn.SequentialCell([nn.Dense(3, 2), nn.Dense(2, 2)])
    load_into(target, path, strict=False)
    np.testing.assert_array_equal(target[0].weight.asnumpy(), source[0].weight.asnumpy())


def test_accumulator_and_optimizer_state_are_ignored_when_loading_a_network(tmp_path):
    from ms_accum.graphs import TrainAccumulationCell
    net = dense()
    cell = TrainAccumulationCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                 2)
    path = save_checkpoint(cell, str(tmp_path / "full.ckpt"))
    names = set(load_checkpoint(path)[0])
    assert {"accumulate.weight", "accumulate.mini_step", "moments.weight", "global_step", "weight"} <= names
    target = dense(seed=3)
    load_into(target, path)
    np.testing.assert_array_equal(target.weight.asnumpy(), net.weight.asnumpy())


def test_find_latest_skips_corrupt_and_prune_keeps_newest(tmp_path):
    d = str(tmp_path)
    for step in (1, 2, 10):
        save_checkpoint(dense(seed=step), ckpt.checkpoint_path(d, "run", step), {"step": step})
    (tmp_path / ".run-000000011.ckpt.tmp.ckpt").write_bytes(b"torn")  # a save that died
    (tmp_path / "run-000000012.ckpt").write_bytes(b"torn")  # a torn file under a real name
    assert ckpt.checkpoint_path(d, "run", 10).endswith("run-000000010.ckpt")
    assert [s for s, _ in ckpt.list_checkpoints(d, "run")] == [1, 2, 10, 12]
    assert ckpt.find_latest(d, "run") == ckpt.checkpoint_path(d, "run", 10)
    assert ckpt.find_latest(d, "other") is None and ckpt.find_latest(str(tmp_path / "none"), "run") is None
    removed = ckpt.prune(d, "run", keep_last=2)
    assert [os.path.basename(p) for p in removed] == ["run-000000001.ckpt", "run-000000002.ckpt"]


def test_a_file_of_a_later_format_is_refused_not_misread(tmp_path, monkeypatch):
    from ms_accum.train import checkpoint
    net = nn.Dense(3, 2)
    path = str(tmp_path / "new.ckpt")
    monkeypatch.setattr(checkpoint, "FORMAT_VERSION", checkpoint.FORMAT_VERSION + 1)  # as a newer ms_accum writes
    save_checkpoint(net, path, {"step": 1})
    monkeypatch.undo()
    with raises_exactly(CheckpointError, f"Checkpoint '{path}' has ms_accum format {checkpoint.FORMAT_VERSION + 1}, "
                                         f"newer than the format {checkpoint.FORMAT_VERSION} this ms_accum reads: "
                                         f"upgrade ms_accum to load it."):
        load_checkpoint(path)
    save_checkpoint(net, path, {"step": 1})  # today's format reads back
    assert load_checkpoint(path)[1] == {"step": 1}

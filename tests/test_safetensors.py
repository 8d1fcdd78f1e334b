"""Checkpoints as safetensors: read by the `safetensors` package itself (as Hugging Face tools read them), by MindSpore,
and by ms_accum, whose loading, resuming and evaluation take either format without being told."""
import json
import os

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from safetensors import safe_open
from safetensors.numpy import load_file

from ms_accum import GradientAccumulation, cli
from ms_accum.demo.data import make_synthetic_mnist
from ms_accum.train import checkpoint
from ms_accum.train.checkpoint import (CheckpointError, CheckpointWriteError, find_latest, list_checkpoints,
                                       load_checkpoint, load_into, prune, save_checkpoint)
from ms_accum.train.options import QUIET, Checkpoints, LogOptions
from conftest import cli_error, params_of, raises_exactly


def build():
    """A tiny network with Momentum (a state beside the parameters) over 6 shuffled batches of 8, as a restarted
    process builds them."""
    ds.config.set_seed(3)
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    dataset = ds.NumpySlicesDataset({"data": rng.standard_normal((48, 4)).astype(np.float32),
                                     "label": rng.integers(0, 3, 48).astype(np.int32)}, shuffle=True).batch(8)
    network = nn.Dense(4, 3)
    executor = GradientAccumulation(network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    nn.Momentum(network.trainable_params(), 0.1, 0.9))
    return network, dataset, executor


def train(directory, file_format="safetensors", stop_at=None, **kwargs):
    """2 epochs of 3 windows of K=2; `stop_at` ends the run after that optimizer step (`on_step` returns True), which
    saves the training state."""
    network, dataset, executor = build()
    log = QUIET if stop_at is None else LogOptions(verbose=False, on_step=lambda record: record.step == stop_at)
    checkpoints = Checkpoints(directory=str(directory), name="run", format=file_format, **kwargs)
    return network, executor.train_process(2, dataset, mini_steps=2, checkpoints=checkpoints, log=log)


def test_the_final_network_is_read_by_the_safetensors_package(tmp_path):
    network, result = train(tmp_path, metadata={"model": "dense", "lr": 0.1, "done": True})
    assert result.checkpoint == str(tmp_path / "run.safetensors")
    arrays = load_file(result.checkpoint)
    assert sorted(arrays) == sorted(p.name for p in network.get_parameters())  # the network alone
    for param in network.get_parameters():
        assert arrays[param.name].dtype == np.float32 and np.array_equal(arrays[param.name], param.asnumpy())
    # ms_accum's metadata is the header's string metadata, each value as JSON; MindSpore's own keys stay.
    with safe_open(result.checkpoint, framework="np") as handle:
        header = handle.metadata()
    assert header["format"] == "ms" and "crc_num" in header
    assert {key: json.loads(value) for key, value in header.items() if key.startswith("ms_accum.")} == {
        "ms_accum.format_version": 2, "ms_accum.model": "dense", "ms_accum.lr": 0.1, "ms_accum.done": True,
        "ms_accum.epoch": 2, "ms_accum.step": 6, "ms_accum.accumulate_step": 2, "ms_accum.global_batches": "0:16"}
    # ms_accum reads the values back as they were (a float to its last digit), MindSpore its parameters with the CRC.
    params, metadata = load_checkpoint(result.checkpoint)
    assert metadata["lr"] == 0.1 and metadata["done"] is True and metadata["step"] == 6
    assert set(ms.load_checkpoint(result.checkpoint, format="safetensors", crc_check=True)) == set(params)
    assert os.stat(result.checkpoint).st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["run.safetensors"]  # no temporary file left behind

    fresh = nn.Dense(4, 3)
    assert load_into(fresh, result.checkpoint, expected={"model": "dense"})["step"] == 6
    for a, b in zip(params_of(fresh), params_of(network)):
        np.testing.assert_array_equal(a, b)


def test_a_run_stopped_and_resumed_across_formats_ends_bit_identical(tmp_path):
    uninterrupted, _ = train(tmp_path / "whole", "ckpt")
    expected = params_of(uninterrupted)
    # Stopped after step 2 (safetensors), resumed and stopped after step 4 (ckpt), resumed to the end (safetensors):
    # resume=True takes the newest state whatever its format.
    cut = tmp_path / "cut"
    _, first = train(cut, stop_at=2, save_every=2)
    state = str(cut / "run-000000002.safetensors")
    assert first.stopped and os.path.isfile(state)
    assert "moments.weight" in load_file(state)  # the optimizer's state beside the parameters
    _, second = train(cut, "ckpt", stop_at=4, save_every=2, resume=True)
    assert second.resumed_from == state
    _, third = train(cut, save_every=2, resume=True, keep_last=2)
    assert third.resumed_from == str(cut / "run-000000004.ckpt") and [r.step for r in third.steps] == [5, 6]
    assert [os.path.basename(path) for _, path in list_checkpoints(str(cut), "run")] == [
        "run-000000004.ckpt", "run-000000006.safetensors"]  # keep_last counts the files of both formats
    got, _ = load_checkpoint(str(cut / "run.safetensors"))
    for param, value in zip(uninterrupted.trainable_params(), expected):
        assert np.array_equal(got[param.name].asnumpy(), value), param.name
    # A training-state file holds int counters beside the floats: the safetensors package reads them all, and a
    # state file loads into the bare network too (its training state set aside).
    arrays = load_file(str(cut / "run-000000006.safetensors"))
    assert {np.dtype(np.float32), np.dtype(np.int32)} <= {array.dtype for array in arrays.values()}
    load_into(nn.Dense(4, 3), str(cut / "run-000000006.safetensors"))


def test_the_newest_readable_state_of_either_format_is_found_and_pruned(tmp_path):
    for step, extension in ((1, "safetensors"), (2, "ckpt"), (3, "safetensors")):
        save_checkpoint(nn.Dense(4, 3), str(tmp_path / f"run-{step:09d}.{extension}"), {"step": step})
    newest = tmp_path / "run-000000003.safetensors"
    assert find_latest(str(tmp_path), "run") == str(newest)
    newest.write_bytes(newest.read_bytes()[:-4])  # torn: skipped
    assert find_latest(str(tmp_path), "run") == str(tmp_path / "run-000000002.ckpt")
    assert prune(str(tmp_path), "run", 1) == [str(tmp_path / "run-000000001.safetensors"),
                                              str(tmp_path / "run-000000002.ckpt")]


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = str(tmp_path / "a.safetensors")
    save_checkpoint(nn.Dense(4, 3), path, {"step": 1})

    def full_disk(source, target):
        target.write(source.read(10))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.shutil, "copyfileobj", full_disk)  # while the metadata is added to the header
    with raises_exactly(CheckpointWriteError, f"For 'save_checkpoint', 'a.safetensors' could not be written in "
                                              f"'{tmp_path}': No space left on device. No earlier file was changed."):
        save_checkpoint(nn.Dense(4, 3), path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)[1] == {"step": 1} and os.listdir(tmp_path) == ["a.safetensors"]


@pytest.mark.parametrize("damage", ["flipped", "truncated", "header"])
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage):
    path = tmp_path / "a.safetensors"
    save_checkpoint(nn.Dense(4, 3), str(path), {"step": 1})
    data = path.read_bytes()
    path.write_bytes({"flipped": data[:-4] + bytes([data[-4] ^ 0xFF]) + data[-3:],  # a weight's byte: the CRC fails
                      "truncated": data[:-4], "header": b"\xff" * 8 + data[8:]}[damage])
    with pytest.raises(CheckpointError, match=f"^'{path}' is not a readable MindSpore checkpoint"):
        load_checkpoint(str(path))


def test_bfloat16_is_written_without_mindspores_crc(tmp_path):
    # MindSpore 2.10 computes no CRC of bfloat16 arrays (docs/mindspore.md, "Safetensors checkpoints").
    network = nn.Dense(4, 3, dtype=ms.bfloat16)
    path = save_checkpoint(network, str(tmp_path / "a.safetensors"), {"step": 1})
    with safe_open(path, framework="np") as handle:
        assert "crc_num" not in handle.metadata()
    params, metadata = load_checkpoint(path)
    assert metadata == {"step": 1} and params["weight"].dtype == ms.bfloat16
    for param in network.get_parameters():
        assert np.array_equal(params[param.name].float().asnumpy(), param.float().asnumpy())


def test_an_unknown_format_is_refused_naming_the_argument(capsys):
    with raises_exactly(ValueError, "For 'Checkpoints', the argument 'format' must be one of ['ckpt', "
                                    "'safetensors'], but got 'pt'."):
        Checkpoints(format="pt")
    with raises_exactly(TypeError, "For 'Checkpoints', the argument 'format' must be str, one of ['ckpt', "
                                   "'safetensors'], but got None of type NoneType."):
        Checkpoints(format=None)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--ckpt-format", "pt"])
    assert exit_info.value.code == 2
    assert cli_error(capsys.readouterr().err) == ("ms-accum train: error: For 'ms-accum train', the argument "
                                                  "'--ckpt-format' must be one of ['ckpt', 'safetensors'], but got "
                                                  "'pt'.")


def test_the_command_line_trains_to_safetensors_and_evaluates_it(tmp_path, capsys):
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=128, num_test=64)
    argv = ["train", "--model", "mlp", "--accumulate-step", "2", "--batch-size", "16", "--num-samples", "64",
            "--data", data, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-format", "safetensors", "--save-every", "1",
            "--quiet", "--json"]
    assert cli.main(argv) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained["checkpoint"] == str(tmp_path / "ckpt" / "mlp.safetensors")  # evaluated from that file, too
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["mlp-000000001.safetensors", "mlp-000000002.safetensors",
                                                     "mlp.safetensors", "mlp_loss.png"]
    assert cli.main(["eval", "--ckpt", trained["checkpoint"], "--json", "--quiet"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["model"] == "mlp" and evaluated["accuracy"] == trained["accuracy"]
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-6)

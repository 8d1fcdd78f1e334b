"""`ms-accum` end to end: train and eval on real MNIST and on generated data; every bad input is one line."""
import argparse
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms

import ms_accum.train.distributed
import ms_accum.train.run
from ms_accum import cli
from ms_accum.train.checkpoint import load_checkpoint, save_checkpoint
from ms_accum.demo.data import make_synthetic_mnist
from ms_accum.demo.models import LeNet5, MLP
from ms_accum.train.distributed import decided_together
from conftest import FACTORY, cli_error, mnist_dir, requires_mnist

# 128 optimizer steps of 2 x 32 images: enough for LeNet5 to pass 90% on the real test set (measured 92.6%).
SHORT_RUN = ["--model", "lenet5", "--accumulate-step", "2", "--batch-size", "32", "--lr", "0.05",
             "--num-samples", "8192", "--quiet"]


def run_cli(*args, cwd=None, env=None):
    """The installed console script, as a user runs it."""
    full_env = dict(os.environ)
    for key, value in (env or {}).items():  # None removes the variable
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run([sys.executable, "-m", "ms_accum.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=600)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_synthetic_mnist(str(tmp_path_factory.mktemp("data")), num_train=1024, num_test=256)


@requires_mnist
@pytest.mark.slow  # make test-all (make test answers within 8 minutes)
def test_train_then_eval_on_real_mnist(tmp_path):
    out = run_cli("train", *SHORT_RUN, "--data", mnist_dir(), "--ckpt-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    trained = json.loads(out.stdout.strip().splitlines()[-1])
    assert trained["accuracy"] >= 0.90 and not trained["synthetic"]
    assert trained["optimizer_steps"] == 128 and trained["grad_norm"] is None  # not measured unless asked
    ckpt = tmp_path / "lenet5.ckpt"
    assert trained["checkpoint"] == str(ckpt)
    assert (tmp_path / "lenet5_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, meta = load_checkpoint(str(ckpt))
    assert {k: meta[k] for k in ("model", "accumulate_step", "batch_size", "epoch", "step")} == {
        "model": "lenet5", "accumulate_step": 2, "batch_size": 32, "epoch": 1, "step": 128}

    out = run_cli("eval", "--ckpt", str(ckpt), "--json", "--quiet")  # model and data come from the checkpoint
    assert out.returncode == 0, out.stderr
    evaluated = json.loads(out.stdout.strip().splitlines()[-1])
    assert evaluated["accuracy"] == trained["accuracy"]
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-6)

    out = run_cli("eval", "--ckpt", str(ckpt), "--model", "lenet5", "--data", mnist_dir(), "--quiet")
    assert out.returncode == 0 and f"held-out accuracy: {100 * trained['accuracy']:.2f}%" in out.stdout


def test_train_mlp_on_generated_idx_files_is_labelled_synthetic(tmp_path, synthetic, capsys):
    code = cli.main(["train", "--model", "mlp", "--accumulate-step", "2", "--batch-size", "16", "--epochs", "2",
                     "--lr", "0.05", "--optimizer", "momentum", "--momentum", "0.9", "--data", synthetic,
                     "--ckpt-dir", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    accuracy_line = [line for line in out.splitlines() if line.startswith("held-out accuracy: ")][0]
    assert "SYNTHETIC" in accuracy_line and float(accuracy_line.split()[2].rstrip("%,")) >= 80.0
    assert re.search(r"%, held-out loss: [0-9]+\.[0-9]{6} ", accuracy_line)  # the figure named as what it is
    assert cli.main(["eval", "--ckpt", str(tmp_path / "mlp.ckpt"), "--quiet"]) == 0
    assert "SYNTHETIC" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["lenet5", "mlp"])
def test_verify_reports_every_parameter_and_passes(model, synthetic, capsys):
    code = cli.main(["verify", "--model", model, "--accumulate-step", "4", "--batch-size", "8", "--data", synthetic])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[-1].startswith("PASSED (three_graphs, 1 process): 2 windows of 4 accumulated micro-batches "
                                           "and a partial window of 3 vs 3 big-batch steps: ")
    assert "3 windows of K=4 x B=8 against 3 steps on one batch of 32 (learning rate 0.01, 0.005, 0.0025)" in \
        out.splitlines()[0]
    assert "SYNTHETIC" in out.splitlines()[0]
    names = [p.name for p in (LeNet5() if model == "lenet5" else MLP()).trainable_params()]
    rows = [line.split() for line in out.splitlines()[2:-1]]
    assert [row[0] for row in rows] == names and all(float(row[1]) < 1e-5 for row in rows)


def test_verify_exits_1_when_the_updates_differ_beyond_the_tolerance(synthetic, capsys):
    # No tolerance is met by float32 sums in another order: the same comparison, reported as failed.
    code = cli.main(["verify", "--accumulate-step", "4", "--batch-size", "8", "--data", synthetic,
                     "--rtol", "1e-30", "--atol", "1e-30", "--json"])
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 1 and report["passed"] is False and report["max_abs_diff"] > 0
    assert set(report["per_parameter"]) == {p.name for p in LeNet5().trainable_params()}


def _left_as_it_is(grad_sum):
    return grad_sum


def test_verify_takes_the_structure_and_the_flags_of_train_that_change_the_update(synthetic, capsys):
    argv = ["verify", "--model", "mlp", "--accumulate-step", "2", "--batch-size", "8", "--data", synthetic,
            "--structure", "all", "--clip-norm", "0.5", "--loss-scale", "static", "--loss-scale-value", "1024",
            "--policy", "skip_microbatch"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-5] == "PASSED: 3 structure(s) verified"
    assert [line.split(" (")[1].split(",")[0] for line in out[-4:-1]] == ["three_graphs", "fused", "window"]
    # Gradient caching refuses to leave a micro-batch out: said in the command's flags, not verified.
    refusal = "the argument '--policy' must be 'skip_window' with --structure cached, but got 'skip_microbatch': "
    assert out[-1].startswith(f"not verified (cached): {refusal}")
    assert cli.main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["passed"] and report["structure"] == "all" and report["refused"]["cached"].startswith(refusal)
    assert (report["clip_norm"], report["loss_scale"], report["loss_scale_value"], report["policy"]) == (
        0.5, "static", 1024.0, "skip_microbatch")
    assert list(report["verdicts"]) == ["three_graphs", "fused", "window"]
    for name, verdict in report["verdicts"].items():
        assert verdict["passed"] and verdict["structure"] == name and verdict["ranks"] == 1
        assert verdict["verdict"].startswith(f"PASSED ({name}, 1 process): ")
        assert verdict["decided_by"] in ("rtol", "atol", "rtol and atol")
    assert cli.main(argv[:-10] + ["--structure", "cached", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["structure"] == "cached" and list(report["verdicts"]) == ["cached"] and report["passed"]


def test_verify_names_the_first_window_that_differs(synthetic, monkeypatch, capsys):
    argv = ["verify", "--model", "mlp", "--accumulate-step", "2", "--batch-size", "8", "--data", synthetic]
    assert cli.main(argv + ["--windows", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (report["windows"], report["first_failed_window"], report["learning_rates"]) == (2, None, [0.01, 0.005])
    assert [sorted(window) for window in report["per_window"]] == [["max_abs_diff", "max_rel_diff"]] * 2
    # The buffer's clear broken on purpose (tests/test_verify.py): the second window fails, and the verdict says so.
    monkeypatch.setattr("ms_accum.core._ops.zero_finite", _left_as_it_is)
    assert cli.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-3].startswith("FAILED (three_graphs, 1 process): 2 windows of 2 accumulated micro-batches and a "
                              "partial window of 1 vs 3 big-batch steps: window 2 of 3 first differs, max abs diff ")
    assert out[-2].startswith("max abs diff after window 1, 2, 3: ")
    assert out[-1].startswith("cause: a buffer not cleared after the update: after window 1's update")
    assert cli.main(argv + ["--json"]) == 1
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["first_failed_window"] == 2 and report["passed"] is False
    assert report["per_window"][0]["max_abs_diff"] <= 1e-6 < report["per_window"][1]["max_abs_diff"]


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_train_with_an_accumulate_schedule_and_the_noise_scale(tmp_path, synthetic, capsys):
    # 1024 images in micro-batches of 32: K=1 for 256 samples (8 steps), K=2 to 512 (4), K=4 to 1024 (4).
    argv = ["train", "--model", "mlp", "--batch-size", "32", "--data", synthetic, "--ckpt-dir", str(tmp_path),
            "--no-eval", "--quiet", "--json"]
    assert cli.main(argv + ["--accumulate-schedule", "0:1,256:2,512:4", "--noise-scale"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["accumulate_step"] == [1] * 8 + [2] * 4 + [4] * 4 and summary["samples_consumed"] == 1024
    # The noise scale needs two batch sizes: none while K=1, an estimate from the first window of 2 on.
    assert summary["noise_scale"][:8] == [None] * 8 and all(v is not None for v in summary["noise_scale"][8:])
    assert len(summary["grad_norm"]) == 16 and all(np.isfinite(summary["grad_norm"]))
    assert (tmp_path / "mlp_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, meta = load_checkpoint(str(tmp_path / "mlp.ckpt"))
    assert meta["accumulate_step"] == "0:1,256:2,512:4" and meta["global_batches"] == "0:32,256:64,512:128"
    # A threshold no micro-batch of this clean data reaches: nothing left out, and the JSON says so.
    assert cli.main(argv + ["--accumulate-step", "2", "--skip-outliers", "50", "--outlier-warmup", "4"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["outliers"] == [] and summary["skipped_micro_batches"] == 0
    assert cli.main(argv + ["--accumulate-schedule", "0:1,256:2", "--accumulate-step", "2"]) == 1
    assert capsys.readouterr().err == ("ms-accum train: error: For 'ms-accum train', --accumulate-schedule sets K: "
                                       "give it without --accumulate-step.\n")
    with pytest.raises(SystemExit) as bad:
        cli.main(argv + ["--accumulate-schedule", "256:2,0:1"])
    assert bad.value.code == 2
    assert cli_error(capsys.readouterr().err) == (
        "ms-accum train: error: For 'ms-accum train', the thresholds of '--accumulate-schedule' must start at 0 and "
        "increase, but got [256, 0].")




def test_verify_takes_your_own_model_through_a_factory(tmp_path, monkeypatch, capsys):
    (tmp_path / "users_model.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)  # found beside the caller, as python -m finds modules
    argv = ["verify", "--accumulate-step", "4", "--batch-size", "4", "--json"]
    assert cli.main(argv + ["--model", "users_model:build"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["passed"] is True and report["optimizer"] == "SGD" and len(report["per_parameter"]) == 4
    for spec, message in [
            ("users_model:two_things", "the factory 'users_model:two_things' must return (network, loss_fn, "
                                       "optimizer, sample) or (network, loss_fn, optimizer, sample, dataset), but "
                                       "returned a tuple of 2."),
            ("users_model:no_optimizer", "the factory 'users_model:no_optimizer' must return an nn.Optimizer as its "
                                         "optimizer, but returned a str."),
            ("users_model:missing", "the module 'users_model' has no function 'missing' (the factory "
                                    "'users_model:missing')."),
            ("not_a_module_anywhere:build", "the module 'not_a_module_anywhere' of the factory "
                                            "'not_a_module_anywhere:build' cannot be imported: ModuleNotFoundError: "
                                            "No module named 'not_a_module_anywhere'.")]:
        assert cli.main(argv + ["--model", spec]) == 1
        assert capsys.readouterr().err == f"ms-accum verify: error: For 'ms-accum verify', {message}\n"
    # A factory that raises: its frame, then the line (tests/test_cli_errors.py shows the user's frames in full).
    assert cli.main(argv + ["--model", "users_model:broken"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Traceback (most recent call last, your code's frames):"
    assert lines[1].startswith(f'  File "{tmp_path / "users_model.py"}", line ') and lines[1].endswith(", in broken")
    assert lines[-3:] == ['    raise RuntimeError("no weights here")', "RuntimeError: no weights here",
                          "ms-accum verify: error: For 'ms-accum verify', the factory 'users_model:broken' failed: "
                          "RuntimeError: no weights here."]
    with pytest.raises(SystemExit) as bad:
        cli.main(argv + ["--model", "users_model"])
    assert bad.value.code == 2
    assert cli_error(capsys.readouterr().err) == (
        "ms-accum verify: error: For 'ms-accum verify', the argument '--model' must be one of lenet5, mlp or "
        "package.module:function (a factory returning network, loss, optimizer and sample), but got 'users_model'.")


@requires_mnist
def test_verify_names_adam_magnifying_rounding_on_real_mnist(capsys):
    # The documented case: Adam's first step on MNIST's always-black pixels, whose gradients are rounding noise.
    code = cli.main(["verify", "--model", "mlp", "--optimizer", "adam", "--data", mnist_dir(), "--json"])
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 1 and report["passed"] is False
    assert [cause["name"] for cause in report["causes"]] == ["the optimizer magnifies rounding"]
    assert "verify with nn.SGD or nn.Momentum" in report["causes"][0]["fix"]


def test_verify_needs_k_times_b_images(synthetic, capsys):
    assert cli.main(["verify", "--accumulate-step", "64", "--batch-size", "32", "--data", synthetic]) == 1
    assert capsys.readouterr().err == (
        f"ms-accum verify: error: For 'ms-accum verify', --accumulate-step 64 x --batch-size 32 needs 2048 training "
        f"images, but {os.path.abspath(synthetic)} holds 1024.\n")


@pytest.mark.slow  # make test-all
def test_make_run_falls_back_to_synthetic_data_when_mnist_is_nowhere(tmp_path):
    # `make run`'s command with no --data, no MS_ACCUM_MNIST, no ./datasets/MNIST_Data and no --download (CI must
    # not depend on the network): it trains on the synthetic set, learns it, and says so on every result line.
    out = run_cli("train", "--model", "lenet5", "--accumulate-step", "4", "--batch-size", "32", "--epochs", "1",
                  "--quiet", "--synthetic-fallback", "--ckpt-dir", "ck", "--json", cwd=str(tmp_path),
                  env={"MS_ACCUM_MNIST": None})
    assert out.returncode == 0, out.stderr
    assert "Falling back to SYNTHETIC data" in out.stderr
    trained = json.loads(out.stdout.splitlines()[-1])
    assert trained["synthetic"] and trained["accuracy"] >= 0.9  # chance is 0.1
    assert os.path.isfile(tmp_path / "datasets" / "synthetic" / "MNIST_Data" / "SYNTHETIC")
    _, meta = load_checkpoint(str(tmp_path / "ck" / "lenet5.ckpt"))
    assert meta["data_dir"] == os.path.join("..", "datasets", "synthetic", "MNIST_Data")  # no machine's path
    out = run_cli("eval", "--ckpt", os.path.join(str(tmp_path), "ck", "lenet5.ckpt"), "--quiet",
                  cwd=str(tmp_path / "ck"), env={"MS_ACCUM_MNIST": None})  # found through the recorded path
    assert out.returncode == 0 and "SYNTHETIC" in out.stdout
    assert f"held-out accuracy: {100 * trained['accuracy']:.2f}%" in out.stdout


def test_without_data_or_fallback_it_says_what_to_do(tmp_path):
    out = run_cli("train", "--quiet", cwd=str(tmp_path), env={"MS_ACCUM_MNIST": None})
    assert out.returncode == 1
    assert cli_error(out.stderr) == (
        f"ms-accum train: error: For 'ms-accum train', MNIST directory '{os.path.join('.', 'datasets', 'MNIST_Data')}' "
        f"does not exist or is "
        f"not a directory. Put MNIST (the four idx files, uncompressed, as MNIST_Data/train/ and MNIST_Data/test/) in "
        f"a directory and pass it with --data DIR or set the environment variable MS_ACCUM_MNIST=DIR. Pass --data "
        f"DIR, set MS_ACCUM_MNIST, add --download, or add --synthetic-fallback to train on generated data.")


def test_an_empty_data_flag_is_not_set_as_resolve_data_dir_says(synthetic, monkeypatch):
    monkeypatch.setenv("MS_ACCUM_MNIST", synthetic)  # `--data ""` then finds MNIST where the environment says
    args = argparse.Namespace(data="", download=False, synthetic_fallback=False)
    assert cli.mnist.find_data(args) == (synthetic, True)


@pytest.mark.parametrize("argv,message", [
    (["train", "--accumulate-step", "0"], "the argument '--accumulate-step' must be a positive int, but got 0."),
    (["train", "--accumulate-step", "2.5"], "the argument '--accumulate-step' must be a positive int, but got '2.5'."),
    (["train", "--accumulate-steps", "0"], "the argument '--accumulate-step' must be a positive int, but got 0."),
    (["train", "--batch-size", "-3"], "the argument '--batch-size' must be a positive int, but got -3."),
    (["train", "--epochs", "zero"], "the argument '--epochs' must be a positive int, but got 'zero'."),
    (["train", "--lr", "nan"], "the argument '--lr' must be a positive float, but got nan."),
    (["train", "--clip-norm", "0"], "the argument '--clip-norm' must be a positive float, but got 0."),
    (["train", "--model", "resnet"], "the argument '--model' must be one of lenet5, mlp or package.module:function (a "
                                     "factory returning network, loss, optimizer and sample), but got 'resnet'."),
    (["train", "--adaptive-k", "8:2"], "the argument '--adaptive-k' must be MIN:MAX with MIN <= MAX, but got '8:2'."),
    (["train", "--structure", "fast"], "the argument '--structure' must be one of ['auto', 'three_graphs', 'fused', "
                                       "'window', 'cached'], but got 'fast'."),
    (["eval", "--ckpt", "x.ckpt", "--device", "TPU"],
     "the argument '--device' must be one of ['CPU', 'GPU', 'Ascend'], but got 'TPU'."),
    (["verify", "--rtol", "0"], "the argument '--rtol' must be a positive float, but got 0."),
    (["verify", "--accumulate-step", "-1"], "the argument '--accumulate-step' must be a positive int, but got -1."),
    (["verify", "--windows", "0"], "the argument '--windows' must be a positive int, but got 0."),
    (["plan", "--memory", "lots"], "the argument '--memory' must be a memory size such as '800MiB', '2GiB' or a "
                                   "number of bytes, but got 'lots'."),
])
def test_a_bad_flag_value_exits_2_with_one_line_in_the_library_s_style(argv, message, capsys):
    """argparse's refusals of a flag's value (its type's, its choices') read as the library's refusals do."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert cli_error(capsys.readouterr().err) == f"ms-accum {argv[0]}: error: For 'ms-accum {argv[0]}', {message}"


def test_a_missing_flag_is_argparse_s_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--model", "lenet5"])
    assert exit_info.value.code == 2
    assert cli_error(capsys.readouterr().err) == ("ms-accum eval: error: For 'ms-accum eval', the argument '--ckpt' "
                                                  "must be given.")


def test_the_argument_types_keep_argparse_s_words_in_a_script_s_own_parser(capsys):
    """A script's own `argparse.ArgumentParser` takes `positive_int` and the others: argparse names the flag."""
    parser = argparse.ArgumentParser(prog="script")
    parser.add_argument("--steps", type=cli.positive_int)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--steps", "0"])
    assert exit_info.value.code == 2
    assert cli_error(capsys.readouterr().err) == "script: error: argument --steps: must be a positive int, but got 0"


def write_bytes(path, data):
    path.write_bytes(data)
    return str(path)


def test_bad_data_and_checkpoints_exit_1_naming_the_file(tmp_path, synthetic, capsys):
    good = save_checkpoint(MLP(), str(tmp_path / "mlp.ckpt"), {"model": "mlp"})
    data = open(good, "rb").read()
    bare = str(tmp_path / "bare.ckpt")
    ms.save_checkpoint(MLP(), bare)  # MindSpore's own file, no metadata: needs --model
    truncated_images = tmp_path / "broken" / "train"
    os.makedirs(truncated_images)
    os.makedirs(tmp_path / "broken" / "test")
    for split in ("train", "test"):
        for name in os.listdir(os.path.join(synthetic, split)):
            content = open(os.path.join(synthetic, split, name), "rb").read()
            (tmp_path / "broken" / split / name).write_bytes(content[:-100] if "images" in name else content)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    images = tmp_path / "broken" / "train" / "train-images-idx3-ubyte"
    unreadable = ("'{}' is not a readable MindSpore checkpoint (truncated, corrupt or another format): Failed to read "
                  "the checkpoint file {}. The file may be corrupted, and the content cannot be parsed.")
    random_file = write_bytes(tmp_path / "random.ckpt", np.random.default_rng(0).bytes(4000))
    cut_file = write_bytes(tmp_path / "cut.ckpt", data[: len(data) // 2])
    mlp_params = ("missing parameter(s) 'conv1.weight', 'conv2.weight', 'fc1.bias', 'fc1.weight', 'fc2.bias' and 3 "
                  "more; unexpected parameter(s) 'dense_relu_sequential.0.bias', 'dense_relu_sequential.0.weight', "
                  "'dense_relu_sequential.2.bias', 'dense_relu_sequential.2.weight', 'dense_relu_sequential.4.bias' "
                  "and 1 more")
    cases = [
        (["train", "--data", str(tmp_path / "nowhere")],
         f"MNIST directory '{tmp_path / 'nowhere'}' does not exist or is not a directory. Put MNIST (the four idx "
         f"files, uncompressed, as MNIST_Data/train/ and MNIST_Data/test/) in a directory and pass it with --data DIR "
         f"or set the environment variable MS_ACCUM_MNIST=DIR."),
        (["train", "--data", str(tmp_path / "broken")],
         f"idx file '{images}' is truncated: {os.path.getsize(images)} bytes, its header implies "
         f"{os.path.getsize(images) + 100}."),
        (["train", "--data", synthetic, "--ckpt-dir", str(blocker)],
         f"For 'ms-accum train', the argument '--ckpt-dir' must be a writable directory, but '{blocker}' is a file."),
        (["eval", "--ckpt", str(tmp_path / "missing.ckpt")],
         f"Checkpoint '{tmp_path / 'missing.ckpt'}' does not exist."),
        (["eval", "--ckpt", random_file], unreadable.format(random_file, random_file)),
        (["eval", "--ckpt", cut_file], unreadable.format(cut_file, cut_file)),
        (["eval", "--ckpt", good, "--model", "lenet5", "--data", synthetic],
         f"Checkpoint '{good}' was saved with --model mlp, but --model lenet5 was asked for."),
        (["eval", "--ckpt", bare, "--data", synthetic],
         f"Checkpoint '{bare}' does not record its model: pass --model, one of ['lenet5', 'mlp'] or "
         f"package.module:function."),
        (["eval", "--ckpt", bare, "--model", "lenet5", "--data", synthetic],  # and says which model it is
         f"Checkpoint '{bare}' does not fit the network of the model 'lenet5' (--model): {mlp_params}. Its parameters "
         f"are those of the model 'mlp' (the file does not record its model): evaluate it as 'mlp'."),
    ]
    for argv, message in cases:
        assert cli.main(argv + ["--quiet"]) == 1, argv
        assert capsys.readouterr().err == f"ms-accum {argv[0]}: error: {message}\n"
    assert open(good, "rb").read() == data  # nothing that was saved is touched


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "train" in out.stdout and "eval" in out.stdout


def test_resume_continues_a_run_to_the_same_parameters(tmp_path, synthetic, capsys, monkeypatch):
    argv = ["train", "--model", "mlp", "--accumulate-step", "3", "--batch-size", "16", "--epochs", "2",
            "--num-samples", "320", "--data", synthetic, "--ckpt-dir", str(tmp_path), "--quiet", "--no-eval",
            "--json", "--save-every", "4"]
    checked = []  # what the ranks decide together: under msrun each is one all-reduce

    def deciding(check, parallel, what):
        checked.append(what)
        return decided_together(check, parallel, what)
    for module in (ms_accum.train.distributed, ms_accum.train.run):
        monkeypatch.setattr(module, "decided_together", deciding)
    assert cli.main(argv) == 0
    assert checked.count("the checkpoint directory") == 1  # checked once, by train_process
    monkeypatch.undo()
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["resumed_from"] is None and first["optimizer_steps"] == 14  # 20 batches: 7 windows an epoch
    expected, _ = load_checkpoint(str(tmp_path / "mlp.ckpt"))
    states = sorted(p.name for p in tmp_path.glob("mlp-*.ckpt"))
    assert states == ["mlp-000000008.ckpt", "mlp-000000012.ckpt"]  # 2 kept by default, as the docs say
    assert cli.main(argv) == 1  # a fresh run into them: refused, naming the ways on
    assert capsys.readouterr().err == (
        f"ms-accum train: error: For 'ms-accum train', the argument '--ckpt-dir' must not hold another run's training "
        f"states, but '{tmp_path}' holds 'mlp-000000008.ckpt', 'mlp-000000012.ckpt': a fresh run would save its own "
        f"beside them. Continue that run with --resume, or give another '--ckpt-dir' or remove them.\n")
    os.remove(tmp_path / states[-1])  # as if the run had died before step 12 was saved
    os.remove(tmp_path / "mlp.ckpt")

    bars = []

    def visible_progress(total, desc, quiet, unit):  # the bar a terminal would show, kept to be read
        from tqdm import tqdm
        bars.append(tqdm(total=total, desc=desc, file=io.StringIO()))
        return bars[-1]
    monkeypatch.setattr(cli.train, "_progress", visible_progress)
    assert cli.main(argv + ["--resume"]) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["resumed_from"] == str(tmp_path / states[0]) and resumed["optimizer_steps"] == 6
    assert (bars[0].n, bars[0].total) == (14, 14)  # the bar counts the whole run: 8 steps resumed, 6 trained
    got, _ = load_checkpoint(str(tmp_path / "mlp.ckpt"))
    for name, value in expected.items():
        assert np.array_equal(got[name].asnumpy(), value.asnumpy()), name


def test_train_help_names_the_two_states_kept_by_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--keep-last N keep only the newest N training states (default 2)" in shown


def test_loss_scale_policy_and_recompute_flags(tmp_path, synthetic, capsys):
    assert cli.main(["train", "--model", "lenet5", "--accumulate-step", "2", "--batch-size", "16",
                     "--num-samples", "64", "--data", synthetic, "--ckpt-dir", str(tmp_path), "--quiet", "--no-eval",
                     "--json", "--loss-scale", "dynamic", "--loss-scale-value", "1024", "--policy", "skip_microbatch",
                     "--recompute", "conv1", "conv2", "--structure", "fused", "--statistics"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["optimizer_steps"] == 2 and summary["skipped_windows"] == 0
    assert len(summary["grad_norm"]) == 2 and all(np.isfinite(summary["grad_norm"]))  # measured, unscaled
    _, meta = load_checkpoint(str(tmp_path / "lenet5.ckpt"))
    assert meta["step"] == 2
    assert cli.main(["train", "--recompute", "conv9", "--data", synthetic, "--ckpt-dir", str(tmp_path),
                     "--quiet"]) == 1
    assert capsys.readouterr().err == (
        "ms-accum train: error: For 'ms-accum train', the argument '--recompute' must hold sub-cells of the network, "
        "but got 'conv9'; valid paths: ['conv1', 'conv2', 'fc1', 'fc2', 'fc3', 'flatten', 'max_pool2d', 'relu'].\n")


@pytest.fixture
def small_file_system(tmp_path):
    """A 1.7 MB tmpfs (two LeNet5 training states fit, a third does not), where this platform lets the tests mount
    one; tests/test_resume.py makes writes fail without mounting."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1700k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small file system here ({done.stderr.strip() or done.returncode})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.slow  # make test-all (make test answers within 8 minutes)
def test_a_full_disk_ends_with_one_line_naming_the_file_and_the_state_to_resume(small_file_system, synthetic,
                                                                               tmp_path):
    argv = ["train", "--model", "lenet5", "--accumulate-step", "4", "--batch-size", "32", "--num-samples", "1024",
            "--data", synthetic, "--save-every", "2", "--quiet", "--no-eval", "--json"]
    full = run_cli(*argv, "--ckpt-dir", str(small_file_system))
    assert full.returncode == 1
    assert full.stderr.strip().splitlines()[-1] == (
        f"ms-accum train: error: For 'ms-accum train', 'lenet5-000000006.ckpt' could not be written in "
        f"'{small_file_system}': No space left on device. No earlier file was changed. The newest complete training "
        f"state is 'lenet5-000000004.ckpt': --resume continues from it.")
    kept = sorted(os.listdir(small_file_system))
    assert kept == ["lenet5-000000002.ckpt", "lenet5-000000004.ckpt"]  # intact, and no temporary file left
    # The states it kept continue the run: copied where there is room, --resume goes on from step 4.
    room = tmp_path / "room"
    room.mkdir()
    for name in kept:
        (room / name).write_bytes((small_file_system / name).read_bytes())
    resumed = run_cli(*argv, "--ckpt-dir", str(room), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] == str(room / "lenet5-000000004.ckpt") and summary["optimizer_steps"] == 4

"""Your own model through the command line: `ms-accum train / eval / verify / plan --model package.module:function`,
end to end with a factory that is neither LeNet5 nor the MLP (`fixtures/signals.py`: a Conv1d regression, and a
classifier), and every way a factory can break its contract (`ms_accum.tools.factory`)."""
import json
import os

import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from ms_accum import GradientAccumulation, cli
from ms_accum.train.checkpoint import load_checkpoint
from conftest import cli_error, raises_exactly

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.fixture
def signals(monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)  # where a user's module would be: importable
    import signals as module
    return module


def run(capsys, *argv):
    """`ms-accum argv... --json --quiet` in this process: (exit status, the JSON summary or None, stderr)."""
    code = cli.main([*argv, "--json", "--quiet"])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if code == 0 and lines else None), err


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_train_runs_the_executor_on_your_model_and_its_data_then_eval_reports_its_loss(signals, tmp_path, capsys):
    code, summary, err = run(capsys, "train", "--model", "signals:build", "--accumulate-step", "4", "--batch-size",
                             "16", "--structure", "fused", "--statistics", "--epochs", "2", "--ckpt-dir",
                             str(tmp_path))
    assert code == 0, err
    # 1024 signals in micro-batches of 16, windows of 4: 16 optimizer steps an epoch.
    assert summary["optimizer_steps"] == 32 and summary["model"] == "signals:build"
    assert summary["checkpoint"] == str(tmp_path / "signals_build.ckpt") and len(summary["grad_norm"]) == 32
    # A regression: its loss alone, on its eval split of 256, in the training's micro-batches of 16.
    assert summary["accuracy"] is None and summary["batches"] == 16
    # What the command line trained is the executor on the factory's own network, loss, optimizer and data.
    ms.set_seed(0)
    network, loss_fn, optimizer, _, dataset = signals.build()
    GradientAccumulation(network, loss_fn, optimizer, structure="fused").train_process(
        2, dataset(16, "train", 0, 1), 4, ckpt_dir=None, verbose=False)
    saved, meta = load_checkpoint(summary["checkpoint"])
    for param in network.trainable_params():
        np.testing.assert_array_equal(saved[param.name].asnumpy(), param.asnumpy(), err_msg=param.name)
    assert (meta["model"], meta["optimizer"], meta["step"]) == ("signals:build", "Adam", 32)
    first = np.mean(summary["grad_norm"][:4])
    assert summary["final_loss"] < 0.1 and summary["grad_norm"][-1] < first  # it learned the smoothing

    code, evaluation, err = run(capsys, "eval", "--ckpt", summary["checkpoint"])  # the model the file records
    assert code == 0, err
    assert evaluation["model"] == "signals:build" and evaluation["loss"] == summary["loss"]
    assert evaluation["accuracy"] is None and not evaluation["synthetic"]


@pytest.mark.slow  # make test-all
def test_a_classifier_of_yours_is_evaluated_with_its_accuracy(signals, tmp_path, capsys):
    code, summary, err = run(capsys, "train", "--model", "signals:classify", "--accumulate-schedule", "0:1,512:4",
                             "--batch-size", "16", "--epochs", "3", "--ckpt-dir", str(tmp_path), "--save-every", "16")
    assert code == 0, err
    assert summary["accumulate_step"][:32] == [1] * 32 and set(summary["accumulate_step"][32:]) == {4}
    assert 0.6 < summary["accuracy"] <= 1.0  # chance is 1/3
    expected, _ = load_checkpoint(summary["checkpoint"])
    # Killed before the last training state was written: resumed from the one before, to the same parameters.
    states = sorted(tmp_path.glob("signals_classify-*.ckpt"))
    os.remove(states[-1])
    os.remove(summary["checkpoint"])
    code, resumed, err = run(capsys, "train", "--model", "signals:classify", "--accumulate-schedule", "0:1,512:4",
                             "--batch-size", "16", "--epochs", "3", "--ckpt-dir", str(tmp_path), "--save-every", "16",
                             "--resume")
    assert code == 0, err
    assert resumed["resumed_from"] == str(states[-2]) and resumed["accuracy"] == summary["accuracy"]
    got, _ = load_checkpoint(resumed["checkpoint"])
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name].asnumpy(), value.asnumpy(), err_msg=name)


def test_a_summing_loss_of_yours_verifies_as_the_large_batch_sum(signals, capsys):
    code, report, err = run(capsys, "verify", "--model", "signals:summing", "--accumulate-step", "4",
                            "--batch-size", "4")
    assert code == 0 and report["passed"], (err, report)


def test_a_factory_that_breaks_its_contract_is_refused_before_anything_runs(signals, tmp_path, capsys):
    def error(*argv):
        code, _, err = run(capsys, *argv)
        assert code == 1, argv
        return cli_error(err)
    train = ["train", "--ckpt-dir", str(tmp_path / "ckpt"), "--batch-size", "16", "--model"]
    assert error(*train, "signals:no_data") == (
        "ms-accum train: error: For 'ms-accum train', the factory 'signals:no_data' provides no data: return "
        "dataset(batch_size, usage, shard_id, num_shards) as its fifth item (docs/your-model.md).")
    assert error(*train, "signals:unbatched_data") == (
        "ms-accum train: error: For 'ms-accum train', dataset(16, 'train', 0, 1) of the factory "
        "'signals:unbatched_data' must yield batches of 16 of its columns, but yields the columns ['signal', "
        "'target'] in batches of 2.")
    assert error(*train, "signals:short_sample") == (
        "ms-accum train: error: For 'ms-accum train', sample(2) of the factory 'signals:short_sample' must return 2 "
        "rows in each column, but returned arrays of shapes (1, 1, 32), (1, 32).")
    assert error(*train, "signals:float64_sample").startswith(
        "ms-accum train: error: For 'ms-accum train', the network and loss of the factory 'signals:float64_sample' do "
        "not take the batch its sample(2) returns (float64 (2, 1, 32), float64 (2, 32)): ")
    for flag, value in (("--optimizer", "sgd"), ("--lr", "0.1"), ("--data", str(tmp_path)), ("--num-samples", "64")):
        assert error(*train, "signals:build", flag, value) == (
            f"ms-accum train: error: For 'ms-accum train', {flag} applies to the built-in models, but --model is the "
            f"factory 'signals:build', whose optimizer and data are its own (change them in the factory).")
    assert error("verify", "--model", "signals:build", "--momentum", "0.9") == (
        "ms-accum verify: error: For 'ms-accum verify', --momentum applies to the built-in models, but --model is the "
        "factory 'signals:build', whose optimizer and data are its own (change them in the factory).")
    assert error("eval", "--ckpt", "x.ckpt", "--model", "signals:build", "--data", str(tmp_path)) == (
        "ms-accum eval: error: For 'ms-accum eval', --data applies to the built-in models, but --model is the factory "
        "'signals:build', whose optimizer and data are its own (change them in the factory).")
    assert os.listdir(tmp_path) == []  # nothing trained, nothing written, not even the --ckpt-dir


@pytest.mark.slow  # make test-all
def test_plan_then_train_with_the_plan_trains_your_model_and_refuses_it_once_changed(tmp_path, capsys, monkeypatch):
    module = tmp_path / "mine.py"
    module.write_text(open(os.path.join(FIXTURES, "signals.py"), encoding="utf-8").read())
    monkeypatch.chdir(tmp_path)  # found beside the caller, in this process and in the planner's trials
    code, plan, err = run(capsys, "plan", "--model", "mine:build", "--global-batch", "64", "--memory", "2GiB",
                          "--output", "plan.json")
    assert code == 0, err
    assert plan["model"] == "mine:build" and plan["batch_size"] * plan["accumulate_step"] == 64
    code, summary, err = run(capsys, "train", "--plan", "plan.json", "--ckpt-dir", "ckpt")  # no --model: the plan's
    assert code == 0, err
    _, meta = load_checkpoint(summary["checkpoint"])
    assert summary["model"] == "mine:build" and summary["optimizer_steps"] == 1024 // 64
    assert (meta["batch_size"], meta["accumulate_step"]) == (plan["batch_size"], plan["accumulate_step"])
    # The user widens the network after planning: the plan's measurements no longer hold.
    module.write_text(module.read_text().replace("def build(channels=8", "def build(channels=16"))
    monkeypatch.delitem(__import__("sys").modules, "mine")
    code, _, err = run(capsys, "train", "--plan", "plan.json", "--ckpt-dir", "ckpt2")
    assert code == 1 and cli_error(err).startswith(
        "ms-accum train: error: For 'ms-accum train', the plan 'plan.json' was made for another network, 4 trainable "
        "parameters of ")
    assert cli_error(err).endswith(": plan again for this network.") and not os.path.exists("ckpt2")


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("factory", ["three_inputs", "own_loss"])
def test_a_factory_of_several_columns_verifies_trains_and_evaluates(factory, tmp_path, capsys, monkeypatch):
    # fixtures/tokens.py: (input_ids, attention_mask, token_type_ids, label) batches, the label for the loss, or all
    # four for a network that computes its own loss (the factory's loss_fn None).
    monkeypatch.syspath_prepend(FIXTURES)
    spec = f"tokens:{factory}"
    code, report, err = run(capsys, "verify", "--model", spec, "--accumulate-step", "4", "--batch-size", "4")
    assert code == 0 and report["passed"], (err, report)
    code, summary, err = run(capsys, "train", "--model", spec, "--accumulate-step", "4", "--batch-size", "8",
                             "--epochs", "3", "--ckpt-dir", str(tmp_path), "--eval-every", "20", "--keep-best", "loss")
    assert code == 0, err
    assert summary["optimizer_steps"] == 48  # 512 samples an epoch, windows of 4 x 8
    # Validation on the factory's 'eval' split every 20 steps and after the last, which scores what eval scores.
    assert [scored["step"] for scored in summary["validation"]] == [20, 40, 48]
    assert summary["validation"][-1]["loss"] == pytest.approx(summary["loss"], rel=1e-6)
    best = min(summary["validation"], key=lambda scored: scored["loss"])
    assert load_checkpoint(summary["best_checkpoint"])[1]["step"] == best["step"]
    # Scored as validation scores it, on the 128 held-out samples: the loss (chance: ln 3 = 1.10; measured 0.77 for
    # both, the same network), and the accuracy where the network's output is the classes' scores (measured 0.71).
    assert summary["batches"] == 16 and summary["loss"] < 0.9, summary
    assert summary["accuracy"] is None if factory == "own_loss" else summary["accuracy"] > 0.6, summary
    code, evaluation, err = run(capsys, "eval", "--ckpt", summary["checkpoint"])
    assert code == 0 and evaluation["loss"] == summary["loss"], err


@pytest.mark.slow  # make test-all
def test_a_factory_of_several_columns_and_its_own_loss_is_planned_and_trained_with_the_plan(tmp_path, capsys,
                                                                                           monkeypatch):
    # The planner's trials build their datasets from the factory's four columns, for a network with its own loss.
    monkeypatch.syspath_prepend(FIXTURES)
    code, plan, err = run(capsys, "plan", "--model", "tokens:own_loss", "--global-batch", "32", "--memory", "1GiB",
                          "--output", str(tmp_path / "plan.json"))
    assert code == 0, err
    assert plan["batch_size"] * plan["accumulate_step"] == 32 and plan["reduction"] == "mean"
    assert all(trial["peak_mib"] is not None for trial in plan["trials"]), plan["trials"]
    code, summary, err = run(capsys, "train", "--plan", str(tmp_path / "plan.json"), "--ckpt-dir", str(tmp_path))
    assert code == 0, err
    assert summary["optimizer_steps"] == 512 // 32 and summary["predicted_peak_mib"] == plan["predicted_peak_mib"]


def test_evaluating_a_factorys_checkpoint_refuses_the_mnist_options(tmp_path):
    """A factory's dataset() decides its evaluation data: `data` and `num_samples` are refused with it (they once
    raised a NameError)."""
    from ms_accum.demo import evaluate_checkpoint
    from ms_accum.train import save_checkpoint
    ckpt = save_checkpoint(nn.Dense(2, 2), str(tmp_path / "any.ckpt"), {"model": "tokens:three_inputs"})
    for keyword, value in (("data", "MNIST"), ("num_samples", 8)):
        with raises_exactly(ValueError, f"For 'evaluate_checkpoint', the argument '{keyword}' applies to the built-in "
                                        f"models' MNIST, but got {value!r} with the factory 'tokens:three_inputs', "
                                        f"whose dataset() decides its evaluation data."):
            evaluate_checkpoint(ckpt, **{keyword: value})

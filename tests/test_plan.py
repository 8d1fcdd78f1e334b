"""ms_accum.plan: the micro-batch, K and structure for a global batch within a memory budget, measured in fresh
processes; GradientAccumulation.from_plan; the plan on the command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation, Plan, cli, plan
from ms_accum.tools.planner import CONFIRM_UP_TO, HEADROOM, MIB, Trial, _search, _Trials, parse_size
from conftest import FACTORY

REPO = Path(__file__).resolve().parents[1]
TRAIN_WITH_PLAN = REPO / "tests" / "plan_scripts" / "train_with_plan.py"


def test_parse_size():
    assert parse_size("800MiB") == 800 * MIB and parse_size("2GiB") == 2 * 2 ** 30 and parse_size("1.5GB") == 1.5e9
    assert parse_size("512m") == 512 * MIB and parse_size(4096) == 4096 and parse_size(" 64 KiB ") == 64 * 1024
    for bad in ("lots", "800 furlongs", "-1MiB", "0", "", None, True, float("nan")):
        with pytest.raises(ValueError, match="For 'plan', the argument 'memory' must be a"):
            parse_size(bad)


def linear(intercept, slope, failing_above=None):
    """A measure(B) of trials whose peak grows on a line; above `failing_above` they are killed."""
    calls = []

    def measure(b):
        calls.append(b)
        if failing_above is not None and b > failing_above:
            return Trial(b, 1, "three_graphs", None, error="killed by signal 9")
        return Trial(b, 1, "three_graphs", intercept + slope * b)
    return measure, calls


@pytest.mark.parametrize("limit, expected", [(100 + 10 * 8 + 5, 8), (100 + 10 * 32, 32), (100 + 10 * 1, 1),
                                             (100 + 10 * 4 - 1, 2)])
def test_search_confirms_the_largest_size_within_the_budget_and_the_next_above_it(limit, expected):
    sizes = [1, 2, 4, 8, 16, 32]
    measure, calls = linear(100, 10)
    best, line = _search(sizes, limit, measure, "plan", True)
    assert best == expected
    assert expected in calls and (expected == 32 or sizes[sizes.index(expected) + 1] in calls)
    assert len(calls) == len(set(calls)) <= 4  # each size at most once, not every size
    assert line(8) == pytest.approx(180) and line(0) == pytest.approx(100)


def test_search_treats_a_killed_trial_as_over_the_budget_and_refuses_a_budget_below_one_sample():
    measure, calls = linear(100, 10, failing_above=4)
    assert _search([1, 2, 4, 8, 16, 32], 10 ** 6, measure, "plan", False)[0] == 4
    measure, _ = linear(100, 10)
    with pytest.raises(ValueError, match=r"For 'plan', the argument 'memory' \(50 MiB\) is below the step of one "
                                         r"micro-batch of 1 sample\(s\), which peaked at 110 MiB: the smallest budget "
                                         r"that works is 110 MiB \(with 0% kept free\)\."):
        _search([1, 2, 4], 50, measure, "plan", True)
    with pytest.raises(ValueError, match=r"the smallest budget that works is 116 MiB \(with 5% kept free\)\."):
        _search([1, 2, 4], 50, measure, "plan", True, 0.05)  # 110 / 0.95


def test_search_does_not_try_a_size_predicted_far_above_the_budget():
    measure, calls = linear(100, 100)
    assert _search([1, 2, 4096], 2000, measure, "plan", True)[0] == 2
    assert calls == [1, 2]  # 4096 samples would need ~400 MB x 1000: predicted far above, not tried




def test_bad_inputs_are_refused_before_any_trial(tmp_path, monkeypatch):
    (tmp_path / "users_model.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)

    def no_trial(*args):
        raise AssertionError("a trial ran")
    monkeypatch.setattr(_Trials, "run", no_trial)
    for kwargs, error, message in [
            ({"memory": "lots"}, ValueError, "the argument 'memory' must be a memory size such as '800MiB'"),
            ({"global_batch": 0}, ValueError, "the argument 'global_batch' must be a positive int, but got 0."),
            ({"global_batch": 8.0}, TypeError, "the argument 'global_batch' must be a positive int"),
            ({"ranks": 3}, ValueError, "the argument 'global_batch' must be divisible by 'ranks' (3), but got 16."),
            ({"structures": ("fast",)}, ValueError, "the argument 'structures' must be one of"),
            ({"model": "users_model"}, ValueError, "the argument 'model' must be 'package.module:function'"),
            ({"model": "users_model:two_things"}, ValueError, "the factory 'users_model:two_things' must return "
                                                              "(network, loss_fn, optimizer, sample)"),
            ({"model": "nowhere_at_all:build"}, ValueError, "the module 'nowhere_at_all' of the factory "
                                                            "'nowhere_at_all:build' cannot be imported"),
            ({"model": "users_model:wrong_shapes"}, ValueError, "the network and loss of 'users_model:wrong_shapes' "
                                                                "do not take the batches its sample(2) returns")]:
        arguments = {"model": "users_model:build", "global_batch": 16, "memory": "1GiB", **kwargs}
        with pytest.raises(error) as raised:
            plan(arguments.pop("model"), arguments.pop("global_batch"), **arguments)
        assert str(raised.value).startswith("For 'plan', ") and message in str(raised.value), raised.value


def measured_peak(spec, batch_size, k, structure, reduction):
    trial = _Trials(spec, "CPU", 900, None).run(batch_size, k, structure, reduction)
    assert trial.peak_mib is not None, trial.error
    return trial.peak_mib


@pytest.mark.slow  # make test-all
@pytest.mark.parametrize("net", ["conv_net", "char_transformer"])
def test_plan_takes_the_largest_micro_batch_that_fits_the_budget_with_its_headroom(net, tmp_path):
    # The activation-heavy demo networks (`ms_accum.demo.models`) at a global batch of 32. The budget lets the
    # fresh-process peak of B=8 (the memory-first structure) fit with the plan's headroom and 8 % to spare, and lies
    # below the peak of B=16, so the plan must take B=8, K=4. The spare covers the plan measuring B=8 again: two
    # fresh processes of the conv net's B=8 peaked at 299 and 313 MiB in one CI run (4 % spare failed there).
    spec = f"ms_accum.demo.models:{net}"
    reduction = "mean" if net == "conv_net" else "weighted_mean"
    peak_8, peak_16 = (measured_peak(spec, b, 32 // b, "three_graphs", reduction) for b in (8, 16))
    budget = peak_8 / (1 - HEADROOM) * 1.08
    assert peak_16 > budget, (peak_8, peak_16)  # the activations grow with B, well beyond the noise
    result = plan(spec, 32, f"{budget}MiB")
    assert (result.batch_size, result.accumulate_step, result.reduction) == (8, 4, reduction), str(result)
    measured = {t.batch_size: t.peak_mib for t in result.trials if t.structure == "three_graphs"}
    # B=16 was ruled out by measuring it, or by the fitted line's prediction far above what the plan may use
    usable = (1 - HEADROOM) * budget
    assert 8 in measured and (measured.get(16, 0) > usable or
                              result.intercept_mib + 16 * result.slope_mib > CONFIRM_UP_TO * usable), str(result)
    timed = [t for t in result.trials if t.batch_size == 8]
    assert {t.structure for t in timed} == {"three_graphs", "fused", "window"}
    fastest = min((t for t in timed if t.peak_mib <= (1 - HEADROOM) * budget), key=lambda t: t.ms_per_window)
    assert result.structure == fastest.structure
    # The executor built from the plan, over a dataset of the factory's samples, in a fresh process.
    path = result.save(str(tmp_path / "plan.json"))
    done = subprocess.run([sys.executable, str(TRAIN_WITH_PLAN), path], capture_output=True, text=True, cwd=REPO,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["mini_steps"] == 4 and out["structure"] == result.structure
    assert out["peak_mib"] <= budget, (out, str(result))
    assert abs(result.predicted_peak_mib - out["peak_mib"]) <= 0.1 * out["peak_mib"], (out, str(result))


def test_from_plan_takes_the_plans_structure_reduction_and_k(tmp_path):
    trials = [Trial(4, 2, "fused", 10.0, 1.0)]
    chosen = Plan("lenet5", 16, 2, 4, 2, "fused", "mean", 10.0, 20.0, 20.0, 1.0, 2.0, "CPU", trials)
    assert Plan.load(chosen.save(str(tmp_path / "p.json"))) == chosen
    (tmp_path / "bad.json").write_text('{"model": "lenet5"}')
    with pytest.raises(ValueError, match="is not a plan written by 'ms-accum plan --output'"):
        Plan.load(str(tmp_path / "bad.json"))
    net = nn.Dense(6, 3)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    executor = GradientAccumulation.from_plan(chosen, net, loss, nn.SGD(net.trainable_params(), 0.1))
    assert executor.structure == "fused" and executor.plan is chosen
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((16, 6)).astype(np.float32), "y": rng.integers(0, 3, 16).astype(np.int32)}
    result = executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(4), ckpt_dir=None,
                                    verbose=False)
    assert [r.micro_batches for r in result.steps] == [2, 2]  # K from the plan
    with pytest.raises(ValueError, match="must yield the plan's micro-batches of 4 samples, but its batch size is 8"):
        executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(8), ckpt_dir=None)
    with pytest.raises(ValueError, match="the argument 'structure' comes from the plan"):
        GradientAccumulation.from_plan(chosen, net, loss, nn.SGD(net.trainable_params()), structure="window")
    with pytest.raises(TypeError, match="the argument 'plan' must be Plan"):
        GradientAccumulation.from_plan(chosen.to_dict(), net, loss, nn.SGD(net.trainable_params()))
    with pytest.raises(TypeError, match="the argument 'mini_steps' must be a positive int"):
        GradientAccumulation(net, loss, nn.SGD(net.trainable_params())).train_process(1, data)


@pytest.mark.slow  # make test-all
def test_cli_plans_lenet5_and_trains_with_the_plan(tmp_path, capsys):
    # LeNet5's step at B=1 is mostly fixed costs (~65 MiB); 1.5x of it lies between B=1 and the whole global batch of
    # 1024 (~210 MiB).
    assert cli.main(["plan", "--global-batch", "1024", "--memory", "1MiB", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ms-accum plan: error: For 'plan', the argument 'memory' (1 MiB) is below the step of one "
                          "micro-batch of 1 sample(s)")
    smallest = int(err.split("the smallest budget that works is ")[1].split()[0])
    path = str(tmp_path / "plan.json")
    assert cli.main(["plan", "--global-batch", "1024", "--memory", f"{smallest * 1.5:.0f}MiB", "--json", "--output",
                     path]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert {"batch_size", "accumulate_step", "structure", "predicted_peak_mib"} <= set(printed)
    assert printed["batch_size"] * printed["accumulate_step"] == 1024 and 1 < printed["batch_size"] < 1024
    assert printed == Plan.load(path).to_dict()
    ckpt = str(tmp_path / "ck")
    os.makedirs(ckpt)
    from ms_accum.demo.data import make_synthetic_mnist
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=2048, num_test=64)
    argv = ["train", "--plan", path, "--data", data, "--ckpt-dir", ckpt, "--no-eval", "--json", "--quiet"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["optimizer_steps"] == 2048 // 1024
    assert cli.main(argv + ["--batch-size", str(printed["batch_size"] * 2)]) == 1
    assert f"contradicts the plan {path}, which says {printed['batch_size']}." in capsys.readouterr().err
    assert cli.main(argv + ["--model", "mlp"]) == 1
    assert "is for the model 'lenet5', but --model is 'mlp'." in capsys.readouterr().err
    two_ranks = Plan.load(path)
    two_ranks.ranks = 2
    assert cli.main(argv[:2] + [two_ranks.save(str(tmp_path / "two.json"))] + argv[3:]) == 1
    assert "is for 2 rank(s), but this run has 1: plan again with --ranks 1." in capsys.readouterr().err

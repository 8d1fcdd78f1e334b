"""AdaptiveK: K decided when each window opens from the run's smoothed noise-scale estimate, the learning rate following
the batch, exact on resume, and every bad input refused before anything compiles (docs/adaptive-k.md)."""
import json
import math
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import (AdaptiveK, Checkpoints, GradientAccumulation, QUIET, SamplesLR, StatisticsOptions,
                      WindowOptions)
from ms_accum import cli
from ms_accum.core.statistics import NoiseScale
from ms_accum.demo.data import make_synthetic_mnist
from ms_accum.train.adaptive import Controller
from ms_accum.train.checkpoint import CheckpointError, load_checkpoint
from conftest import cli_error, raises_exactly

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_scripts", "resume_worker.py")


def estimate(value: float, beta: float = 0.99) -> NoiseScale:
    """A NoiseScale whose estimate is `value` (one window taken in: the bias correction makes it exact)."""
    noise = NoiseScale(beta)
    noise.windows, noise.g2, noise.trace = 1, (1 - beta) * 1.0, (1 - beta) * value
    return noise


def controller(value, k_min=2, k_max=32, per_batch=16, **settings) -> Controller:
    """A controller over micro-batches of `per_batch` samples whose estimate is `value` (None: none yet)."""
    noise = estimate(value) if value is not None else NoiseScale()
    made = Controller(AdaptiveK(k_min, k_max, **settings), per_batch, noise)
    made.observe(per_batch * 2.0, 2)  # one window of 2 micro-batches: a micro-batch weighs `per_batch`
    return made


# The decision rule, on the host, with the estimate held: no MindSpore graph runs.

def test_k_starts_at_k_min_and_no_decision_comes_before_min_samples():
    k = controller(320.0, min_samples=1000, every=100)  # target: 320 / 16 = 20 micro-batches
    assert [k.open_window(s) for s in (0, 500, 999)] == [2, 2, 2] and k.decisions == 0
    assert k.open_window(1000) == 20 and k.decisions == 1


def test_decisions_come_at_a_fixed_cadence_in_samples():
    k = controller(320.0, min_samples=0, every=100)
    assert k.open_window(0) == 20 and k.next_decision == 100
    k.noise = estimate(640.0)  # the target is 40 now, above k_max
    assert k.open_window(99) == 20  # not due yet
    assert k.open_window(250) == 32 and k.next_decision == 300  # due at 100; the next point stays on the grid
    assert k.decisions == 2


def test_the_threshold_keeps_k_from_oscillating():
    k = controller(16 * 10.0, k_min=1, min_samples=0, every=1, threshold=0.2)
    assert k.open_window(0) == 10
    for aim, expected in ((11.9, 10), (8.4, 10), (12.0, 12), (10.5, 12), (9.99, 10), (1.0, 1)):
        k.noise = estimate(16 * aim)
        assert k.open_window(k.next_decision) == expected, aim


def test_k_stays_within_its_bounds_and_without_an_estimate():
    assert controller(16 * 1000.0, min_samples=0).open_window(0) == 32
    assert controller(16 * 0.1, k_min=4, min_samples=0).open_window(0) == 4
    assert controller(None, min_samples=0).open_window(0) == 2  # no estimate (|G|² not positive yet): K stays


def test_one_decision_moves_k_by_at_most_max_change():
    k = controller(16 * 100.0, min_samples=0, every=1, max_change=2.0)
    assert [k.open_window(s) for s in range(5)] == [4, 8, 16, 32, 32]
    k.noise = estimate(16 * 3.0)
    assert [k.open_window(s) for s in range(5, 10)] == [16, 8, 4, 3, 3]
    assert controller(16 * 100.0, min_samples=0, max_change=1.5).open_window(0) == 3  # floor(2 x 1.5)


def test_fraction_scales_the_target():
    assert controller(16 * 20.0, min_samples=0, fraction=0.25).open_window(0) == 5


def test_a_token_weighted_estimate_is_converted_by_the_micro_batch_weight():
    made = Controller(AdaptiveK(2, 64, min_samples=0), 4, estimate(8000.0))
    made.observe(2 * 4 * 100.0, 2)  # micro-batches of 4 sequences, 400 tokens: B_simple 8000 tokens is 20 of them
    assert made.open_window(0) == 20


@pytest.mark.parametrize("rule, k, expected", [("none", 8, 1.0), ("linear", 8, 4.0), ("sqrt", 8, 2.0),
                                               ("linear", 2, 1.0)])
def test_learning_rate_rules(rule, k, expected):
    assert controller(320.0, lr_rule=rule).lr_scale(k) == expected


def test_adascale_gain_lies_between_one_and_the_scale():
    # B0 = 2 x 16 = 32 samples. Far below B_simple the gain is about S; far above, about 1.
    assert controller(32 * 1e6, lr_rule="adascale").lr_scale(8) == pytest.approx(4.0, rel=1e-5)
    assert controller(32 * 1e-6, lr_rule="adascale").lr_scale(8) == pytest.approx(1.0, rel=1e-5)
    b_simple = 32 * 3.0  # (1 + 3) / (1 + 3/4)
    assert controller(b_simple, lr_rule="adascale").lr_scale(8) == pytest.approx(4 / 1.75)


def test_state_round_trip_continues_the_same_decisions():
    first = controller(320.0, min_samples=64, every=48)
    [first.open_window(s) for s in range(0, 400, 32)]
    second = controller(999.0, min_samples=64, every=48)
    second.noise = first.noise
    second.load(first.state())
    assert second.state() == first.state()
    first.noise, second.noise = estimate(800.0), estimate(800.0)
    assert [first.open_window(s) for s in range(400, 800, 32)] == [second.open_window(s) for s in range(400, 800, 32)]


# Bad inputs, refused before anything is built, naming the argument.

@pytest.mark.parametrize("args, kwargs, error, message", [
    ((0, 4), {}, ValueError, "the argument 'k_min' must be a positive int, but got 0."),
    ((8, 4), {}, ValueError, "the argument 'k_max' must be at least 'k_min' (8), but got 4."),
    ((2, 2.5), {}, TypeError, "the argument 'k_max' must be a positive int, but got 2.5 of type float."),
    ((2, 8), {"fraction": 0}, ValueError, "the argument 'fraction' must be a positive float, but got 0."),
    ((2, 8), {"fraction": -0.5}, ValueError, "the argument 'fraction' must be a positive float, but got -0.5."),
    ((2, 8), {"lr_rule": "cubic"}, ValueError,
     "the argument 'lr_rule' must be one of ['none', 'linear', 'sqrt', 'adascale'], but got 'cubic'."),
    ((2, 8), {"every": 0}, ValueError, "the argument 'every' must be a positive int, but got 0."),
    ((2, 8), {"min_samples": -1}, ValueError, "the argument 'min_samples' must be a non-negative int, but got -1."),
    ((2, 8), {"threshold": -0.1}, ValueError, "the argument 'threshold' must be a non-negative float, but got -0.1."),
    ((2, 8), {"beta": 1.0}, ValueError, "the argument 'beta' must be a float in (0, 1), but got 1.0."),
    ((2, 8), {"max_change": 1.0}, ValueError, "the argument 'max_change' must be a float above 1, but got 1.0."),
])
def test_bad_settings_are_refused(args, kwargs, error, message):
    with raises_exactly(error, f"For 'AdaptiveK', {message}"):
        AdaptiveK(*args, **kwargs)


def small_data(samples=256, batch=8, features=10, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((samples, features)).astype(np.float32)
    label = (data[:, 0] + 0.5 * rng.standard_normal(samples) > 0).astype(np.int32)
    return ds.NumpySlicesDataset({"data": data, "label": label}, shuffle=False).batch(batch)


def small_net(seed=0):
    ms.set_seed(seed)
    return nn.SequentialCell([nn.Dense(10, 16), nn.ReLU(), nn.Dense(16, 2)])


def executor_for(net, optimizer=None, loss=None, **options):
    loss = loss or nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return GradientAccumulation(net, loss, optimizer or nn.SGD(net.trainable_params(), 0.1), **options)


MEASURED = StatisticsOptions(noise_scale=True)
DOOR = "For 'GradientAccumulation.train_process', "


REFUSED = ("AdaptiveK(2, 8, fraction=1.0, lr_rule='none', min_samples=None, every=None, threshold=0.2, "
           "max_change=None, beta=0.99)")


@pytest.mark.parametrize("case, message", [
    ("unmeasured", f"the argument 'mini_steps' is {REFUSED}, which decides from the gradient noise scale, but the "
                   "executor measures no gradient norm: build it with statistics=StatisticsOptions(noise_scale=True)."),
    ("k_min=1", "the argument 'k_min' must be at least 2 on one rank, but got 1: the noise scale compares the "
                "micro-batch's gradient with the window's, and a window of one micro-batch has one batch size, so K "
                "would never move."),
    ("sum", f"the argument 'mini_steps' must be a fixed K or a schedule with a summing loss (reduction 'sum'): "
            f"AdaptiveK decides from the gradient noise scale, which compares mean gradients, but got {REFUSED}."),
    ("cached", f"the argument 'mini_steps' must be a fixed K or a schedule with structure='cached': AdaptiveK decides "
               f"from the gradient noise scale, and gradient caching measures no micro-batch's gradient on its own, "
               f"but got {REFUSED}."),
    ("schedule", "the argument 'mini_steps' scales the learning rate with the batch, which needs the optimizer's rate "
                 "to be a number (or one per group) or a SamplesLR, but it is WarmUpLR: wrap a schedule as "
                 "SamplesLR(schedule), which runs on samples, or give lr_rule='none'."),
])
def test_a_run_it_cannot_measure_is_refused_before_anything_trains(case, message, tmp_path):
    net = small_net()
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    adaptive = AdaptiveK(1 if case == "k_min=1" else 2, 8, lr_rule="linear" if case == "schedule" else "none")
    if case == "unmeasured":
        executor = executor_for(net)
    elif case == "sum":
        executor = executor_for(net, loss=nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"),
                                window=WindowOptions(reduction="sum"), statistics=StatisticsOptions(norms=True))
    elif case == "cached":
        executor = executor_for(net, structure="cached")
    elif case == "schedule":
        executor = executor_for(net, nn.SGD(net.trainable_params(), nn.WarmUpLR(0.1, 10)), statistics=MEASURED)
    else:
        executor = executor_for(net, statistics=MEASURED)
    with raises_exactly(ValueError, DOOR + message):
        executor.train_process(1, small_data(), mini_steps=adaptive, checkpoints=Checkpoints(tmp_path / "ckpt"),
                               log=QUIET)
    assert all(np.array_equal(p.asnumpy(), b) for p, b in zip(net.trainable_params(), before))
    assert not os.path.exists(tmp_path / "ckpt" / "gradient_accumulation.ckpt")


# In training: the K it chose and the rate it scaled are exactly what a schedule of them would train.

def opened_at(result):
    """The global samples consumed when each recorded window opened."""
    return [0] + [record.samples_consumed for record in result.steps[:-1]]


@pytest.mark.parametrize("rate", ["number", "samples_lr"])
def test_an_adaptive_run_equals_the_schedule_of_the_ks_it_chose_at_the_rates_it_scaled(rate):
    def base(samples):
        return 0.05 * min(1.0, (samples + 64) / 512)  # a warm-up on samples, kept running under the scaling

    def optimizer(net, lr):
        return nn.Momentum(net.trainable_params(), lr, 0.9)

    adaptive_net = small_net()
    adaptive_rate = 0.05 if rate == "number" else SamplesLR(base)
    executor = executor_for(adaptive_net, optimizer(adaptive_net, adaptive_rate), statistics=MEASURED)
    result = executor.train_process(2, small_data(512), AdaptiveK(2, 12, lr_rule="sqrt", min_samples=64, every=48,
                                                                 threshold=0.1), checkpoints=None, log=QUIET)
    ks = [record.accumulate_step for record in result.steps]
    assert len(set(ks)) > 2, ks  # it moved K
    opens = opened_at(result)
    schedule = dict(zip(opens, ks))
    scales = dict(zip(opens, [record.lr_scale for record in result.steps]))
    assert all(scale == math.sqrt(k / 2) for k, scale in zip(ks, scales.values()))

    def scaled(samples):  # the rate it was given, as the optimizer holds it (float32), times the window's factor
        given = float(np.float32(0.05)) if rate == "number" else base(samples)
        return given * scales[max(s for s in scales if s <= samples)]

    fixed_net = small_net()
    fixed = executor_for(fixed_net, optimizer(fixed_net, SamplesLR(scaled)), statistics=MEASURED)
    expected = fixed.train_process(2, small_data(512), schedule, checkpoints=None, log=QUIET)
    assert [record.accumulate_step for record in expected.steps] == ks
    for got, want in zip(adaptive_net.trainable_params(), fixed_net.trainable_params()):
        assert np.array_equal(got.asnumpy(), want.asnumpy()), got.name
    if rate == "number":  # the run puts back the rate it was given
        assert executor.parts.optimizer.learning_rate.asnumpy() == np.float32(0.05)


# Resume: the controller's state is in the training-state files.

def run_worker(ckpt_dir, fault="none", mini_steps="adaptive:2:8:adascale", structure="three_graphs"):
    env = {**os.environ, "GLOG_v": "3"}
    done = subprocess.run([sys.executable, WORKER, str(ckpt_dir), structure, fault, mini_steps, "320"],
                          capture_output=True, text=True, timeout=300, env=env)
    return done, (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None)


def final_params(ckpt_dir):
    params, _ = load_checkpoint(os.path.join(ckpt_dir, "run.ckpt"))
    return {name: value.asnumpy() for name, value in params.items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    ckpt_dir = tmp_path_factory.mktemp("adaptive_whole")
    done, summary = run_worker(ckpt_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    return summary, final_params(ckpt_dir)


# 2 epochs of 40 batches of 8, outliers beyond 2 standard deviations left out, decisions every 32 samples from 64: K
# goes 2, 4, 8, down to 7 at step 11 and up again. Killed inside step 11's window, or after step 8's state is saved.
@pytest.mark.parametrize("fault", ["micro:50", pytest.param("boundary:8", marks=pytest.mark.slow)])
def test_a_killed_adaptive_run_resumes_with_the_same_decisions_bit_identical(uninterrupted, fault, tmp_path):
    summary, expected = uninterrupted
    assert len(set(summary["k"])) > 3 and summary["skipped_micro_batches"] > 0, summary  # K moved, outliers left out
    killed, _ = run_worker(tmp_path, fault)
    assert killed.returncode == -9, killed.stderr[-2000:]
    done, resumed = run_worker(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    first = resumed["steps"][0] - 1
    assert first > 0 and resumed["resumed_from"] is not None
    assert resumed["k"] == summary["k"][first:]
    assert resumed["noise_scale"] == summary["noise_scale"][first:]
    assert resumed["lr_scale"] == summary["lr_scale"][first:]
    got = final_params(tmp_path)
    assert got.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(got[name], expected[name]), name


def states_of(net, mini_steps, directory, resume=None, epochs=1):
    executor = executor_for(net, statistics=MEASURED)
    return executor.train_process(epochs, small_data(), mini_steps, checkpoints=Checkpoints(
        directory, "run", save_every=4, resume=resume), log=QUIET)


SAVED = ("AdaptiveK(2, 8, fraction=1.0, lr_rule='none', min_samples=32, every=32, threshold=0.2, max_change=None, "
         "beta=0.99) over global micro-batches of 8 samples")


@pytest.mark.parametrize("given, this", [
    (AdaptiveK(2, 16, min_samples=32, every=32), SAVED.replace("(2, 8,", "(2, 16,")),
    (2, "a fixed K or schedule"),
])
def test_a_resume_with_other_settings_is_refused(given, this, tmp_path):
    states_of(small_net(), AdaptiveK(2, 8, min_samples=32, every=32), tmp_path)
    path = os.path.join(tmp_path, "run-000000012.ckpt")
    with raises_exactly(CheckpointError, f"Checkpoint '{path}' was saved by a run whose K came from {SAVED}, but this "
                                         f"run's comes from {this}: resuming would not continue the same training."):
        states_of(small_net(), given, tmp_path, resume=path, epochs=2)


def test_an_adaptive_resume_of_a_fixed_k_run_is_refused(tmp_path):
    states_of(small_net(), 2, tmp_path)
    path = os.path.join(tmp_path, "run-000000016.ckpt")
    with raises_exactly(CheckpointError, f"Checkpoint '{path}' was saved by a run whose K came from the global batch "
                                         f"schedule (samples consumed: global batch) 0:16, but this run's comes from "
                                         f"{SAVED}: resuming would not continue the same training."):
        states_of(small_net(), AdaptiveK(2, 8, min_samples=32, every=32), tmp_path, resume=path, epochs=2)


def test_the_final_checkpoint_records_the_settings_and_where_k_changed(tmp_path):
    result = states_of(small_net(), AdaptiveK(2, 8, min_samples=32, every=32), tmp_path)
    _, meta = load_checkpoint(result.checkpoint)
    assert json.loads(meta["adaptive_k"]) == {
        "k_min": 2, "k_max": 8, "fraction": 1.0, "lr_rule": "none", "min_samples": 32, "every": 32, "threshold": 0.2,
        "max_change": None, "beta": 0.99, "global_micro_batch": 8}
    changes, k = [], None
    for start, record in zip(opened_at(result), result.steps):
        if record.accumulate_step != k:
            changes.append(f"{start}:{record.accumulate_step * 8}")
            k = record.accumulate_step
    assert meta["global_batches"] == ",".join(changes)


# The command line.

@pytest.mark.parametrize("given, message", [
    ("8:2", "must be MIN:MAX with MIN <= MAX, but got '8:2'."),
    ("4", "must be MIN:MAX, two positive ints such as 2:16, but got '4'."),
    ("0:4", "must be MIN:MAX, two positive ints such as 2:16, but got '0:4'."),
])
def test_the_command_line_refuses_bad_bounds(given, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--adaptive-k", given, "--ckpt-dir", str(tmp_path / "ck")])
    assert cli_error(capsys.readouterr().err) == (f"ms-accum train: error: For 'ms-accum train', the argument "
                                                  f"'--adaptive-k' {message}")
    assert not os.path.exists(tmp_path / "ck")


def test_the_command_line_trains_with_an_adaptive_k_and_shows_it(tmp_path, capsys):
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=512, num_test=64)
    # The first decision after 32 windows of K=2 (512 samples), then one every 8 (128 samples).
    assert cli.main(["train", "--model", "mlp", "--batch-size", "8", "--adaptive-k", "2:8", "--lr-rule", "linear",
                     "--epochs", "3", "--data", data, "--ckpt-dir", str(tmp_path / "ck"), "--no-eval", "--json",
                     "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    ks, scales = summary["accumulate_step"], summary["lr_scale"]
    assert len(ks) == summary["optimizer_steps"] and ks[0] == 2 and set(ks) <= set(range(2, 9)) and len(set(ks)) > 1
    assert scales == [k / 2 for k in ks]  # linear from the rate for K=2
    assert len(summary["noise_scale"]) == len(ks) and any(value is not None for value in summary["noise_scale"])
    assert summary["samples_consumed"] == 3 * 512
    _, meta = load_checkpoint(summary["checkpoint"])
    assert meta["accumulate_step"] == "adaptive 2:8"
    assert matplotlib.image.imread(summary["loss_plot"]).shape[:2] == (550, 600)  # the second panel: K, noise scale


def test_the_last_window_is_scored_though_no_window_count_is_known_ahead():
    net = small_net()
    executor = executor_for(net, statistics=MEASURED)
    result = executor.train_process(1, small_data(), AdaptiveK(2, 8, min_samples=32, every=16), checkpoints=None,
                                    log=QUIET, eval_dataset=small_data(64, seed=1), eval_every=1000)
    assert [record.validation is not None for record in result.steps] == [False] * (len(result.steps) - 1) + [True]
    assert len({record.accumulate_step for record in result.steps}) > 1

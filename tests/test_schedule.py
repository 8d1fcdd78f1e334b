"""Batch schedules: K from the samples consumed, exact against fixed-K segments, resumable, learning rates by
samples."""
import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation
from ms_accum.train.checkpoint import CheckpointError, find_latest
from ms_accum.train.lr import SamplesLR
from ms_accum.train.schedule import AccumulationSchedule, parse_schedule, rampup
from conftest import raises_exactly
from ms_accum._validation import door

B = 4
SCHEDULE = {0: 2, 64: 4, 160: 8}  # samples consumed: K
# 66 batches of 4: K=2 for 8 windows (to 64 samples), K=4 for 6 (to 160), K=8 for 3 (to 256), then a partial window
# of the epoch's last 2 batches.
SEGMENTS = [(0, 64, 2), (64, 160, 4), (160, 264, 8)]
RNG = np.random.default_rng(0)
DATA = {"x": RNG.standard_normal((264, 6)).astype(np.float32), "y": RNG.integers(0, 3, 264).astype(np.int32)}


def executor(structure="three_graphs", lr=0.05):
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)])
    opt = nn.Momentum(net.trainable_params(), lr, 0.9)
    return net, GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt,
                                     structure=structure)


def dataset(lo=0, hi=264, batch=B):
    return ds.NumpySlicesDataset({k: v[lo:hi] for k, v in DATA.items()}, shuffle=False).batch(batch)


def params(net):
    return [p.asnumpy().copy() for p in net.trainable_params()]


def test_schedule_tables_parsing_and_rampup():
    k = AccumulationSchedule({0: 2, 4096: 4, 16384: 8})
    assert [k.peek(s) for s in (0, 4095, 4096, 16383, 16384, 10 ** 9)] == [2, 2, 4, 4, 8, 8]
    assert k.global_batches(32) == "0:64,4096:128,16384:256" and k.fixed is None
    assert AccumulationSchedule(4).fixed == 4 and AccumulationSchedule(4).peek(123) == 4
    assert AccumulationSchedule(lambda s: 1 + s // 100).peek(250) == 3
    with pytest.warns(DeprecationWarning) as caught:
        assert k(4096) == 4
    assert str(caught[0].message) == ("'ms_accum.AccumulationSchedule.__call__' is deprecated since ms_accum 1.3.0 and "
                                      "will be removed in 2.0.0; use peek(samples).") and caught[0].filename == __file__
    assert parse_schedule("0:2,4096:4, 16384:8") == {0: 2, 4096: 4, 16384: 8}
    # Megatron's --rampup-batch-size 32 32 1000 to 96 with a global micro-batch of 16.
    assert rampup(32, 32, 1000, 96, 16) == {0: 2, 1000: 4, 2000: 6}


NOT_A_SCHEDULE = ("the argument 'mini_steps' must be a positive int, a dict from samples consumed (ints, the first 0) "
                  "to K, or a callable K(samples), but got {}.")


@pytest.mark.parametrize("schedule, error, message", [
    ({4096: 4}, ValueError, "the thresholds of 'mini_steps' must start at 0 and increase, but got [4096]."),
    ({0: 2, 64: 4, 32: 8}, ValueError, "the thresholds of 'mini_steps' must start at 0 and increase, but got "
                                       "[0, 64, 32]."),
    ({0: 2, 64: 0}, ValueError, "the argument 'mini_steps[64]' must be a positive int, but got 0."),
    ({0: 2, 64: 2.5}, TypeError, "the argument 'mini_steps[64]' must be a positive int, but got 2.5 of type float."),
    ({0: 2, "64": 4}, TypeError, NOT_A_SCHEDULE.format("{0: 2, '64': 4}")),
    ({}, TypeError, NOT_A_SCHEDULE.format("{}")),
    (0, ValueError, "the argument 'mini_steps' must be a positive int, but got 0."),
    ("4", TypeError, "the argument 'mini_steps' must be a positive int, but got '4' of type str."),
])
def test_bad_schedules_are_refused_before_anything_compiles(schedule, error, message):
    net, model = executor()
    before = params(net)
    with raises_exactly(error, f"For 'GradientAccumulation.train_process', {message}"):
        model.train_process(1, dataset(), schedule, ckpt_dir=None)
    assert all(np.array_equal(a, b) for a, b in zip(before, params(net)))


def test_bad_ramps_and_command_line_schedules():
    with raises_exactly(ValueError, "For 'rampup', the argument 'global_batch' must be 'start' (32) plus a whole "
                                    "number of 'increment' (32), but got 100."):
        rampup(32, 32, 1000, 100, 16)
    with raises_exactly(ValueError, "For 'rampup', every global batch of the ramp must be divisible by 'batch_size' "
                                    "(16), but 40 is not."):
        rampup(32, 8, 1000, 48, 16)
    with raises_exactly(TypeError, "For 'rampup', the argument 'samples_per_increment' must be a positive int, but got "
                                   "1.5 of type float."):
        rampup(32, 32, 1.5, 96, 16)
    # Called directly, the parser names itself; the command line passes its own names (tests/test_cli.py).
    for text in ("0:2,4096", "a:2", "0:2;64:4", ""):
        with raises_exactly(ValueError, f"For 'parse_schedule', the argument 'text' must be comma-separated samples:K "
                                        f"pairs such as '0:2,4096:4', but got '{text}'."):
            parse_schedule(text)
    with raises_exactly(ValueError, "For 'parse_schedule', the thresholds of 'text' must start at 0 and increase, but "
                                    "got [64, 0]."):
        parse_schedule("64:2,0:4")
    # A threshold given twice is refused, not overwritten by the later pair.
    for text, twice in (("0:2,100:4,100:8", 100), ("0:2,0:4", 0), ("0:2,100:4,0100:8", 100)):
        with raises_exactly(ValueError, f"For 'ms-accum train', the argument '--accumulate-schedule' must give each "
                                        f"threshold once, but got {twice} twice in '{text}'."):
            with door("ms-accum train"):  # as the command line calls it
                parse_schedule(text, "--accumulate-schedule")


def test_a_callables_bad_value_is_refused_when_first_evaluated_naming_the_sample_count():
    net, model = executor()
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'mini_steps(64)' must be a "
                                    "positive int, but got 0."):
        model.train_process(1, dataset(), lambda s: 2 if s < 64 else 0, ckpt_dir=None)


@pytest.mark.parametrize("structure", ["three_graphs", pytest.param("fused", marks=pytest.mark.slow),
                                       pytest.param("window", marks=pytest.mark.slow)])
def test_a_ramped_run_equals_its_fixed_k_segments_bit_for_bit(structure):
    net, model = executor(structure)
    result = model.train_process(1, dataset(), SCHEDULE, ckpt_dir=None, verbose=False)
    ramped = params(net)
    steps = [(r.accumulate_step, r.micro_batches, r.samples_consumed) for r in result.steps]
    assert steps == ([(2, 2, 8 * (i + 1)) for i in range(8)] + [(4, 4, 64 + 16 * (i + 1)) for i in range(6)] +
                     [(8, 8, 160 + 32 * (i + 1)) for i in range(3)] + [(8, 2, 264)])
    # K is a graph constant of the fused and window Cells: each structure builds one, for the table's largest K, and
    # trains shorter windows through it (one graph of the network, so one micro-batch's activations).
    assert sorted(getattr(model.runner(8), "cells", {})) == ([] if structure == "three_graphs" else [8])
    net, model = executor(structure)
    for lo, hi, k in SEGMENTS:
        model.train_process(1, dataset(lo, hi), k, ckpt_dir=None, verbose=False)
    assert all(np.array_equal(a, b) for a, b in zip(ramped, params(net)))
    # The same schedule as a callable: the same run, and the same one Cell (the callable evaluated ahead).
    net, model = executor(structure)
    model.train_process(1, dataset(), lambda s: 2 if s < 64 else 4 if s < 160 else 8, ckpt_dir=None, verbose=False)
    assert all(np.array_equal(a, b) for a, b in zip(ramped, params(net)))
    assert sorted(getattr(model.runner(8), "cells", {})) == ([] if structure == "three_graphs" else [8])


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_unequal_micro_batches_under_a_schedule_with_the_window_structure():
    # A dataset whose last batch is smaller: the window holding it runs through the three graphs on the same buffer
    # (TrainWindowCell stacks equal micro-batches only), every other window in one call; the result equals the fused
    # structure's.
    runs = {}
    for structure in ("window", "fused"):
        net, model = executor(structure)
        model.train_process(1, dataset(0, 262), SCHEDULE, ckpt_dir=None, verbose=False)
        runs[structure] = params(net)
    for a, b in zip(runs["window"], runs["fused"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_samples_lr_warms_up_over_samples_whatever_the_ramp():
    # Warm-up of 100 samples with nn.WarmUpLR read in samples; the ramp {0: 1, 32: 2, 96: 4} of micro-batches of 4.
    # Each window's rate is the closed form at the samples consumed when it opened: 0.1 * min(s, 100) / 100.
    ms.set_seed(0)
    net = nn.Dense(6, 3)
    lr = SamplesLR(nn.WarmUpLR(0.1, 100))
    model = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                 nn.SGD(net.trainable_params(), lr))
    seen, weights = [], [params(net)]

    def on_step(record):
        seen.append((lr.samples, float(lr.lr.asnumpy())))
        weights.append(params(net))
    model.train_process(1, dataset(0, 160), {0: 1, 32: 2, 96: 4}, ckpt_dir=None, verbose=False, on_step=on_step)
    opened = [0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80, 88, 96, 112, 128, 144]
    assert [s for s, _ in seen] == opened
    np.testing.assert_allclose([v for _, v in seen], [0.1 * min(s, 100) / 100 for s in opened], rtol=1e-6)
    first_full = next(s for s, v in seen if v == pytest.approx(0.1))
    assert first_full == 112  # the first window that opens after 100 samples; by steps it would be step 25's
    # The optimizer reads the rate: the first window (rate 0) left the weights alone, the second moved them.
    assert all(np.array_equal(a, b) for a, b in zip(weights[0], weights[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(weights[1], weights[2]))
    with raises_exactly(ValueError, "For 'SamplesLR', the schedule must give a finite learning rate, but at 0 samples "
                                    "it gave nan."):
        SamplesLR(lambda s: float("nan"))
    with raises_exactly(TypeError, "For 'SamplesLR', the argument 'schedule' must be a LearningRateSchedule or a "
                                   "callable lr(samples), but got 0.1 of type float."):
        SamplesLR(0.1)
    # A class is callable, but calling it builds a schedule: refused, naming the argument and the fix.
    with raises_exactly(TypeError, "For 'SamplesLR', the argument 'schedule' must be a LearningRateSchedule or a "
                                   "callable lr(samples), but got the class "
                                   "mindspore.nn.learning_rate_schedule.CosineDecayLR: give an instance of it, e.g. "
                                   "CosineDecayLR(...)."):
        SamplesLR(nn.CosineDecayLR)
    with raises_exactly(TypeError, "For 'SamplesLR', the argument 'schedule' must be a LearningRateSchedule or a "
                                   "callable lr(samples), but got the class builtins.float: give an instance or a "
                                   "function."):
        SamplesLR(float)


@pytest.mark.slow  # make test-all (make test answers within 8 minutes)
def test_resume_checks_the_schedule_and_takes_another_layout_of_the_same_global_batches(tmp_path):
    def run(ckpt, schedule, batch=B, **kwargs):
        ds.config.set_seed(7)
        net, model = executor()
        model.train_process(1, dataset(batch=batch), schedule, ckpt_dir=str(ckpt), ckpt_name="run", verbose=False,
                            save_every=1, keep_last=None, **kwargs)
        return params(net)

    whole = run(tmp_path / "whole", SCHEDULE)
    run(tmp_path / "cut", SCHEDULE)
    state = str(tmp_path / "cut" / "run-000000010.ckpt")  # 8 windows of K=2, 2 of K=4: inside the K=4 segment
    refused = (f"Checkpoint '{state}' was saved by a run whose global batch schedule (samples consumed: global "
               f"batch) is 0:8,64:16,160:32, but this run's is {{}}: from {{}} samples consumed the saved run's global "
               f"batch is 16, this run's {{}}; resuming would not continue the same training.")
    with raises_exactly(CheckpointError, refused.format("0:8,64:16,128:32", 128, 32)):
        run(tmp_path / "cut", {0: 2, 64: 4, 128: 8}, resume=state)
    with raises_exactly(CheckpointError, refused.format("0:8", 64, 8)):
        run(tmp_path / "cut", 2, resume=state)
    with raises_exactly(CheckpointError, refused.format("callable", 64, 12)):
        run(tmp_path / "cut", lambda s: 2 if s < 64 else 3, resume=state)
    # A saved run's callable is compared with this run's at every window the saved run opened, not only where its K
    # changed: K=2 everywhere, then a callable that agrees at 0 but differs at the window opened at 16 samples.
    run(tmp_path / "callable", lambda s: 2)
    by_callable = str(tmp_path / "callable" / "run-000000010.ckpt")  # windows at 0, 8, ..., 72
    with raises_exactly(CheckpointError, f"Checkpoint '{by_callable}' was saved by a run whose global batch schedule "
                                         f"(samples consumed: global batch) is callable, evaluated as 0:8 in the 10 "
                                         f"windows it opened up to 72 samples, but this run's is callable: from 16 "
                                         f"samples consumed the saved run's global batch is 8, this run's 16; resuming "
                                         f"would not continue the same training."):
        run(tmp_path / "callable", lambda s: 4 if s == 16 else 2, resume=by_callable)
    with raises_exactly(CheckpointError, f"Checkpoint '{by_callable}' was saved by a run whose global batch schedule "
                                         f"(samples consumed: global batch) is callable, evaluated as 0:8 in the 10 "
                                         f"windows it opened up to 72 samples, but this run's is 0:8,64:16: from 64 "
                                         f"samples consumed the saved run's global batch is 8, this run's 16; resuming "
                                         f"would not continue the same training."):
        run(tmp_path / "callable", {0: 2, 64: 4}, resume=by_callable)
    # Differing only after the saved position (80 samples) is another schedule from there on: it resumes.
    run(tmp_path / "callable", lambda s: 2 if s < 80 else 4, resume=by_callable)
    # Micro-batches of 2 with twice the K keep every global batch (as another device count would): it resumes.
    resumed = run(tmp_path / "cut", {0: 4, 64: 8, 160: 16}, batch=2, resume=state)
    for a, b in zip(whole, resumed):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert find_latest(str(tmp_path / "cut"), "run").endswith("run-000000018.ckpt")


def test_a_callable_resuming_a_table_is_checked_at_every_window_it_can_still_open(tmp_path):
    # Saved under the table K=2 to 32 samples, then K=4, after its first window (8 samples): the windows it opened say
    # nothing of 16 samples, where a callable that gives K=4 from 16 on parts from the table; refused there.
    def run(schedule, **kwargs):
        ds.config.set_seed(7)
        net, model = executor()
        model.train_process(1, dataset(0, 64), schedule, ckpt_dir=str(tmp_path), ckpt_name="run", verbose=False,
                            save_every=1, keep_last=None, **kwargs)
        return params(net)

    whole = run({0: 2, 32: 4})
    state = str(tmp_path / "run-000000001.ckpt")
    with raises_exactly(CheckpointError, f"Checkpoint '{state}' was saved by a run whose global batch schedule "
                                         f"(samples consumed: global batch) is 0:8,32:16, but this run's is callable: "
                                         f"from 16 samples consumed the saved run's global batch is 8, this run's 16; "
                                         f"resuming would not continue the same training."):
        run(lambda s: 2 if s < 16 else 4, resume=state)
    # The table's own K at every window ahead, as a callable: the same training.
    resumed = run(lambda s: 2 if s < 32 else 4, resume=state)
    for a, b in zip(whole, resumed):
        np.testing.assert_array_equal(a, b)

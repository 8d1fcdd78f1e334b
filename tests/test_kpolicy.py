"""One contract for K (`KPolicy`): looking ahead is pure, deciding happens once per window as it opens, and a fixed K, a
schedule and `AdaptiveK` run through the same code."""
import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import AccumulationSchedule, AdaptiveK, GradientAccumulation, QUIET, StatisticsOptions
from ms_accum.core.statistics import NoiseScale
from ms_accum.train.adaptive import Controller
from ms_accum.train.kpolicy import KPolicy
from ms_accum.train.run import Run
from ms_accum.train.windows import Position, _planned_windows


def estimate(value: float, beta: float = 0.99) -> NoiseScale:
    """A NoiseScale whose estimate is `value`."""
    noise = NoiseScale(beta)
    noise.windows, noise.g2, noise.trace = 1, (1 - beta) * 1.0, (1 - beta) * value
    return noise


def controller(value: float, **settings) -> Controller:
    """A controller over micro-batches of 16 samples whose estimate is `value`."""
    made = Controller(AdaptiveK(2, 32, **settings), 16, estimate(value))
    made.observe(32.0, 2)
    return made


# On the host: no graph runs.

POINTS = [0, 63, 64, 100, 159, 160, 10 ** 6, 5, 0]  # in any order, again and again


@pytest.mark.parametrize("given, expected", [
    (4, [4] * len(POINTS)),
    ({0: 2, 64: 4, 160: 8}, [2, 2, 4, 4, 4, 8, 8, 2, 2]),
    (lambda s: 1 + s // 100, [1, 1, 1, 2, 2, 2, 10001, 1, 1]),
], ids=["int", "dict", "callable"])
def test_a_schedules_peek_is_its_decision_whenever_asked(given, expected):
    schedule = AccumulationSchedule(given)
    assert schedule.for_run(16) is schedule  # it keeps no state: it is its own run's policy
    assert [schedule.peek(s) for s in POINTS] == expected
    assert [schedule.open_window(s) for s in POINTS] == expected


def test_no_k_policy_is_called():
    """Looking ahead and deciding have a name each: calling a controller (which would decide) is a TypeError."""
    with pytest.raises(TypeError, match="'Controller' object is not callable"):
        AdaptiveK(2, 8).for_run(16)(0)  # pylint: disable=not-callable


def test_a_controllers_peek_knows_k_up_to_the_next_decision_and_changes_nothing():
    k = controller(320.0, min_samples=64, every=32)  # target: 320 / 16 = 20 micro-batches
    before = k.state()
    assert [k.peek(s) for s in (0, 63, 64, 10 ** 6, 10)] == [2, 2, None, None, 2]
    assert k.state() == before and k.decisions == 0
    assert k.open_window(64) == 20 and k.peek(95) == 20 and k.peek(96) is None


def test_a_look_ahead_between_decisions_changes_nothing():
    def decide(peeking: bool):
        k = controller(320.0, min_samples=64, every=48, max_change=2.0)
        ks = []
        for i, samples in enumerate(range(0, 800, 32)):
            if peeking:  # everywhere: behind, at the decision point, far ahead
                [k.peek(s) for s in (0, samples, k.next_decision, samples + 10 ** 5)]
            ks.append(k.open_window(samples))
            k.noise = estimate(320.0 + 40 * i)  # the estimate moves between windows, as in a run
        return ks, k.state()

    assert decide(peeking=True) == decide(peeking=False)
    assert len(set(decide(peeking=False)[0])) > 2


def test_the_plan_stops_where_k_is_decided_from_measurements():
    schedule = AccumulationSchedule({0: 2, 64: 4})
    assert [k for k, _, _ in _planned_windows(1, 40, schedule, 4, Position())] == [2] * 8 + [4] * 6
    k = controller(320.0, min_samples=64, every=32)
    assert _planned_windows(1, 40, k, 4, Position()) is None  # K=2 to 64 samples, then decided as windows open
    assert k.decisions == 0 and k.k_max == 32


def test_what_checkpoints_record_comes_from_the_contract():
    assert AccumulationSchedule(4).describe(8) == {"accumulate_step": 4, "global_batches": "0:32", "adaptive_k": ""}
    assert AccumulationSchedule({0: 2, 64: 4}).describe(8, [(0, 16)]) == {
        "accumulate_step": 0, "global_batches": "0:16,64:32", "adaptive_k": ""}  # known ahead: its table
    adaptive = AdaptiveK(2, 8, min_samples=32, every=32)
    k = adaptive.for_run(8)
    assert isinstance(k, KPolicy) and k.noise is not None and k.noise.beta == adaptive.beta
    assert k.describe(8) == {"accumulate_step": 0, "global_batches": "adaptive", "adaptive_k": adaptive.settings(8)}
    assert k.describe(8, [(0, 16), (32, 48)])["global_batches"] == "0:16,32:48"  # where it decided, after the run


# Through train_process.

def data(samples=256):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((samples, 10)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.standard_normal(samples) > 0).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)


def train(mini_steps):
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(10, 16), nn.ReLU(), nn.Dense(16, 2)])
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    nn.SGD(net.trainable_params(), 0.1), statistics=StatisticsOptions(noise_scale=True))
    result = executor.train_process(2, data(), mini_steps, checkpoints=None, log=QUIET)
    return result, [p.asnumpy() for p in net.trainable_params()]


ADAPTIVE = {"min_samples": 32, "every": 16, "threshold": 0.1}


@pytest.mark.parametrize("mini_steps", [3, {0: 2, 128: 4}, AdaptiveK(2, 8, **ADAPTIVE)], ids=["int", "dict", "adaptive"])
def test_every_kind_runs_through_one_contract(mini_steps, monkeypatch):
    calls = []
    for kind, method in ((AccumulationSchedule, "peek"), (AccumulationSchedule, "open_window"),
                         (AccumulationSchedule, "__call__"), (Controller, "peek"), (Controller, "open_window")):
        original = getattr(kind, method)

        def spy(self, samples, original=original, method=method):
            calls.append((method, samples))
            return original(self, samples)

        monkeypatch.setattr(kind, method, spy)

    result, _ = train(mini_steps)
    opened = [0] + [record.samples_consumed for record in result.steps[:-1]]
    # Decided once per window, when it opened, in order; everything else only looked (and nothing called the
    # schedule's deprecated __call__).
    assert [samples for method, samples in calls if method == "open_window"] == opened
    assert {method for method, _ in calls} == {"peek", "open_window"}


def test_looking_ahead_inside_a_run_moves_no_decision(monkeypatch):
    expected, expected_params = train(AdaptiveK(2, 8, **ADAPTIVE))
    ks = [record.accumulate_step for record in expected.steps]
    assert len(set(ks)) > 1, ks
    open_window = Run.open

    def peeking(self, opened_at, k):  # before every window: peek behind, here and far ahead
        for samples in (0, opened_at, opened_at + 8, opened_at + 10 ** 6):
            self.k.peek(samples)
        open_window(self, opened_at, k)

    monkeypatch.setattr(Run, "open", peeking)
    got, params = train(AdaptiveK(2, 8, **ADAPTIVE))
    assert [record.accumulate_step for record in got.steps] == ks
    assert [record.noise_scale for record in got.steps] == [record.noise_scale for record in expected.steps]
    assert all(np.array_equal(a, b) for a, b in zip(params, expected_params))

"""verify_equivalence: passes where accumulation is exact, fails where it is not, leaves the model alone."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore import nn, ops

from ms_accum import verify_equivalence
from ms_accum.core import _ops
from conftest import batch_for, make_net, raises_exactly


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def small_net():
    ms.set_seed(0)
    return nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 3)])


def small_batch(n=16):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def state_of(network, optimizer):
    """Every value the updates change: the network's parameters, the optimizer's step, moments and rates."""
    owned = [*network.get_parameters(), *(p for _, p in optimizer.parameters_and_names())]
    return {p.name: p.asnumpy().copy() for p in owned}


# Rates that move at every step: a list read at global_step, and a schedule MindSpore builds as such a list.
MOVING = [
    ("sgd", lambda params: nn.SGD(params, nn.piecewise_constant_lr([1, 2, 3], [0.1, 0.05, 0.02]))),
    ("momentum", lambda params: nn.Momentum(params, [0.1, 0.05, 0.02], 0.9)),
    ("adam", lambda params: nn.Adam(params, [0.01, 0.005, 0.002])),
]


@pytest.mark.parametrize("name,optimizer", MOVING, ids=[name for name, _ in MOVING])
def test_passes_over_three_windows_with_a_moving_rate_and_leaves_everything_as_given(name, optimizer):
    network = small_net()
    optimizer = optimizer(network.trainable_params())
    before = state_of(network, optimizer)
    report = verify_equivalence(network, loss_fn(), optimizer, small_batch(), 4)
    assert report.passed, str(report)
    assert (report.windows, report.first_failed_window, len(report.per_window)) == (3, None, 3)
    assert report.max_abs_diff == max(a for a, _ in report.per_window) <= 1e-6
    assert report.max_abs_diff == max(a for a, _ in report.per_parameter.values())
    assert str(report).startswith("PASSED (three_graphs, 1 process): 2 windows of 4 accumulated micro-batches and a "
                                  "partial window of 3 vs 3 big-batch steps: max abs ")
    after = state_of(network, optimizer)
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)
    assert int(after["global_step"][0]) == 0


def _left_as_it_is(grad_sum):
    return grad_sum  # a def: graph mode cannot parse a lambda written inside a call


def test_a_window_that_keeps_the_last_ones_gradient_fails_at_window_2(monkeypatch):
    # The buffer's clear after an update, broken on purpose: `_step` zeroes the buffer through `zero_finite`, which
    # the graph reads from `_ops` when it is compiled, so each cell built while it is patched keeps the window's mean.
    monkeypatch.setattr(_ops, "zero_finite", _left_as_it_is)
    for structure in ("auto", "cached"):
        network = small_net()
        report = verify_equivalence(network, loss_fn(), nn.Momentum(network.trainable_params(), 0.1, 0.9),
                                    small_batch(), 4, structure=structure)
        assert not report.passed and report.first_failed_window == 2, str(report)
        assert report.per_window[0][0] <= 1e-6 < report.per_window[1][0]
        assert "window 2 of 3 first differs" in str(report).splitlines()[0]
        assert [cause.name for cause in report.causes] == ["a buffer not cleared after the update"]
        assert "after window 1's update the accumulation buffer still held" in report.causes[0].evidence
    # One window never sees it: the first window starts from a zero buffer.
    network = small_net()
    assert verify_equivalence(network, loss_fn(), nn.Momentum(network.trainable_params(), 0.1, 0.9), small_batch(),
                              4, windows=1).passed
    monkeypatch.undo()  # and a cell built once the clear is back passes again
    network = small_net()
    assert verify_equivalence(network, loss_fn(), nn.Momentum(network.trainable_params(), 0.1, 0.9), small_batch(),
                              4).passed


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("kind,k,n", [("mlp", 4, 32), ("lenet5", 3, 22)])
def test_passes_and_leaves_network_and_optimizer_untouched(kind, k, n):
    net = make_net(kind)
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    before = [p.asnumpy().copy() for _, p in optimizer.parameters_and_names()]
    report = verify_equivalence(net, loss_fn(), optimizer, batch_for(kind, n, seed=0), k)
    assert report.passed, str(report)
    assert report.accumulate_step == k and not report.moved_between_updates
    assert 0 <= report.max_abs_diff <= 1e-6
    assert str(report).startswith("PASSED (three_graphs, 1 process): ")
    after = [p.asnumpy() for _, p in optimizer.parameters_and_names()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_what_earlier_windows_carried_is_named_at_the_first_that_differs():
    # Read from each run's record, no network needed: the first window that kept its buffer, the first step count
    # that differs up to the failing window, and nothing from a window after it.
    from ms_accum.tools.verify import _carried, _Run
    expected = _Run(steps=[1, 2, 3])
    clean = _Run(steps=[1, 2, 3], left=[0.0, 0.0, 0.0])
    assert _carried(expected, clean, 2) == []
    kept = _Run(steps=[1, 2, 3], left=[0.0, 0.25, 0.5])
    assert _carried(expected, kept, 2) == []
    [cause] = _carried(expected, kept, 3)
    assert cause.evidence.startswith("after window 2's update the accumulation buffer still held values up to "
                                     "2.500e-01 instead of zeros, so window 3 added")
    [cause] = _carried(expected, _Run(steps=[1, 1, 2], left=[0.0] * 3), 2)
    assert cause.name == "an optimizer that counted other steps"
    assert cause.evidence.startswith("after window 2 the optimizer's global_step is 1, after 2 big-batch steps 2: ")


def test_detects_batchnorm_which_accumulation_cannot_reproduce():
    # BatchNorm normalises each micro-batch by its own statistics: K small batches are not one big batch.
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dense(32, 10)])
    report = verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), batch_for("mlp", 16, seed=1), 4)
    assert not report.passed
    assert report.max_abs_diff > 1e-4
    assert str(report).startswith("FAILED (three_graphs, 1 process): ")
    worst = max(report.per_parameter, key=lambda name: report.per_parameter[name][0])
    assert report.per_parameter[worst][0] == report.max_abs_diff
    # It says why, and what to do, and leaves BatchNorm's running statistics as they were.
    assert [cause.name for cause in report.causes] == ["BatchNorm layers in training mode"]
    assert "2 normalize each micro-batch by its own mean and variance" in report.causes[0].evidence  # cell "2"
    assert "replace_batchnorm" in str(report)
    assert not net[2].moving_mean.asnumpy().any()


class _BatchCentred(nn.Cell):
    """A loss that couples the samples of a batch: logits centred on the batch's mean logit."""

    def __init__(self):
        super().__init__()
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, labels):
        return self.loss(logits * 3.0 - logits.mean(0, keep_dims=True) * 2.0, labels)


class _Summing(nn.Cell):
    def __init__(self):
        super().__init__()
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, logits, labels):
        return self.loss(logits, labels).sum()


@pytest.mark.slow  # make test-all
def test_names_a_loss_that_sums_an_optimizer_that_magnifies_rounding_and_a_coupled_loss():
    batch = batch_for("mlp", 16, seed=1)
    net = make_net("mlp")
    # A Cell of one's own that sums without saying so: the window is a mean, the large batch's a sum.
    summing = verify_equivalence(net, _Summing(), nn.SGD(net.trainable_params(), 0.1), batch, 4)
    assert not summing.passed and [c.name for c in summing.causes] == [
        "a loss that sums over the batch instead of averaging"]
    assert "the big batch's gradient is 4.00x the window's (K = 4)" in summing.causes[0].evidence
    # A MindSpore loss built with reduction="sum" says so, and is accumulated as the sum it is.
    net = make_net("mlp")
    assert verify_equivalence(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"),
                              nn.SGD(net.trainable_params(), 0.01), batch, 4).passed

    net = make_net("mlp")
    coupled = verify_equivalence(net, _BatchCentred(), nn.SGD(net.trainable_params(), 0.1), batch, 4)
    assert not coupled.passed and [c.name for c in coupled.causes] == ["a loss that couples the samples of a batch"]


def test_bad_arguments():
    net = make_net("mlp")
    args = (net, loss_fn(), nn.SGD(net.trainable_params()), batch_for("mlp", 4, seed=0))
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'accumulate_step' must be a positive int, "
                                    "but got 0."):
        verify_equivalence(*args, 0)
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'accumulate_step' must not exceed the "
                                    "batch size 4, but got 5."):
        verify_equivalence(*args, 5)
    with raises_exactly(TypeError, "For 'verify_equivalence', the argument 'optimizer' must be Optimizer, but got None "
                                   "of type NoneType."):
        verify_equivalence(net, loss_fn(), None, args[3], 2)
    x, y = args[3]
    with raises_exactly(ValueError, f"For 'verify_equivalence', the argument 'inputs' must be arrays sharing their "
                                    f"first (batch) axis, but got shapes [{x.shape}, (3,)]."):
        verify_equivalence(*args[:3], (x, y[:3]), 2)
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'rtol' must be a positive float, but got "
                                    "-1.0."):
        verify_equivalence(*args, 2, rtol=-1.0)
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'windows' must be a positive int, but got "
                                    "0."):
        verify_equivalence(*args, 2, windows=0)
    with raises_exactly(TypeError, "For 'verify_equivalence', the argument 'windows' must be a positive int, but got "
                                   "2.0 of type float."):
        verify_equivalence(*args, 2, windows=2.0)
    # It builds a TrainAccumulationCell and its buffer: a bad reduction is still refused in its own name.
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'reduction' must be one of ['mean', 'sum', "
                                    "'weighted_mean'], but got 'avg'."):
        verify_equivalence(*args, 2, reduction="avg")


ZOO_SCRIPT = """
import json, sys
import ms_accum
import numpy as np
import mindspore as ms
from mindspore import nn, ops
import mindcv  # a test dependency (pyproject), so a missing install fails rather than skips

ms.set_context(mode=ms.GRAPH_MODE)
reports = {}
for model in ("resnet18", "convnext_tiny"):
    ms.set_seed(0)
    net = mindcv.create_model(model, num_classes=10)
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((16, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, 16).astype(np.int32))
    report = ms_accum.verify_equivalence(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                         nn.Momentum(net.trainable_params(), 0.01, 0.9), batch, 4)
    reports[model] = {"passed": report.passed, "causes": [[c.name, c.evidence] for c in report.causes]}
print(json.dumps(reports))
"""


@pytest.mark.slow  # make test-all
def test_real_models_of_mindspores_zoo(tmp_path):
    # mindcv's resnet18 has BatchNorm layers: named, with the fix; convnext_tiny (LayerNorm) passes. In a process of
    # its own: MindSpore keeps these large networks until exit, and tears them down noisily then.
    script = tmp_path / "zoo.py"
    script.write_text(ZOO_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert reports["convnext_tiny"] == {"passed": True, "causes": []}
    assert reports["resnet18"]["passed"] is False
    [(name, evidence)] = reports["resnet18"]["causes"]
    assert name == "BatchNorm layers in training mode"
    assert evidence.startswith("20 layer(s), bn1, layer1.0.bn1, layer1.0.bn2, layer1.1.bn1, layer1.1.bn2 and 15 more "
                               "normalize each micro-batch")


# The executor's own path: each structure, its options, its dropout, its faults.

def momentum_case(net_builder=small_net, lr=0.1):
    network = net_builder()
    return network, loss_fn(), nn.Momentum(network.trainable_params(), lr, 0.9)


def test_every_structure_is_verified_through_its_own_path_and_says_which_tolerance_decided():
    report = verify_equivalence(*momentum_case(), small_batch(), 4, structure="all")
    assert report.passed and report.structure == "all", str(report)
    assert list(report.by_structure) == ["three_graphs", "fused", "window", "cached"] and not report.refused
    lines = str(report).splitlines()
    assert lines[0] == "PASSED: 4 structure(s) verified"
    for name, each in report.by_structure.items():
        assert each.structure == name and each.passed and each.ranks == 1 and each.partial_window == 3
        assert each.decided_by in ("rtol", "atol", "rtol and atol")
        assert each.verdict().startswith(f"PASSED ({name}, 1 process): 2 windows of 4 accumulated micro-batches "
                                         f"and a partial window of 3 vs 3 big-batch steps: ")
        assert each.verdict().endswith({"rtol": "(passed by rtol 1e-05 alone; atol 1e-06 not needed)",
                                        "atol": "(passed by atol 1e-06: the relative differences exceed rtol 1e-05)",
                                        "rtol and atol": "(passed by rtol 1e-05 and atol 1e-06 together)"}[
                                            each.decided_by])
    # "auto" verifies what the executor runs; a tolerance that the differences exceed fails, saying so.
    auto = verify_equivalence(*momentum_case(), small_batch(), 4)
    assert auto.structure == "three_graphs" and auto.passed
    tight = verify_equivalence(*momentum_case(), small_batch(), 4, rtol=1e-12, atol=1e-12)
    assert tight.passed is (tight.max_abs_diff == 0.0)
    if not tight.passed:
        assert tight.verdict().endswith("(beyond rtol 1e-12 x |reference| + atol 1e-12)")


def _clears_window_2(follow):
    """A closer that clears window 2 and says it applied it: a fault of the executor's path alone."""
    calls = []

    def faulty(self, verdict):
        calls.append(1)
        if len(calls) == 2:
            self.clear()
            return True
        return follow(self, verdict)
    return faulty


@pytest.mark.parametrize("structure", ["three_graphs", "fused", "window", "cached"])
def test_a_fault_in_the_closer_fails_verify_at_the_window_it_breaks(structure, monkeypatch):
    from ms_accum.train.structures import base
    monkeypatch.setattr(base.Closer, "follow", _clears_window_2(base.Closer.follow))
    report = verify_equivalence(*momentum_case(), small_batch(), 4, structure=structure)
    assert not report.passed and report.first_failed_window == 2, str(report)
    assert report.verdict().startswith(f"FAILED ({structure}, 1 process): ")
    assert "window 2 of 3 first differs" in report.verdict()
    monkeypatch.undo()
    assert verify_equivalence(*momentum_case(), small_batch(), 4, structure=structure).passed


class _FirstStacked:
    """numpy for `structures.window` whose `stack` stacks the first micro-batch K times: a stacking fault."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def stack(arrays):
        return np.stack([arrays[0]] * len(arrays))


def _every_stacked(set_micro_batches):
    def faulty(self, count):  # trains the padding copies too: a padding fault
        return set_micro_batches(self, self.accumulate_step)
    return faulty


def test_a_fault_in_the_windows_stacking_or_padding_fails_verify_for_the_window_structure(monkeypatch):
    from ms_accum.graphs.window import TrainWindowCell
    from ms_accum.train.structures import window
    monkeypatch.setattr(window, "np", _FirstStacked())
    stacked = verify_equivalence(*momentum_case(), small_batch(), 4, structure="window")
    assert not stacked.passed and stacked.first_failed_window == 1, str(stacked)
    assert verify_equivalence(*momentum_case(), small_batch(), 4).passed  # three_graphs does not stack
    monkeypatch.undo()
    monkeypatch.setattr(TrainWindowCell, "set_micro_batches", _every_stacked(TrainWindowCell.set_micro_batches))
    padded = verify_equivalence(*momentum_case(), small_batch(), 4, structure="window")
    assert not padded.passed and padded.first_failed_window == 3 and padded.partial_window == 3, str(padded)
    # Only the partial window is padded: full windows alone do not see it.
    assert verify_equivalence(*momentum_case(), small_batch(), 4, structure="window", partial_window="drop").passed
    monkeypatch.undo()
    assert verify_equivalence(*momentum_case(), small_batch(), 4, structure="window").passed


def test_the_options_a_run_trains_with_are_verified_with_their_large_batch_meaning(monkeypatch):
    from mindspore import amp
    from ms_accum import GuardOptions, StatisticsOptions, WindowOptions
    from ms_accum.tools import reference
    clip = WindowOptions(clip_norm=0.05)
    assert verify_equivalence(*momentum_case(), small_batch(), 4, window=clip).passed
    # The window's gradient is clipped (its norm is well above 0.05 here): a reference that did not clip differs.
    monkeypatch.setattr(reference, "clipped", lambda grads, clip_norm: grads)
    unclipped = verify_equivalence(*momentum_case(), small_batch(), 4, window=clip)
    assert not unclipped.passed and unclipped.first_failed_window == 1
    monkeypatch.undo()
    scaler = amp.DynamicLossScaler(2.0 ** 10, scale_factor=2, scale_window=1)
    for options in ({"guard": GuardOptions(loss_scaler=amp.StaticLossScaler(1024.0))},
                    {"guard": GuardOptions(policy="skip_microbatch", loss_scaler=scaler)},
                    {"statistics": StatisticsOptions(norms=True, noise_scale=True)},
                    {"window": WindowOptions(clip_norm=0.05, buffer_dtype=ms.float64)}):
        report = verify_equivalence(*momentum_case(), small_batch(), 4, structure="all", **options)
        assert report.passed and len(report.by_structure) + len(report.refused) == 4, (options, str(report))
    assert float(scaler.scale_value.asnumpy()) == 2.0 ** 10  # the user's scaler is left as given
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'skip_outliers' has no large-batch "
                                    "meaning, but got 2.0: it leaves micro-batches out of their window by the running "
                                    "statistics of earlier ones, which one step on the whole batch does not have; "
                                    "verify without it."):
        verify_equivalence(*momentum_case(), small_batch(), 4, statistics=StatisticsOptions(skip_outliers=2.0))
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'reduction' and window.reduction must "
                                    "agree, but got 'sum' and 'mean'."):
        verify_equivalence(*momentum_case(), small_batch(), 4, reduction="sum", window=WindowOptions("mean"))


class _FunctionalDropout(nn.Cell):
    """Dropout through `ops.dropout` in a construct: randomness ms_accum does not draw."""

    def construct(self, x):
        return ops.dropout(x, p=0.5, training=self.training)


def test_dropout_is_compared_in_training_mode_with_the_masks_the_window_drew(monkeypatch):
    from ms_accum.core.inference import in_inference
    from ms_accum.tools import verify
    from ms_accum.tools.reference import SAME_MASKS
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(784, 32), nn.Dropout(p=0.5), nn.ReLU(), nn.Dense(32, 10)])
    training = [cell.training for _, cell in net.cells_and_names()]
    report = verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), batch_for("mlp", 16, seed=1), 4,
                                structure="all")
    assert report.passed and report.inference_mode == [], str(report)
    assert all(each.reference == SAME_MASKS for each in report.by_structure.values())
    assert "compared with the large batch with the masks the window drew" in str(report)
    assert [cell.training for _, cell in net.cells_and_names()] == training
    # The masks matter: a reference with the dropout held as in inference (the old comparison) differs.
    real = verify._Comparison._reference_run

    def without_masks(self, plan):
        hold = self.hold
        with in_inference(self.executor.network, ["2"]) as inner:
            self.hold = lambda: (hold(), inner())
            try:
                return real(self, plan)
            finally:
                self.hold = hold
    monkeypatch.setattr(verify._Comparison, "_reference_run", without_masks)
    assert not verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), batch_for("mlp", 16, seed=1),
                                  4).passed
    monkeypatch.undo()
    # Masks drawn by MindSpore's kernels cannot be drawn again: that cell runs as in inference, named.
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(8, 16), _FunctionalDropout(), nn.Dense(16, 3)])
    report = verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), small_batch(), 4)
    assert report.passed and report.inference_mode == ["1"], str(report)
    assert "compared with 1 in inference mode" in str(report)


def test_causes_come_from_the_structures_own_gradient_in_every_structure():
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dense(32, 10)])
    report = verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), batch_for("mlp", 16, seed=1), 4,
                                structure="all")
    assert not report.passed
    for name, each in report.by_structure.items():
        [cause] = each.causes
        assert cause.name == "BatchNorm layers in training mode", (name, str(each))
        grad_diff = float(cause.evidence.rsplit("differ by up to ", 1)[1])
        assert grad_diff > 1e-4, (name, cause.evidence)  # a real gradient's difference, "cached" included


@pytest.mark.slow  # make test-all
@pytest.mark.distributed
def test_under_msrun_verify_compares_the_data_parallel_window_on_every_rank(tmp_path):
    from test_distributed import WORKERS, log_lines, msrun, rank_reports, worker_logs
    ranks = rank_reports(tmp_path, "verify_worker.py", "verify")
    assert ranks[0] == ranks[1]  # every rank reports the same verdict
    results = ranks[0]
    assert results["all"]["passed"] and results["all"]["ranks"] == 2, results["all"]["text"]
    assert results["all"]["structures"] == {"three_graphs": True, "fused": True, "window": True, "cached": True}
    assert "(fused, 2 ranks)" in results["all"]["text"]
    assert results["unequal"]["passed"], results["unequal"]["text"]
    assert results["sharded"]["passed"], results["sharded"]["text"]
    assert results["dropout"]["passed"] and "masks the window drew" in results["dropout"]["reference"]
    # The ranks' shares never summed: each applies its own part of the window, which verify sees at window 1.
    assert not results["unreduced"]["passed"] and results["unreduced"]["first_failed_window"] == 1
    assert results["unreduced"]["text"].startswith("FAILED (three_graphs, 2 ranks): ")
    assert "cause: ranks whose windows were not combined: after window 1's all-reduce" in results["unreduced"]["text"]
    # ms-accum verify under msrun: the data-parallel window of every structure, sharded, the same verdict on each rank.
    from ms_accum.demo.data import make_synthetic_mnist
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=64, num_test=16)
    command = [os.path.join(os.path.dirname(sys.executable), "ms-accum"), "verify", "--model", "mlp",
               "--accumulate-step", "2", "--batch-size", "8", "--data", data, "--structure", "all",
               "--shard-optimizer", "--json"]
    code, output = msrun(str(tmp_path / "cli_logs"), *command)
    assert code == 0, f"msrun failed ({code}):\n{output[-3000:]}\n{worker_logs(str(tmp_path / 'cli_logs'))}"
    reports = [json.loads([line for line in log_lines(str(tmp_path / "cli_logs"), rank) if line.startswith("{")][-1])
               for rank in range(WORKERS)]
    assert reports[0] == reports[1] and reports[0]["passed"] and reports[0]["shard_optimizer"]
    assert {name: (v["ranks"], v["passed"]) for name, v in reports[0]["verdicts"].items()} == {
        name: (2, True) for name in ("three_graphs", "fused", "window", "cached")}

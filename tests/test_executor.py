"""GradientAccumulation: partial windows, unequal micro-batches, logging, checkpoints, argument checks."""
import functools
import os

import numpy as np
import pytest
import mindspore.dataset as ds
from mindspore import Tensor, nn

from ms_accum import GradientAccumulation
from conftest import batch_for, make_net, params_of, raises_exactly


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


@functools.lru_cache(maxsize=None)
def big_batch_trajectory(seed, n, bounds):
    """Reference: one TrainOneStepCell step on each slice `bounds` of `batch_for("mlp", n, seed)`; the parameters
    after each step. Computed once per module and shared by the structures compared with it (a compile of the
    reference costs as much as the graph under test); nothing mutates the returned arrays."""
    x, y = batch_for("mlp", n, seed=seed)
    net = make_net("mlp")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn()), nn.Momentum(net.trainable_params(), 0.05, 0.9))
    step.set_train()
    after = []
    for lo, hi in bounds:
        step(Tensor(x[lo:hi]), Tensor(y[lo:hi]))
        after.append(params_of(net))
    return after


def big_batch_steps(seed, n, bounds):
    """The parameters after the reference's steps on the slices `bounds` of `batch_for("mlp", n, seed)`."""
    return big_batch_trajectory(seed, n, bounds)[-1]


def dataset(x, y, batch_size, drop_remainder=False):
    return ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(batch_size, drop_remainder)


def executor(structure="fused", **kwargs):
    net = make_net("mlp")
    return net, GradientAccumulation(net, loss_fn(), nn.Momentum(net.trainable_params(), 0.05, 0.9),
                                     structure=structure, **kwargs)


# make test: the default structure; make test-all: the other two (test_window checks the window Cell against the fused).
SLOW_STRUCTURES = [pytest.param(s, marks=pytest.mark.slow) for s in ("fused", "window")]

PARTIAL_WINDOWS = ((0, 16), (16, 32), (32, 40))  # 40 samples in windows of K=4 x 4: 16, 16 and a partial 8


@pytest.mark.parametrize("structure", [*SLOW_STRUCTURES, "three_graphs"])
def test_partial_window_is_applied_as_mean_of_samples_seen(structure, tmp_path):
    # 10 batches of 4 with K=4: windows of 16, 16 and a partial window of 8 samples.
    x, y = batch_for("mlp", 40, seed=1)
    expected = big_batch_steps(1, 40, PARTIAL_WINDOWS)
    net, ex = executor(structure)
    result = ex.train_process(1, dataset(x, y, 4), mini_steps=4, ckpt_dir=str(tmp_path), verbose=False)
    assert [r.micro_batches for r in result.steps] == [4, 4, 2]
    assert [r.samples for r in result.steps] == [16, 16, 8]
    for a, e in zip(params_of(net), expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_partial_window_can_be_dropped(tmp_path):
    x, y = batch_for("mlp", 40, seed=1)
    expected = big_batch_trajectory(1, 40, PARTIAL_WINDOWS)[1]  # the reference after the two full windows' steps
    net, ex = executor()
    result = ex.train_process(1, dataset(x, y, 4), mini_steps=4, partial_window="drop", ckpt_dir=str(tmp_path),
                              verbose=False)
    assert len(result.steps) == 2 and result.dropped_windows == 1
    for a, e in zip(params_of(net), expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    assert int(ex.buffer.mini_step.asnumpy()) == 0
    assert not any(b.asnumpy().any() for b in ex.buffer.grad_sum)


@pytest.mark.parametrize("structure", [*SLOW_STRUCTURES, "three_graphs"])
def test_unequal_micro_batches_match_concatenated_batch(structure, tmp_path):
    # 22 samples in batches of 8: 8, 8, 6 -> with K=3 one window of all 22, the last micro-batch smaller.
    x, y = batch_for("mlp", 22, seed=2)
    expected = big_batch_steps(2, 22, ((0, 22),))
    net, ex = executor(structure)
    result = ex.train_process(1, dataset(x, y, 8), mini_steps=3, ckpt_dir=str(tmp_path), verbose=False)
    assert [r.samples for r in result.steps] == [22]
    for a, e in zip(params_of(net), expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_windows_restart_each_epoch_and_log_window_loss(tmp_path, capsys):
    x, y = batch_for("mlp", 24, seed=3)
    net, ex = executor()
    seen = []
    result = ex.train_process(2, dataset(x, y, 4), mini_steps=4, ckpt_dir=str(tmp_path), on_step=seen.append)
    # 6 batches per epoch: windows of 4 + partial 2, per epoch
    assert [(r.epoch, r.step, r.micro_batches) for r in result.steps] == [(1, 1, 4), (1, 2, 2), (2, 3, 4),
                                                                          (2, 4, 2)]
    assert seen == result.steps
    out = capsys.readouterr().out
    assert "epoch: 2 step: 4 loss is" in out
    assert all(np.isfinite(result.losses))


def test_window_loss_is_sample_weighted_mean_of_micro_batch_losses(tmp_path):
    x, y = batch_for("mlp", 12, seed=4)
    net, ex = executor()
    start = make_net("mlp")  # same seed, same starting weights: the loss before the only update
    logits = start(Tensor(x))
    expected = float(loss_fn()(logits, Tensor(y)).asnumpy())
    result = ex.train_process(1, dataset(x, y, 8), mini_steps=2, ckpt_dir=str(tmp_path), verbose=False)
    assert result.losses[0] == pytest.approx(expected, rel=1e-5)


def test_saves_checkpoint_with_metadata(tmp_path):
    from ms_accum.train.checkpoint import load_checkpoint
    x, y = batch_for("mlp", 16, seed=5)
    net, ex = executor()
    result = ex.train_process(1, dataset(x, y, 4), mini_steps=2, ckpt_dir=str(tmp_path / "out"),
                              ckpt_name="run", verbose=False, metadata={"model": "mlp"})
    assert result.checkpoint == os.path.join(str(tmp_path / "out"), "run.ckpt")
    params, meta = load_checkpoint(result.checkpoint)
    assert meta["model"] == "mlp" and meta["step"] == 2 and meta["accumulate_step"] == 2 and meta["epoch"] == 1
    for p in net.trainable_params():
        np.testing.assert_array_equal(params[p.name].asnumpy(), p.asnumpy())


def test_mini_steps_larger_than_epoch_warns_and_trains(tmp_path):
    x, y = batch_for("mlp", 12, seed=6)
    expected = big_batch_steps(6, 12, ((0, 12),))
    net, ex = executor()
    with pytest.warns(UserWarning, match="'mini_steps' \\(5\\) is larger than an epoch's 3 batches"):
        result = ex.train_process(1, dataset(x, y, 4), mini_steps=5, ckpt_dir=str(tmp_path), verbose=False)
    assert len(result.steps) == 1
    for a, e in zip(params_of(net), expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


# ---- argument checks: raised before anything compiles or trains -------------------------------------------

@pytest.mark.parametrize("value,error,tail", [
    (0, ValueError, ", but got 0."), (-2, ValueError, ", but got -2."),
    (2.0, TypeError, ", but got 2.0 of type float."),
    (True, TypeError, ", but got True of type bool."), ("4", TypeError, ", but got '4' of type str."),
    (None, TypeError, " (only an executor built by GradientAccumulation.from_plan takes its plan's), but got None."),
])
def test_bad_mini_steps(value, error, tail, tmp_path):
    x, y = batch_for("mlp", 8, seed=0)
    net, ex = executor()
    before = params_of(net)
    with raises_exactly(error, f"For 'GradientAccumulation.train_process', the argument 'mini_steps' must be a "
                               f"positive int{tail}"):
        ex.train_process(1, dataset(x, y, 4), mini_steps=value, ckpt_dir=str(tmp_path))
    assert all(np.array_equal(a, b) for a, b in zip(params_of(net), before))


@pytest.mark.parametrize("value,error,got", [(0, ValueError, "0"), (-1, ValueError, "-1"),
                                             (1.0, TypeError, "1.0 of type float"),
                                             (None, TypeError, "None of type NoneType")])
def test_bad_epoch(value, error, got, tmp_path):
    x, y = batch_for("mlp", 8, seed=0)
    _, ex = executor()
    with raises_exactly(error, f"For 'GradientAccumulation.train_process', the argument 'epoch' must be a positive "
                               f"int, but got {got}."):
        ex.train_process(value, dataset(x, y, 4), mini_steps=2, ckpt_dir=str(tmp_path))


def test_dataset_none_or_empty(tmp_path):
    _, ex = executor()
    with raises_exactly(TypeError, "For 'GradientAccumulation.train_process', the argument 'train_dataset' must be "
                                   "Dataset, but got None of type NoneType."):
        ex.train_process(1, None, mini_steps=2, ckpt_dir=str(tmp_path))
    x, y = batch_for("mlp", 3, seed=0)
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'train_dataset' must not "
                                    "be empty, but it has no batches."):
        ex.train_process(1, dataset(x, y, 4, drop_remainder=True), mini_steps=2, ckpt_dir=str(tmp_path))


def test_unwritable_checkpoint_directory_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    x, y = batch_for("mlp", 8, seed=0)
    net, ex = executor()
    before = params_of(net)
    for bad, why in ((str(blocker), "is a file"), (str(blocker / "sub"), "cannot be created: Not a directory")):
        with raises_exactly(ValueError, f"For 'GradientAccumulation.train_process', the argument 'directory' must be a "
                                        f"writable directory, but '{bad}' {why}."):
            ex.train_process(1, dataset(x, y, 4), mini_steps=2, ckpt_dir=bad)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(net), before))
    assert blocker.read_text() == "not a directory"


def test_bad_partial_window(tmp_path):
    x, y = batch_for("mlp", 8, seed=0)
    _, ex = executor()
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'partial_window' must be "
                                    "one of ['apply', 'drop'], but got 'keep'."):
        ex.train_process(1, dataset(x, y, 4), mini_steps=2, partial_window="keep", ckpt_dir=str(tmp_path))


# loss_fn=None is a network that computes its own loss (tests/test_columns.py)
@pytest.mark.parametrize("arg,value", [(arg, value) for arg in ("network", "loss_fn", "optimizer")
                                       for value in (None, "x", 3) if (arg, value) != ("loss_fn", None)])
def test_bad_constructor_arguments(arg, value):
    net = make_net("mlp")
    kwargs = {"network": net, "loss_fn": loss_fn(), "optimizer": nn.SGD(net.trainable_params())}
    kwargs[arg] = value
    expected = "Optimizer" if arg == "optimizer" else "Cell"
    with raises_exactly(TypeError, f"For 'GradientAccumulation', the argument '{arg}' must be {expected}, but got "
                                   f"{value!r} of type {type(value).__name__}."):
        GradientAccumulation(**kwargs)


def test_bad_options():
    net = make_net("mlp")
    args = (net, loss_fn(), nn.SGD(net.trainable_params()))
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'clip_norm' must be a positive float, "
                                    "but got 0."):
        GradientAccumulation(*args, clip_norm=0)
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'reduction' must be one of ['mean', "
                                    "'sum', 'weighted_mean'], but got 'max'."):
        GradientAccumulation(*args, reduction="max")
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'structure' must be one of ['auto', "
                                    "'three_graphs', 'fused', 'window', 'cached'], but got 'unrolled'."):
        GradientAccumulation(*args, structure="unrolled")


def test_executor_owns_one_buffer_per_parameter_plus_scalars():
    net, ex = executor()
    params = net.trainable_params()
    owned = ex.buffer.parameters()
    assert len(owned) == len(params) + 6  # two window counters, the guard's loss scale and three counters
    assert sum(p.size for p in ex.buffer.grad_sum) == sum(p.size for p in params)
    # every graph the executor builds shares that one buffer: no Parameter outside network, optimizer, buffer (and,
    # measuring, the statistics' one scratch scalar, the window's squared norm, not saved)
    assert ex.buffer.statistics.parameters() == []  # statistics off by default
    measuring = GradientAccumulation(net, loss_fn(), ex.state.optimizer, structure="fused", statistics=True)
    [scratch] = measuring.buffer.statistics.parameters()
    assert scratch.size == 1 and scratch.name not in {p.name for p in measuring.buffer.parameters()}
    for model, extra in ((ex, set()), (measuring, {id(scratch)})):
        runner = model.runner(4)  # 'fused': its Cell, the closer's three graphs, and the three graphs' micro-batch
        known = ({id(p) for _, p in ex.state.optimizer.parameters_and_names()}
                 | {id(p) for p in model.buffer.parameters()} | extra)
        closer = runner.closer
        for cell in (model.state, closer.check, closer.step, closer.clear, runner.cell):
            assert {id(p) for _, p in cell.parameters_and_names()} <= known


def test_optimizer_over_another_network_is_refused():
    net, other = make_net("mlp"), make_net("mlp", seed=1)
    with raises_exactly(ValueError, f"For 'GradientAccumulation', the argument 'optimizer' must update Parameters of "
                                    f"'network', but '{other.trainable_params()[0].name}' is not one of them (an "
                                    f"optimizer built over another network?)."):
        GradientAccumulation(net, loss_fn(), nn.SGD(other.trainable_params()))
    # Training a part of the network (a frozen backbone) is fine: the rest stays as it was.
    before = params_of(net)
    x, y = batch_for("mlp", 8, seed=0)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
    GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params()[-2:], 0.1)).train_process(
        1, data, 2, ckpt_dir=None, verbose=False)
    moved = [not np.array_equal(a, b) for a, b in zip(params_of(net), before)]
    assert moved == [False] * (len(moved) - 2) + [True, True]


@pytest.mark.parametrize("loss", [nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none"),
                                  nn.MSELoss(reduction="none"), nn.CrossEntropyLoss(reduction="none")])
def test_loss_without_reduction_is_refused(loss):
    net = make_net("mlp")
    with raises_exactly(ValueError, f"For 'GradientAccumulation', the argument 'loss_fn' must reduce the batch to a "
                                    f"scalar, but got {type(loss).__name__} with reduction 'none': build it with "
                                    f"reduction='mean' (or 'sum')."):
        GradientAccumulation(net, loss, nn.SGD(net.trainable_params()))


SUMMED = {}


def summed_large_batch_steps(summing):
    """One TrainOneStepCell step with the summing loss on each window's concatenated batch (12 samples, then 10), once
    per loss for the three structures compared with it."""
    if id(summing) not in SUMMED:
        x, y = batch_for("mlp", 22, seed=3)
        ref = make_net("mlp")
        step = nn.TrainOneStepCell(nn.WithLossCell(ref, summing), nn.Momentum(ref.trainable_params(), 0.002, 0.9))
        step.set_train()
        for lo, hi in ((0, 12), (12, 22)):
            step(Tensor(x[lo:hi]), Tensor(y[lo:hi]))
        SUMMED[id(summing)] = params_of(ref)
    return SUMMED[id(summing)]


@pytest.mark.parametrize("structure", ["three_graphs", *SLOW_STRUCTURES])
@pytest.mark.parametrize("summing", [nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"),
                                     nn.CrossEntropyLoss(reduction="sum")])
@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_a_summing_loss_accumulates_to_the_large_batch_sum(summing, structure):
    # The loss says it sums (its `reduction`, or LossBase's `average` flag): the window is the sum over all its
    # samples, one step on the concatenated batch with that loss, partial window and unequal micro-batches included.
    x, y = batch_for("mlp", 22, seed=3)
    net = make_net("mlp")
    executor = GradientAccumulation(net, summing, nn.Momentum(net.trainable_params(), 0.002, 0.9),
                                    structure=structure)
    assert executor.buffer.reduction.name == "sum"
    executor.train_process(1, dataset(x, y, 4), mini_steps=3, ckpt_dir=None, verbose=False)
    for a, e in zip(params_of(net), summed_large_batch_steps(summing)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_a_summing_loss_with_a_mean_asked_for_is_refused():
    net = make_net("mlp")
    for reduction in ("mean", "weighted_mean"):
        with raises_exactly(ValueError, f"For 'GradientAccumulation', the argument 'reduction' must be 'sum' or None "
                                        f"for a loss_fn that sums over its batch (MSELoss with reduction 'sum'), but "
                                        f"got '{reduction}': a window of K sums divided by its samples is 1/K of the "
                                        f"large batch's update. Leave 'reduction' out, or build the loss with "
                                        f"reduction='mean'."):
            GradientAccumulation(net, nn.MSELoss(reduction="sum"), nn.SGD(net.trainable_params()),
                                 reduction=reduction)


def test_columns_the_network_cannot_take_are_refused_before_compiling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a compile error would leave rank_0/om/analyze_fail.ir here
    x, y = batch_for("mlp", 8, seed=0)
    net, ex = executor()
    before = params_of(net)
    for data in ({"image": x}, {"image": x, "label": y, "weight": y.astype(np.float32)}):
        one = ds.NumpySlicesDataset(data, shuffle=False).batch(4)
        with raises_exactly(ValueError, f"For 'GradientAccumulation.train_process', the argument 'train_dataset' must "
                                        f"yield the columns of the network's 1 input(s), then the loss's 1 label(s), "
                                        f"but it yields {len(data)}: {list(data)}."):
            ex.train_process(1, one, mini_steps=2, ckpt_dir=None)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(net), before))
    assert not os.path.exists(tmp_path / "rank_0")


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("partial_window,steps", [("apply", 4), ("drop", 3)])
def test_count_windows_is_what_the_executor_trains(partial_window, steps):
    # The CLI sizes its progress bar with it: it must count the optimizer steps train_process really makes.
    from ms_accum.train.windows import count_windows
    x, y = batch_for("mlp", 40, seed=0)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)  # 10 batches, windows of 3
    net = make_net("mlp")
    result = GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1)).train_process(
        2, data, 3, partial_window=partial_window, ckpt_dir=None, verbose=False)
    assert len(result.steps) == count_windows(10, 2, 3, 4, partial_window) == 2 * steps


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("structure", ["three_graphs", *SLOW_STRUCTURES])
@pytest.mark.parametrize("scaled", [False, True])
def test_clipping_applies_the_window_clipped_to_its_norm(structure, scaled):
    # Half the window's own norm: every structure must apply the large batch's gradient scaled by 1/2. (The check
    # graph's clipping writes the buffer in place and its verdict reads only the norm: a graph that pruned the writes
    # would apply the unclipped gradient.)
    from mindspore import amp, ops
    x, y = batch_for("mlp", 16, seed=4)
    ref = make_net("mlp")
    grads = ops.GradOperation(get_by_list=True)(nn.WithLossCell(ref, loss_fn()), ref.trainable_params())(
        Tensor(x), Tensor(y))
    norm = float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)))
    net = make_net("mlp")
    start = params_of(net)
    GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1), clip_norm=norm / 2,
                         structure=structure, loss_scaler=amp.StaticLossScaler(1024.0) if scaled else None
                         ).train_process(1, dataset(x, y, 4), 4, ckpt_dir=None, verbose=False)
    for a, s, g in zip(params_of(net), start, grads):
        np.testing.assert_allclose(a, s - 0.1 * g.asnumpy() / 2, rtol=1e-5, atol=1e-6)


class Linear(nn.Cell):
    """A network of these two tests' own: 3 features to 2 classes."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 2)

    def construct(self, x):
        return self.dense(x)


def linear_data(samples=16):
    rng = np.random.RandomState(0)
    return {"x": rng.rand(samples, 3).astype(np.float32), "y": rng.randint(0, 2, samples).astype(np.int32)}


def test_an_unbatched_dataset_is_refused_before_compiling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a compile error would leave rank_0/om/analyze_fail.ir here
    net = Linear()
    ex = GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1))
    before = params_of(net)
    samples = ds.NumpySlicesDataset(linear_data(), shuffle=False)
    for unbatched in (samples, samples.map(lambda x: x, input_columns="x")):
        with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'train_dataset' must "
                                        "yield micro-batches, but it yields single samples: batch it with "
                                        "train_dataset.batch(B), B the micro-batch size."):
            ex.train_process(1, unbatched, mini_steps=2, checkpoints=None)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(net), before))
    assert not os.path.exists(tmp_path / "rank_0")

    def whole_batches():  # a generator of the user's may yield batches itself: it is not refused
        data = linear_data()
        for i in range(0, 16, 4):
            yield data["x"][i:i + 4], data["y"][i:i + 4]
    result = ex.train_process(1, ds.GeneratorDataset(whole_batches, ["x", "y"], shuffle=False), 2, checkpoints=None)
    assert [record.samples for record in result.steps] == [8, 8]


def test_a_learning_rate_list_shorter_than_the_run_is_refused_with_both_numbers():
    net = Linear()
    ex = GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params(), [0.1, 0.1, 0.05, 0.05, 0.02]))
    before = params_of(net)
    batches = ds.NumpySlicesDataset(linear_data(), shuffle=False).batch(2)  # 8 batches: 4 windows of K=2 an epoch
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'optimizer' has a list of "
                                    "5 learning rates, one per optimizer step, but this run takes 8 optimizer steps: "
                                    "give at least 8 rates, or fewer 'epoch'."):
        ex.train_process(2, batches, 2, checkpoints=None)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(net), before))
    assert len(ex.train_process(1, batches, 2, checkpoints=None).steps) == 4  # 4 of its 5 rates
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'optimizer' has a list of "
                                    "5 learning rates, one per optimizer step, but this run takes 4 optimizer steps "
                                    "after the 4 it has taken: give at least 8 rates, or fewer 'epoch'."):
        ex.train_process(1, batches, 2, checkpoints=None)

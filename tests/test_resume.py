"""Resuming: a training killed with SIGKILL anywhere, then resumed, ends bit-identical to the uninterrupted run.

Each case runs `fault_scripts/resume_worker.py` (2 epochs of 13 batches, windows of 3, a partial window per
epoch, the state saved every 2 optimizer steps, the last 2 kept) in a subprocess that kills itself at the
chosen point, then runs the same command again, which resumes from the newest readable state.
"""
import contextlib
import glob
import json
import os
import re
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

from ms_accum import GradientAccumulation
from ms_accum.demo.models import MLP
from ms_accum.train.checkpoint import CheckpointError, find_latest, list_checkpoints, load_checkpoint
from ms_accum.train.options import QUIET, Checkpoints
from ms_accum.train.plan import network_fingerprint
from conftest import raises_exactly

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_scripts", "resume_worker.py")
TIMEOUT = 300


def run_worker(ckpt_dir, structure: str, fault: str = "none", *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GLOG_v": "3"}
    return subprocess.run([sys.executable, WORKER, str(ckpt_dir), structure, fault, *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env)


def final_params(ckpt_dir) -> dict:
    params, _ = load_checkpoint(os.path.join(ckpt_dir, "run.ckpt"))
    return {name: value.asnumpy() for name, value in params.items()}


@pytest.fixture(scope="module", params=[pytest.param("fused", marks=pytest.mark.slow),
                                        pytest.param("window", marks=pytest.mark.slow), "three_graphs"])
def reference(request, tmp_path_factory):
    ckpt_dir = tmp_path_factory.mktemp(f"reference_{request.param}")
    done = run_worker(ckpt_dir, request.param)
    assert done.returncode == 0, done.stderr[-2000:]
    return request.param, final_params(ckpt_dir)


# 13 batches an epoch in windows of 3: optimizer steps close after micro-batches 3, 6, 9, 12, 13 (partial), 16, ...
FAULTS = {
    "mid-window": "micro:8",         # 2 steps saved, third window two-thirds done
    "mid-window, epoch 2": "micro:20",  # after the first partial window, in the second epoch
    "at a window boundary": "boundary:4",
    "during a save": "save:6",
}


# make test kills one structure mid-window; make test-all every structure at every fault.
@pytest.mark.parametrize("fault", [pytest.param(f, marks=() if f == FAULTS["mid-window"] else pytest.mark.slow)
                                   for f in FAULTS.values()], ids=list(FAULTS))
def test_killed_and_resumed_run_is_bit_identical(reference, fault, tmp_path):
    structure, expected = reference
    if structure != "window" and not fault.startswith("micro:"):
        pytest.skip("saves happen in the executor's loop, the same for every structure: this fault runs with "
                    "structure='window' only")
    killed = run_worker(tmp_path, structure, fault)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not os.path.exists(tmp_path / "run.ckpt")  # it really died before the end

    if fault.startswith("save:"):
        # The torn write is a temporary file; the previous state is untouched and is the one resumed from.
        torn = str(tmp_path / ".run-000000006.ckpt.tmp.ckpt")
        assert glob.glob(torn)
        # MindSpore's own reason, after the colon, depends on where the write was cut.
        with pytest.raises(CheckpointError, match="^" + re.escape(f"'{torn}' is not a readable MindSpore checkpoint "
                                                                  f"(truncated, corrupt or another format): ") + ".+$"):
            load_checkpoint(torn)
        assert [step for step, _ in list_checkpoints(str(tmp_path), "run")] == [2, 4]
        assert find_latest(str(tmp_path), "run").endswith("run-000000004.ckpt")
        load_checkpoint(find_latest(str(tmp_path), "run"))

    resumed = run_worker(tmp_path, structure)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] is not None
    assert summary["steps"][-1] == 10 and summary["steps"][0] > 1  # only what was left was trained
    got = final_params(tmp_path)
    assert got.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(got[name], expected[name]), name
    assert [step for step, _ in list_checkpoints(str(tmp_path), "run")] == [8, 10]  # keep_last=2


# A batch ramp over the worker's 2 epochs of 13 batches of 8: K=2 from 0 samples, 3 from 40, 4 from 120. Windows
# (micro-batches run): 1-2, 3-4, 5-6 (K=2); 7-9, 10-12, 13 (K=3, the epoch's partial window); 14-16 (K=3); 17-20,
# 21-24, 25-26 (K=4, partial). States are saved after steps 2, 4, 6, 8 (micro-batches 4, 9, 13, 20).
RAMP = "0:2,40:3,120:4"
RAMP_FAULTS = {"K=2": "micro:5", "K=3": "micro:11", "K=4": "micro:23"}


@pytest.mark.slow  # make test-all
def test_a_run_killed_inside_each_segment_of_a_ramp_resumes_bit_identical(tmp_path):
    done = run_worker(tmp_path / "whole", "fused", "none", RAMP)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["k"] == [2, 2, 2, 3, 3, 3, 3, 4, 4, 4]
    expected = final_params(tmp_path / "whole")
    for segment, fault in RAMP_FAULTS.items():
        ckpt = tmp_path / segment
        killed = run_worker(ckpt, "fused", fault, RAMP)
        assert killed.returncode == -9, killed.stderr[-2000:]
        resumed = run_worker(ckpt, "fused", "none", RAMP)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        summary = json.loads(resumed.stdout.splitlines()[-1])
        assert summary["resumed_from"] is not None and summary["steps"][-1] == 10, summary
        got = final_params(ckpt)
        for name in expected:
            assert np.array_equal(got[name], expected[name]), (segment, name)


def _train(tmp_path, epochs=1, batch=8, **kwargs):
    ds.config.set_seed(7)
    ms.set_seed(1)
    rng = np.random.RandomState(0)
    data = {"image": rng.rand(48, 1, 28, 28).astype(np.float32), "label": rng.randint(0, 10, 48).astype(np.int32)}
    dataset = ds.NumpySlicesDataset(data, shuffle=True).batch(batch)
    net = MLP()
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    nn.Momentum(net.trainable_params(), 0.01, 0.9))
    kwargs.setdefault("mini_steps", 2)
    return executor.train_process(epochs, dataset, ckpt_dir=str(tmp_path), ckpt_name="run", verbose=False, **kwargs)


def test_resume_true_without_a_state_starts_afresh(tmp_path):
    result = _train(tmp_path, resume=True, save_every=1, keep_last=None)  # None: every state kept
    assert result.resumed_from is None and [r.step for r in result.steps] == [1, 2, 3]
    assert [step for step, _ in list_checkpoints(str(tmp_path), "run")] == [1, 2, 3]


@pytest.mark.slow  # make test-all
def test_resume_refuses_a_different_run(tmp_path):
    _train(tmp_path, save_every=1)
    latest = find_latest(str(tmp_path), "run")
    saved = (f"Checkpoint '{latest}' was saved with a global batch of 16 samples per update (accumulate_step=2 x "
             f"batch_size=8 x 1 rank(s)), but this run has")
    with raises_exactly(CheckpointError, f"{saved} 24 (accumulate_step=3 x batch_size=8 x 1 rank(s)): resuming would "
                                         f"not continue the same training; mini_steps=2 keeps it."):
        _train(tmp_path, resume=latest, mini_steps=3)
    with raises_exactly(CheckpointError, f"{saved} 12 (accumulate_step=2 x batch_size=6 x 1 rank(s)): resuming would "
                                         f"not continue the same training; no 'mini_steps' keeps it with batch_size=6 "
                                         f"on 1 rank(s), as 16 is not a multiple of 6."):
        _train(tmp_path, resume=latest, batch=6)
    with raises_exactly(CheckpointError, f"Checkpoint '{tmp_path / 'run.ckpt'}' holds no training state to resume from "
                                         f"(it was not saved with 'save_every')."):
        _train(tmp_path, resume=str(tmp_path / "run.ckpt"))
    with raises_exactly(CheckpointError, f"Checkpoint '{tmp_path / 'missing.ckpt'}' does not exist."):
        _train(tmp_path, resume=str(tmp_path / "missing.ckpt"))


@pytest.mark.slow  # make test-all
def test_resume_with_another_micro_batch_and_k_keeping_the_global_batch(tmp_path):
    # Saved with windows of 2 x 8, resumed as 4 x 4: the same 16 samples per update, read in the same order.
    _train(tmp_path / "whole", epochs=2, save_every=1)
    _train(tmp_path / "cut", epochs=1, save_every=1)
    state = find_latest(str(tmp_path / "cut"), "run")  # step 3, the end of epoch 1
    resumed = _train(tmp_path / "cut", epochs=2, batch=4, mini_steps=4, resume=state, save_every=1)
    assert resumed.resumed_from == state and [r.step for r in resumed.steps] == [4, 5, 6]
    assert [r.samples for r in resumed.steps] == [16, 16, 16]
    _, meta = load_checkpoint(find_latest(str(tmp_path / "cut"), "run"))
    assert (meta["samples"], meta["batch"], meta["rank_batch_size"], meta["accumulate_step"]) == (48, 12, 4, 4)
    whole, _ = load_checkpoint(str(tmp_path / "whole" / "run.ckpt"))
    got, _ = load_checkpoint(str(tmp_path / "cut" / "run.ckpt"))
    for name, value in whole.items():
        np.testing.assert_allclose(got[name].asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=name)


def test_resume_and_save_every_need_a_directory(tmp_path):
    net = MLP()
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'save_every' needs "
                                    "'ckpt_dir', but 'ckpt_dir' is None."):
        GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params())).train_process(
            1, ds.NumpySlicesDataset({"x": np.zeros((4, 2), np.float32)}).batch(2), 1, ckpt_dir=None, save_every=1)
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'keep_last' must be a "
                                    "positive int, but got 0."):
        _train(tmp_path, keep_last=0)


@contextlib.contextmanager
def files_limited_to(size: int):
    """Writes past `size` bytes fail with EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored): a real OSError from the kernel, as a
    full disk gives, in this process only, undone afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.slow  # make test-all
def test_a_failed_save_names_the_newest_state_and_loses_nothing(tmp_path):
    _train(tmp_path / "whole", epochs=2, save_every=1)
    _train(tmp_path, epochs=1, save_every=1)  # states of steps 1-3
    saved = {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()}
    with files_limited_to(4096):  # smaller than a state
        # It names train_process, what the user ran, not the save_checkpoint inside it.
        with raises_exactly(CheckpointError, f"For 'GradientAccumulation.train_process', 'run-000000004.ckpt' could "
                                             f"not be written in '{tmp_path}': File too large. No earlier file was "
                                             f"changed. The newest complete training state is 'run-000000003.ckpt': "
                                             f"resume=True continues from it."):
            _train(tmp_path, epochs=2, save_every=1, resume=True)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()} == saved  # no temporary
    resumed = _train(tmp_path, epochs=2, save_every=1, resume=True)
    assert [r.step for r in resumed.steps] == [4, 5, 6]
    whole, _ = load_checkpoint(str(tmp_path / "whole" / "run.ckpt"))
    got, _ = load_checkpoint(str(tmp_path / "run.ckpt"))
    for name, value in whole.items():
        assert np.array_equal(got[name].asnumpy(), value.asnumpy()), name


def test_a_failed_first_save_says_there_is_no_state_yet(tmp_path):
    with files_limited_to(4096):
        with raises_exactly(CheckpointError, f"For 'GradientAccumulation.train_process', 'run-000000001.ckpt' could "
                                             f"not be written in '{tmp_path}': File too large. No earlier file was "
                                             f"changed. '{tmp_path}' holds no complete training state of 'run' yet."):
            _train(tmp_path, save_every=1)
    assert os.listdir(tmp_path) == []


class TwoLayers(nn.Cell):
    """A network of this file's own, 4 features to 3 classes; `hidden` and `prefix` change its parameters."""

    def __init__(self, hidden=5, prefix="body"):
        super().__init__()
        setattr(self, prefix, nn.SequentialCell(nn.Dense(4, hidden), nn.ReLU(), nn.Dense(hidden, 3)))
        self.prefix = prefix

    def construct(self, x):
        return getattr(self, self.prefix)(x)


def _train_own(tmp_path, network=None, lr=0.1, momentum=0.9, **checkpoints):
    """One epoch of 6 batches of 4 through `TwoLayers`, K=2, the training state saved every step."""
    ds.config.set_seed(3)
    rng = np.random.RandomState(0)
    data = {"x": rng.rand(24, 4).astype(np.float32), "y": rng.randint(0, 3, 24).astype(np.int32)}
    net = network or TwoLayers()
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    nn.Momentum(net.trainable_params(), lr, momentum))
    return executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=True).batch(4), 2, log=QUIET,
                                  checkpoints=Checkpoints(directory=str(tmp_path), name="own", save_every=1,
                                                          **checkpoints))


def test_a_fresh_run_into_another_runs_states_is_refused_before_any_work(tmp_path):
    _train_own(tmp_path)  # states of steps 2 and 3 kept (keep_last=2)
    saved = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    network = TwoLayers()
    before = [p.asnumpy() for p in network.trainable_params()]
    with raises_exactly(ValueError, f"For 'GradientAccumulation.train_process', the argument 'directory' must not "
                                    f"hold another run's training states, but '{tmp_path}' holds 'own-000000002.ckpt', "
                                    f"'own-000000003.ckpt': a fresh run would save its own beside them. Continue that "
                                    f"run with resume=True, or give another 'directory' or remove them."):
        _train_own(tmp_path, network, lr=0.2)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == saved
    assert all(np.array_equal(p.asnumpy(), q) for p, q in zip(network.trainable_params(), before))  # nothing trained
    assert _train_own(tmp_path / "elsewhere").resumed_from is None  # another directory is a fresh start


def test_resume_refuses_a_state_of_a_run_built_otherwise(tmp_path):
    _train_own(tmp_path)
    latest = find_latest(str(tmp_path), "own")
    built = "Momentum(learning_rate={}, weight_decay=0, momentum={}, use_nesterov=False, loss_scale=1.0)"
    with raises_exactly(CheckpointError, f"Checkpoint '{latest}' was saved by a run whose optimizer was "
                                         f"{built.format(0.1, 0.9)}, but this run's is {built.format(0.2, 0.9)}: "
                                         f"resuming would not continue the same training."):
        _train_own(tmp_path, lr=0.2, resume=True)
    with raises_exactly(CheckpointError, f"Checkpoint '{latest}' was saved by a run whose optimizer was "
                                         f"{built.format(0.1, 0.9)}, but this run's is {built.format(0.1, 0.5)}: "
                                         f"resuming would not continue the same training."):
        _train_own(tmp_path, momentum=0.5, resume=True)
    saved, renamed = (network_fingerprint(net)["hash"] for net in (TwoLayers(), TwoLayers(prefix="head")))
    with raises_exactly(CheckpointError, f"Checkpoint '{latest}' was saved by a run whose network (its parameters' "
                                         f"names, shapes and dtypes) was 4 parameters of 43 values (hash {saved}), but "
                                         f"this run's is 4 parameters of 43 values (hash {renamed}): resuming would "
                                         f"not continue the same training."):
        _train_own(tmp_path, TwoLayers(prefix="head"), resume=True)
    assert _train_own(tmp_path, resume=True).resumed_from == latest  # built alike: it continues

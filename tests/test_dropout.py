"""Dropout that reproduces and resumes (`ms_accum.core.dropout`).

MindSpore 2.10's CPU `Dropout` kernel draws from an engine of its own that its threads share while its launch search
runs, so two identical runs differ and no checkpoint can carry the engine (docs/mindspore.md, "Dropout's kernel and
its threads"). The executor draws `nn.Dropout`'s masks through `SeededDropout` instead: a pure function of the op's seed
and of how many words it has drawn, both Parameters. Checked here: its masks against a NumPy reference; what
`seed_dropout` replaces and names; recomputation and gradient caching drawing the forward's masks; two runs in fresh
processes ending bit-identical, and a run killed mid-epoch and resumed ending as the uninterrupted one, in every
structure (`fault_scripts/resume_worker.py` with DROPOUT); every structure drawing the same masks.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops

from ms_accum import GradientAccumulation
from ms_accum.core.dropout import DrawMarks, SeededDropout, seed_dropout, splitmix64
from ms_accum.train.checkpoint import list_checkpoints, load_checkpoint, load_into, save_checkpoint
from ms_accum.train.options import QUIET
from conftest import params_of

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_scripts", "resume_worker.py")
P = "0.3"
STRUCTURES = ["three_graphs", *(pytest.param(s, marks=pytest.mark.slow) for s in ("fused", "window", "cached"))]


def reference_mask(seed: int, offset: int, size: int, keep_prob: float) -> np.ndarray:
    """`SeededDropout`'s mask, written out: SplitMix64 words from `offset + 1` on, value k * words + i from the k-th
    16-bit lane of word i, top first."""
    words = (size + 3) // 4
    z = [splitmix64(seed + (offset + 1 + i) * 0x9E3779B97F4A7C15) for i in range(words)]
    lanes = [(z[i] >> (48 - 16 * k)) & 0xFFFF for k in range(4) for i in range(words)]
    return (np.array(lanes[:size]) < round(keep_prob * (1 << 16))).astype(np.float32)


def test_masks_are_splitmix64_words_of_the_seed_and_the_words_drawn(mode):
    dropout = SeededDropout(0.7, seed=123456789, name="d").set_train()
    offset = 0
    for shape in [(4, 8), (3, 5), (3, 5)]:  # 15 values: 4 words, the last word's fourth lane unused
        x = np.random.default_rng(offset).standard_normal(shape).astype(np.float32)
        out, mask = dropout(Tensor(x))
        expected = reference_mask(123456789, offset, x.size, 0.7).reshape(shape)
        assert np.array_equal(mask.asnumpy(), expected)
        np.testing.assert_allclose(out.asnumpy(), x * expected / 0.7, rtol=1e-6)
        offset += (x.size + 3) // 4
        assert int(dropout.offset.asnumpy()) == offset


def test_masks_keep_the_probability_and_are_independent():
    dropout = SeededDropout(0.9, seed=7).set_train()
    masks = [dropout(Tensor(np.ones((256, 1000), np.float32)))[1].asnumpy().ravel() for _ in range(2)]
    kept = np.concatenate(masks)
    assert abs(kept.mean() - 0.9) < 4 * np.sqrt(0.09 / kept.size)
    words = 256 * 1000 // 4
    for a, b in [(masks[0][:-1], masks[0][1:]), (masks[0][:-words], masks[0][words:]), (masks[0], masks[1])]:
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.01  # neighbouring words, the lanes of one word, two calls


def two_layer(seed: int = 0) -> nn.Cell:
    ms.set_seed(seed)
    return nn.SequentialCell([nn.Dense(20, 64), nn.ReLU(), nn.Dropout(p=0.3), nn.Dense(64, 4), nn.Dropout(p=0.1)])


def test_seed_dropout_replaces_each_nn_dropout_with_a_seed_from_its_ops_seeds():
    net = two_layer()
    optimizer = nn.Adam(net.trainable_params(), 1e-3)
    ops_ = seed_dropout(net)
    assert [type(c.dropout).__name__ for c in (net[2], net[4])] == ["SeededDropout"] * 2
    assert [(op.keep_prob, op.seed.name, op.offset.name) for op in ops_] == [
        (pytest.approx(0.7), "2.dropout.seed", "2.dropout.offset"),
        (pytest.approx(0.9), "4.dropout.seed", "4.dropout.offset")]
    seeds = [int(op.seed.asnumpy()) for op in ops_]
    assert seeds[0] != seeds[1]  # each op its own stream
    assert [int(op.seed.asnumpy()) for op in seed_dropout(two_layer())] == seeds  # mindspore.set_seed decides them
    assert [int(op.seed.asnumpy()) for op in seed_dropout(two_layer(1))] != seeds
    assert seed_dropout(net) == ops_  # a second call replaces nothing
    assert all(not op.seed.requires_grad and not op.offset.requires_grad for op in ops_)
    assert [id(p) for p in optimizer.parameters] == [id(p) for p in net.trainable_params()]  # weights only
    out = net.set_train()(Tensor(np.ones((2, 20), np.float32)))
    assert out.shape == (2, 4) and [int(op.offset.asnumpy()) for op in ops_] == [32, 2]


def test_a_recomputed_forward_draws_the_forwards_masks():
    def gradients(recompute: bool):
        ms.set_seed(0)
        block = nn.SequentialCell([nn.Dense(20, 64), nn.ReLU(), nn.Dropout(p=0.3), nn.Dense(64, 32), nn.ReLU()])
        net = nn.SequentialCell([block, nn.Dense(32, 4)])
        seed_dropout(net)
        if recompute:
            block.recompute()
        loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")).set_train()

        class Gradients(nn.Cell):
            def __init__(self):
                super().__init__()
                self.loss, self.weights = loss, ms.ParameterTuple(net.trainable_params())
                self.grad = ops.GradOperation(get_by_list=True)

            def construct(self, x, y):
                return self.grad(self.loss, self.weights)(x, y)

        step = Gradients()
        x = Tensor(np.random.default_rng(0).standard_normal((8, 20)).astype(np.float32))
        y = Tensor(np.arange(8, dtype=np.int32) % 4)
        got = [[g.asnumpy() for g in step(x, y)] for _ in range(2)]
        return got, int(block[2].dropout.offset.asnumpy())

    plain, recomputed = gradients(False), gradients(True)
    assert plain[1] == recomputed[1] == 2 * 8 * 64 // 4  # advanced once per forward, not again when recomputed
    for a, b in zip(plain[0], recomputed[0]):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


def test_draw_marks_go_back_to_the_same_masks():
    net = two_layer()
    seed_dropout(net)
    net.set_train()
    marks = DrawMarks(net)
    x = Tensor(np.ones((3, 20), np.float32))
    marks.mark()
    first = [net(x).asnumpy() for _ in range(2)]
    marks.rewind()
    again = [net(x).asnumpy() for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and not np.array_equal(*first)
    marks.rewind()
    marks.restore()  # where the first forward ended, whatever the second did
    assert int(net[2].dropout.offset.asnumpy()) == 2 * 3 * 64 // 4
    DrawMarks(nn.Dense(2, 2)).rewind()  # no dropout: nothing to launch


def test_dropout_state_is_saved_with_the_network_and_set_aside_without_it(tmp_path):
    net = two_layer()
    ops_ = seed_dropout(net)
    net.set_train()(Tensor(np.ones((2, 20), np.float32)))
    path = save_checkpoint(net, str(tmp_path / "net.ckpt"))
    params, _ = load_checkpoint(path)
    assert int(params["2.dropout.offset"].asnumpy()) == 32
    load_into(two_layer(), path)  # a network built afresh: the scalars are training state, set aside
    older = save_checkpoint(two_layer(), str(tmp_path / "older.ckpt"))  # as ms_accum wrote before seeding dropout
    load_into(net, older)  # the network's dropout state keeps its value
    assert [int(op.offset.asnumpy()) for op in ops_] == [32, 2]


def train(structure: str, build=two_layer) -> list:
    ds.config.set_seed(0)
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((72, 20)).astype(np.float32), "y": rng.integers(0, 4, 72).astype(np.int32)}
    net = build()
    executor = GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                    nn.Adam(net.trainable_params(), 1e-2), structure=structure)
    executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=True).batch(8), 4, checkpoints=None, log=QUIET)
    return params_of(net)


@pytest.mark.slow  # make test-all
def test_every_structure_draws_the_same_masks(mode):
    """9 micro-batches, K=4: two windows and a partial one. The structures compute the same updates from the same
    masks (to rounding), in both modes; another draw of the masks moves the parameters by far more."""
    expected = train("three_graphs")
    for structure in ("fused", "window", "cached"):
        for got, want in zip(train(structure), expected):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=structure)
    other = train("three_graphs", lambda: two_layer(1))
    assert max(np.abs(a - b).max() for a, b in zip(other, expected)) > 1e-3


def run_worker(ckpt_dir, structure: str, fault: str = "none") -> subprocess.CompletedProcess:
    # 2 epochs of 13 batches of 8, K=3, a state every 2 steps (resume_worker.py), a network with dropout.
    return subprocess.run([sys.executable, WORKER, str(ckpt_dir), structure, fault, "3", "100", "0", "latest", P],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "GLOG_v": "3"})


def final_params(ckpt_dir) -> dict:
    params, _ = load_checkpoint(os.path.join(ckpt_dir, "run.ckpt"))
    return {name: value.asnumpy() for name, value in params.items()}


@pytest.fixture(scope="module", params=STRUCTURES)
def uninterrupted(request, tmp_path_factory):
    """The structure's run, twice in fresh processes."""
    runs = []
    for attempt in range(2):
        ckpt_dir = tmp_path_factory.mktemp(f"dropout_{request.param}_{attempt}")
        done = run_worker(ckpt_dir, request.param)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(final_params(ckpt_dir))
    return request.param, runs


def test_two_runs_in_fresh_processes_end_bit_identical(uninterrupted):
    _, (first, second) = uninterrupted
    assert first.keys() == second.keys() and "3.dropout.offset" in first
    for name in first:
        assert np.array_equal(first[name], second[name]), name


# Killed in the third window, after its second micro-batch (the state of step 2 saved after micro-batch 6); the cached
# structure runs each micro-batch twice, pass 1 of the window's three then pass 2: its 16th pass is the third window's
# pass 2 of its first micro-batch, after the offsets were set back.
KILL = {"cached": "micro:16"}


def test_a_run_killed_mid_epoch_resumes_bit_identical(uninterrupted, tmp_path):
    structure, (expected, _) = uninterrupted
    killed = run_worker(tmp_path, structure, KILL.get(structure, "micro:8"))
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [step for step, _ in list_checkpoints(str(tmp_path), "run")] == [2]
    resumed = run_worker(tmp_path, structure)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"].endswith("run-000000002.ckpt") and summary["steps"] == list(range(3, 11))
    got = final_params(tmp_path)
    assert got.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(got[name], expected[name]), name

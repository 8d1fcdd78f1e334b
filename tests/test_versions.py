"""The same bits on every supported MindSpore: a seeded dropout network trained through each structure, the dropout
kernel's masks, and a training state written under one release and resumed under another.

Each MindSpore of CI's matrix (`.ci/run`, oldest first) runs this file and leaves its results in ``.versions/`` beside
the checkout (or ``$MS_ACCUM_VERSIONS``); each run compares its own with every other release's found there that the
same code wrote (the package's and this file's sources hash alike), so the newest, run last, compares them all.
`make test MINDSPORE=2.9.0` followed by `make test` does the same on one machine. Bit-for-bit holds on one machine;
the directory is not shared between machines.
"""
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import ms_accum
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn

from ms_accum import Checkpoints, GradientAccumulation, QUIET
from ms_accum.core import dropout_streams

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("MS_ACCUM_VERSIONS", ROOT / ".versions"))
STRUCTURES = ("three_graphs", "fused", "window")
EPOCHS, K, SAVE_EVERY = 2, 4, 2  # 8 micro-batches an epoch: 4 steps, a state saved after step 2


def _code_hash() -> str:
    """What wrote a release's results: the package's sources and this file's."""
    digest = hashlib.sha256()
    for path in sorted([*(ROOT / "ms_accum").rglob("*.py"), *(ROOT / "ms_accum").rglob("*.cc"), Path(__file__)]):
        digest.update(path.relative_to(ROOT).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


CODE = _code_hash()
VERSION = ms.__version__
HERE = RESULTS / f"mindspore-{VERSION}"


def _others() -> list:
    """The other releases whose results the same code wrote on this machine."""
    found = []
    for folder in sorted(RESULTS.glob("mindspore-*")):
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("version") != VERSION and meta.get("code") == CODE:
            found.append(meta["version"])
    return found


def _build():
    """A seeded MLP with dropout, its data and executor, as a restarted process builds them."""
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    data = {"data": rng.standard_normal((128, 20)).astype(np.float32),
            "label": rng.integers(0, 4, 128).astype(np.int32)}
    dataset = ds.NumpySlicesDataset(data, shuffle=False).batch(16)
    network = nn.SequentialCell([nn.Dense(20, 64), nn.ReLU(), nn.Dropout(p=0.25), nn.Dense(64, 4)])
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(network.trainable_params(), learning_rate=0.05, momentum=0.9)
    return network, dataset, loss_fn, optimizer


def _train(structure: str, directory: Path, resume=None) -> dict:
    network, dataset, loss_fn, optimizer = _build()
    executor = GradientAccumulation(network, loss_fn, optimizer, structure=structure)
    checkpoints = Checkpoints(directory=str(directory), name="run", save_every=SAVE_EVERY, keep_last=None,
                              resume=resume)
    executor.train_process(EPOCHS, dataset, mini_steps=K, log=QUIET, checkpoints=checkpoints)
    return {p.name: p.asnumpy() for p in network.trainable_params()}


def _masks() -> np.ndarray:
    """Three draws of the dropout kernel on a 3 x 1000 input, as trained networks draw."""
    ms.set_seed(0)
    network = nn.Dropout(p=0.5).set_train()
    streams = dropout_streams(network)
    with streams.drawing():
        return np.stack([network(Tensor(np.ones((3, 1000), np.float32))).asnumpy() != 0 for _ in range(3)])


@pytest.fixture(scope="module")
def this_version(tmp_path_factory) -> Path:
    """This release's results, written to ``.versions/mindspore-<version>``."""
    shutil.rmtree(HERE, ignore_errors=True)
    HERE.mkdir(parents=True)
    for structure in STRUCTURES:
        work = tmp_path_factory.mktemp(structure)
        np.savez(HERE / f"{structure}.npz", **_train(structure, work))
        shutil.copy(work / f"run-{SAVE_EVERY:09d}.ckpt", HERE / f"{structure}-state.ckpt")
    np.save(HERE / "masks.npy", _masks())
    (HERE / "meta.json").write_text(json.dumps({"version": VERSION, "code": CODE}))
    return HERE


def _load(path: Path) -> dict:
    with np.load(path) as saved:
        return dict(saved)


def _same(expected: dict, actual: dict) -> list:
    """The parameters whose bits differ."""
    return [name for name in expected if not np.array_equal(expected[name], actual[name])]


def test_this_version_trains_and_its_structures_agree(this_version):
    # The structures order their float32 sums alike: equal here, so a difference across releases is the release's.
    results = {s: _load(this_version / f"{s}.npz") for s in STRUCTURES}
    first, *rest = results.values()
    _, _, _, untrained = _build()
    assert not _same({p.name: p.asnumpy() for p in untrained.parameters}, first) == [], "nothing trained"
    for structure, result in zip(STRUCTURES[1:], rest):
        assert _same(first, result) == [], structure
    masks = np.load(this_version / "masks.npy")
    assert 0.45 < masks.mean() < 0.55 and not np.array_equal(masks[0], masks[1])


OTHERS = _others()
needs_others = pytest.mark.skipif(not OTHERS, reason=f"no other MindSpore's results in {RESULTS} (the matrix runs "
                                                     f"older releases first: .ci/run, make test MINDSPORE=...)")


@needs_others
@pytest.mark.parametrize("other", OTHERS or ["none"])
@pytest.mark.parametrize("structure", STRUCTURES)
def test_same_parameters_as_another_release(this_version, other, structure):
    theirs = _load(RESULTS / f"mindspore-{other}" / f"{structure}.npz")
    assert _same(theirs, _load(this_version / f"{structure}.npz")) == [], f"MindSpore {other} vs {VERSION}"


@needs_others
@pytest.mark.parametrize("other", OTHERS or ["none"])
def test_same_dropout_masks_as_another_release(this_version, other):
    assert np.array_equal(np.load(RESULTS / f"mindspore-{other}" / "masks.npy"), np.load(this_version / "masks.npy"))


@needs_others
@pytest.mark.parametrize("other", OTHERS or ["none"])
@pytest.mark.parametrize("structure", STRUCTURES)
def test_resumes_another_releases_state_to_the_same_bits(this_version, other, structure, tmp_path):
    state = tmp_path / f"run-{SAVE_EVERY:09d}.ckpt"
    shutil.copy(RESULTS / f"mindspore-{other}" / f"{structure}-state.ckpt", state)
    resumed = _train(structure, tmp_path, resume=str(state))
    assert _same(_load(this_version / f"{structure}.npz"), resumed) == [], f"written by {other}, resumed on {VERSION}"

"""ms_accum.demo.data: MNIST checks, idx I/O, download, synthetic data and the two MindSpore pipelines."""
import glob
import http.server
import os
import re
import socket
import tempfile
import threading
import zipfile

import numpy as np
import pytest

from ms_accum.demo import data
from ms_accum.demo.data import DataError

from conftest import mnist_dir, raises_exactly, requires_mnist

ZERO = -0.1307 / 0.3081  # what pixel 0 must become: scaled to [0, 1] first, then normalized
FULL = (1.0 - 0.1307) / 0.3081  # pixel 255


def batches(dataset):
    return [(x, y) for x, y in dataset.create_tuple_iterator(output_numpy=True, num_epochs=1)]


def stacked(dataset):
    xs, ys = zip(*batches(dataset))
    return np.concatenate(xs), np.concatenate(ys)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """A small synthetic MNIST dir, shared read-only by the tests that do not damage it."""
    return data.make_synthetic_mnist(str(tmp_path_factory.mktemp("synth")), num_train=200, num_test=100, seed=3)


@pytest.fixture
def synth_copy(tmp_path):
    """A fresh small synthetic MNIST dir a test may damage."""
    return data.make_synthetic_mnist(str(tmp_path / "root"), num_train=60, num_test=30, seed=1)


# ----------------------------------------------------------------------------------------------- real MNIST

@requires_mnist
def test_real_mnist_dir_is_valid():
    path = mnist_dir()
    assert data.check_mnist_dir(path) == path
    assert not data.is_synthetic(path)


@requires_mnist
@pytest.mark.parametrize("usage, total", [("train", 60000), ("test", 10000)])
def test_create_dataset_sizes(usage, total):
    assert data.create_dataset(mnist_dir(), 32, usage).get_dataset_size() == total // 32
    assert data.create_dataset(mnist_dir(), 32, usage, num_samples=1000).get_dataset_size() == 1000 // 32
    kept = data.create_dataset(mnist_dir(), 32, usage, num_samples=1000, drop_remainder=False)
    assert kept.get_dataset_size() == -(-1000 // 32)


@requires_mnist
def test_create_dataset_shapes_dtypes_and_range():
    x, y = stacked(data.create_dataset(mnist_dir(), 32, "train", num_samples=512, seed=0))
    first_x, first_y = batches(data.create_dataset(mnist_dir(), 32, "train", num_samples=64, seed=0))[0]
    assert first_x.shape == (32, 1, 32, 32) and first_x.dtype == np.float32
    assert first_y.shape == (32,) and first_y.dtype == np.int32
    assert x.shape == (512, 1, 32, 32)
    assert set(np.unique(y)) <= set(range(10)) and len(np.unique(y)) == 10
    # Background (pixel 0) is exactly the normalized zero; nothing exceeds the normalized 255.
    assert x.min() == pytest.approx(ZERO, abs=1e-5)
    assert np.allclose(x[:, :, 0, :], ZERO, atol=1e-5)  # MNIST's top row is blank
    assert x.max() <= FULL + 1e-4
    assert abs(float(x.mean())) < 0.1 and 0.85 < float(x.std()) < 1.1


@requires_mnist
def test_datapipe_normalizes_after_scaling_exactly():
    """datapipe(test, no shuffle) equals (pixel / 255 - 0.1307) / 0.3081 of the raw file, in file order."""
    raw = data.read_idx(os.path.join(mnist_dir(), "test", "t10k-images-idx3-ubyte"))[:100]
    raw_labels = data.read_idx(os.path.join(mnist_dir(), "test", "t10k-labels-idx1-ubyte"))[:100]
    dataset = data.datapipe(mnist_dir(), 32, "test", num_samples=100)
    assert dataset.get_dataset_size() == 4  # the page keeps the last, smaller batch
    got = batches(dataset)
    assert [len(y) for _, y in got] == [32, 32, 32, 4]
    x, y = np.concatenate([b[0] for b in got]), np.concatenate([b[1] for b in got])
    assert x.shape == (100, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int32
    expected = (raw.astype(np.float32) / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(x[:, 0], expected, atol=1e-5)
    np.testing.assert_array_equal(y, raw_labels)


@requires_mnist
def test_shuffle_defaults_and_seed():
    raw_labels = data.read_idx(os.path.join(mnist_dir(), "train", "train-labels-idx1-ubyte"))
    test_labels = data.read_idx(os.path.join(mnist_dir(), "test", "t10k-labels-idx1-ubyte"))

    def labels(**kwargs):
        return stacked(data.datapipe(mnist_dir(), 50, num_samples=200, **kwargs))[1]

    np.testing.assert_array_equal(labels(usage="test"), test_labels[:200])  # datapipe: no shuffle
    _, y = stacked(data.create_dataset(mnist_dir(), 50, "test", num_samples=200))
    np.testing.assert_array_equal(y, test_labels[:200])  # create_dataset: test not shuffled
    _, y = stacked(data.create_dataset(mnist_dir(), 50, "train", num_samples=200))
    assert not np.array_equal(y, raw_labels[:200])  # create_dataset: train shuffled
    a, b, c = (labels(usage="train", shuffle=True, seed=s) for s in (7, 7, 8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@requires_mnist
def test_sharding_splits_distinct_samples():
    def keys(shard_id, **kwargs):
        x, _ = stacked(data.datapipe(mnist_dir(), 50, "test", num_shards=2, shard_id=shard_id, num_samples=300,
                                     **kwargs))
        return [row.tobytes() for row in x]

    for kwargs in ({"shuffle": False}, {"shuffle": True, "seed": 5}):
        first, second = keys(0, **kwargs), keys(1, **kwargs)
        assert len(first) == len(second) == 300  # num_samples counts per shard
        assert not set(first) & set(second)


# ------------------------------------------------------------------------------------------ checks, idx I/O

def test_check_mnist_dir_accepts_synthetic(synth):
    assert data.check_mnist_dir(synth) == synth
    assert data.is_synthetic(synth)


def _rewrite(path, transform):
    with open(path, "rb") as f:
        content = f.read()
    with open(path, "wb") as f:
        f.write(transform(content))


# What every message about missing or unusable MNIST ends with.
WHAT_TO_DO = ("Put MNIST (the four idx files, uncompressed, as MNIST_Data/train/ and MNIST_Data/test/) in a directory "
              "and pass it with --data DIR or set the environment variable MS_ACCUM_MNIST=DIR.")


@pytest.mark.parametrize("rel, transform, message", [  # synth_copy: 60 train and 30 test images
    ("train/train-images-idx3-ubyte", lambda b: b[:len(b) // 2],
     "idx file '{path}' is truncated: 23528 bytes, its header implies 47056."),
    ("train/train-images-idx3-ubyte", lambda b: b[:10],
     "idx file '{path}' is truncated: 10 bytes, shorter than its 16-byte header."),
    ("test/t10k-labels-idx1-ubyte", lambda b: b + b"\0",
     "idx file '{path}' is too long: 39 bytes, its header implies 38."),
    ("train/train-images-idx3-ubyte", lambda b: b"\0\0\x08\x04" + b[4:],
     "MNIST file '{path}' has a bad magic number 2052 (0x00000804), expected 2051 (0x00000803); it is not an "
     "uncompressed idx file of this kind."),
    ("test/t10k-labels-idx1-ubyte", lambda b: b"\0\0\x08\x03" + b[4:],
     "MNIST file '{path}' has a bad magic number 2051 (0x00000803), expected 2049 (0x00000801); it is not an "
     "uncompressed idx file of this kind."),
    ("test/t10k-labels-idx1-ubyte", lambda b: b[:4] + (29).to_bytes(4, "big") + b[8:-1],
     "MNIST file '{path}' has 29 labels but '{root}/test/t10k-images-idx3-ubyte' has 30 images."),
])
def test_corrupt_file_names_the_file(synth_copy, rel, transform, message):
    path = os.path.join(synth_copy, rel)
    _rewrite(path, transform)
    message = message.format(path=path, root=synth_copy)
    with raises_exactly(DataError, message):
        data.check_mnist_dir(synth_copy)
    # The pipelines check first: a DataError, not MindSpore's opaque "Exception thrown from dataset pipeline".
    with raises_exactly(DataError, message):
        data.create_dataset(synth_copy, 10, usage="test")


def test_missing_file_and_gz_hint(synth_copy):
    path = os.path.join(synth_copy, "test", "t10k-images-idx3-ubyte")
    os.rename(path, path + ".gz")
    with raises_exactly(DataError, f"idx file '{path}' is missing (found a .gz beside it: decompress it)."):
        data.check_mnist_dir(synth_copy)
    os.remove(path + ".gz")
    with raises_exactly(DataError, f"idx file '{path}' is missing."):
        data.datapipe(synth_copy, usage="train")


def test_wrong_image_size(synth_copy):
    path = os.path.join(synth_copy, "train", "train-images-idx3-ubyte")
    data.write_idx(path, np.zeros((60, 20, 20), np.uint8))
    with raises_exactly(DataError, f"MNIST file '{path}' holds 20x20 images, expected 28x28."):
        data.check_mnist_dir(synth_copy)


def test_missing_dir_and_split_dir_hint(synth, tmp_path):
    nowhere = str(tmp_path / "nowhere")
    with raises_exactly(DataError, f"MNIST directory '{nowhere}' does not exist or is not a directory. {WHAT_TO_DO}"):
        data.check_mnist_dir(nowhere)
    split = os.path.join(synth, "train")
    with raises_exactly(DataError, f"idx file '{split}/train/train-images-idx3-ubyte' is missing. '{split}' looks like "
                                   f"one split: pass its parent, the directory that holds both train/ and test/."):
        data.create_dataset(split)


@pytest.mark.parametrize("array", [
    np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28),
    np.arange(7, dtype=np.uint8),
    np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
    np.linspace(-1, 1, 8, dtype=np.float32),
    np.arange(5, dtype=">i2"),
])
def test_idx_roundtrip(tmp_path, array):
    path = str(tmp_path / "a-idx")
    data.write_idx(path, array)
    back = data.read_idx(path)
    assert back.shape == array.shape and back.dtype == array.dtype.newbyteorder("=")
    np.testing.assert_array_equal(back, array)
    back[...] = 0  # writable
    assert os.listdir(tmp_path) == ["a-idx"]  # no temporary file left


def test_idx_header_layout(tmp_path):
    path = str(tmp_path / "labels")
    data.write_idx(path, np.array([1, 2, 3], np.uint8))
    with open(path, "rb") as f:
        assert f.read() == bytes([0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3])  # magic 2049, count 3, big-endian


@pytest.mark.parametrize("content, words", [
    (b"\0\0\x08", "is truncated: 3 bytes, shorter than its magic number."),
    (b"\0\0\x08\x01\0\0", "is truncated: 6 bytes, shorter than its 8-byte header."),
    (b"\0\0\x08\x01\0\0\0\x05abc", "is truncated: 11 bytes, its header implies 13."),
    (b"\0\0\x08\x01\0\0\0\x01ab", "is too long: 10 bytes, its header implies 9."),
    (b"PK\x03\x04" + b"\0" * 20,
     "has a bad magic number 1347093252 (0x504b0304); it is not an uncompressed idx file."),
    (b"\x1f\x8b\x08\x00" + b"\0" * 20,
     "has a bad magic number 529205248 (0x1f8b0800); it is not an uncompressed idx file."),
])
def test_read_idx_corrupt(tmp_path, content, words):
    path = tmp_path / "bad-idx"
    path.write_bytes(content)
    with raises_exactly(DataError, f"idx file '{path}' {words}"):
        data.read_idx(str(path))
    with raises_exactly(DataError, f"idx file '{tmp_path / 'absent'}' is missing."):
        data.read_idx(str(tmp_path / "absent"))


def test_write_idx_refuses_casting(tmp_path):
    with raises_exactly(TypeError, "For 'write_idx', the argument 'array' must have dtype uint8, int8, int16, int32, "
                                   "float32 or float64, but got bool."):
        data.write_idx(str(tmp_path / "x"), np.zeros(3, dtype=bool))
    with raises_exactly(TypeError, "For 'write_idx', the argument 'array' must be ndarray, but got [1, 2, 3] of type "
                                   "list."):
        data.write_idx(str(tmp_path / "x"), [1, 2, 3])
    with raises_exactly(ValueError, "For 'write_idx', the argument 'array' must have 1 to 255 dimensions, but got 0."):
        data.write_idx(str(tmp_path / "x"), np.array(3, dtype=np.uint8))
    assert not os.listdir(tmp_path)


# --------------------------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kwargs, error, message", [
    ({"batch_size": 0}, ValueError, "the argument 'batch_size' must be a positive int, but got 0."),
    ({"batch_size": True}, TypeError, "the argument 'batch_size' must be a positive int, but got True of type bool."),
    ({"batch_size": 32.0}, TypeError, "the argument 'batch_size' must be a positive int, but got 32.0 of type float."),
    ({"usage": "all"}, ValueError, "the argument 'usage' must be one of ['train', 'test'], but got 'all'."),
    ({"usage": None}, TypeError,
     "the argument 'usage' must be str, one of ['train', 'test'], but got None of type NoneType."),
    ({"shuffle": "yes"}, TypeError, "the argument 'shuffle' must be bool, but got 'yes' of type str."),
    ({"num_parallel_workers": 0}, ValueError,
     "the argument 'num_parallel_workers' must be a positive int, but got 0."),
    ({"num_shards": 2}, ValueError, "the arguments 'num_shards' and 'shard_id' must be given together, "
                                    "but got num_shards=2, shard_id=None."),
    ({"shard_id": 0}, ValueError, "the arguments 'num_shards' and 'shard_id' must be given together, "
                                  "but got num_shards=None, shard_id=0."),
    ({"num_shards": 0, "shard_id": 0}, ValueError, "the argument 'num_shards' must be a positive int, but got 0."),
    ({"num_shards": 2, "shard_id": 2}, ValueError, "the argument 'shard_id' must be in [0, 2), but got 2."),
    ({"num_shards": 2, "shard_id": -1}, ValueError,
     "the argument 'shard_id' must be a non-negative int, but got -1."),
    ({"num_samples": 0}, ValueError, "the argument 'num_samples' must be a positive int, but got 0."),
    ({"seed": -1}, ValueError, "the argument 'seed' must be a non-negative int, but got -1."),
    ({"seed": 2 ** 32}, ValueError, "the argument 'seed' must be in [0, 4294967295], but got 4294967296."),
    ({"drop_remainder": None}, TypeError, "the argument 'drop_remainder' must be bool, but got None of type NoneType."),
])
def test_create_dataset_bad_arguments(tmp_path, kwargs, error, message):
    # A directory that does not exist: arguments are validated before any file is looked at.
    with raises_exactly(error, f"For 'create_dataset', {message}"):
        data.create_dataset(str(tmp_path / "nowhere"), **kwargs)


def test_datapipe_bad_arguments_and_path(tmp_path):
    with raises_exactly(ValueError, "For 'datapipe', the argument 'batch_size' must be a positive int, but got -1."):
        data.datapipe(str(tmp_path), batch_size=-1)
    with raises_exactly(TypeError, "For 'datapipe', the argument 'data_path' must be str or PathLike, but got None of "
                                   "type NoneType."):
        data.datapipe(None)


def test_no_batch_is_an_error_not_an_empty_dataset(synth):
    with raises_exactly(ValueError, "For 'create_dataset', the dataset yields no batch: fewer samples than batch_size "
                                    "32 with drop_remainder=True (num_samples=10, num_shards=None)."):
        data.create_dataset(synth, 32, "test", num_samples=10)
    assert data.create_dataset(synth, 32, "test", num_samples=10, drop_remainder=False).get_dataset_size() == 1


def test_pipelines_on_synthetic(synth):
    x, y = stacked(data.create_dataset(synth, 25, "train", seed=0))
    assert x.shape == (200, 1, 32, 32) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.bincount(y, minlength=10).tolist() == [20] * 10
    x, y = stacked(data.datapipe(synth, 25, "test"))
    assert x.shape == (100, 1, 28, 28)
    np.testing.assert_array_equal(y, data.read_idx(os.path.join(synth, "test", "t10k-labels-idx1-ubyte")))


# --------------------------------------------------------------------------------------- resolve_data_dir

def test_resolve_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("MS_ACCUM_MNIST", raising=False)
    assert data.resolve_data_dir() == os.path.join(".", "datasets", "MNIST_Data")
    monkeypatch.setenv("MS_ACCUM_MNIST", "")
    assert data.resolve_data_dir() == os.path.join(".", "datasets", "MNIST_Data")
    monkeypatch.setenv("MS_ACCUM_MNIST", "/from/env")
    assert data.resolve_data_dir() == "/from/env"
    assert data.resolve_data_dir("/from/arg") == "/from/arg"
    assert data.resolve_data_dir(tmp_path) == str(tmp_path)
    assert data.resolve_data_dir("~/x") == os.path.expanduser("~/x")
    with raises_exactly(TypeError, "For 'resolve_data_dir', the argument 'path' must be str or PathLike, but got 3 of "
                                   "type int."):
        data.resolve_data_dir(3)


# ------------------------------------------------------------------------------------------- download_mnist

class _Handler(http.server.SimpleHTTPRequestHandler):
    stall = threading.Event()  # set to release a stalled response

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def do_GET(self):
        if self.path.startswith("/stall"):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"PK")
            self.wfile.flush()
            self.stall.wait(5.0)  # bounded: the server never hangs a test run
            return
        super().do_GET()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A loopback HTTP server over a directory holding a synthetic MNIST zip and a file that is not a zip."""
    root = tmp_path_factory.mktemp("served")
    mnist = data.make_synthetic_mnist(str(root / "src"), num_train=40, num_test=20, seed=2)
    with zipfile.ZipFile(root / "MNIST_Data.zip", "w") as zf:
        for rel in data.MNIST_FILES:
            zf.write(os.path.join(mnist, rel), "MNIST_Data/" + rel)
    (root / "garbage.zip").write_bytes(b"this is not a zip file" * 100)
    md5s = {rel: data._md5(os.path.join(mnist, rel)) for rel in data.MNIST_FILES}
    handler = lambda *a, **k: _Handler(*a, directory=str(root), **k)  # noqa: E731
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", md5s
    _Handler.stall.set()
    server.shutdown()
    server.server_close()


def _closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/MNIST_Data.zip"  # nothing listens: connection refused at once


def _download_temp_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tmp_download_tempdir_*")))


def _assert_failed_cleanly(root, info, before_temp):
    assert str(info.value).endswith(f". {WHAT_TO_DO}")
    assert os.listdir(root) == []  # no MNIST_Data, no hidden temporary directory
    assert _download_temp_dirs() <= before_temp  # the `download` package's own temp dir is gone too


# Named ids: the closed port differs in every process that collects the tests (pytest-xdist's workers must agree).
@pytest.mark.parametrize("url", [_closed_port_url(), "http://mnist.invalid/MNIST_Data.zip"],
                         ids=["closed-port", "unknown-host"])
def test_download_offline_fails_fast_and_clean(tmp_path, url):
    root = str(tmp_path / "datasets")
    before = _download_temp_dirs()
    # The reason is the operating system's (connection refused, or the resolver's words for an unknown name).
    fetch = f"RuntimeError: Error while fetching file {url}. Dataset fetching aborted. Error: <urlopen error "
    with pytest.raises(DataError, match="^" + re.escape(f"Could not download MNIST from {url}: {fetch}") + r"[^>]+>\. "
                                        + re.escape(WHAT_TO_DO) + "$") as info:
        data.download_mnist(root, timeout=2.0, url=url)
    _assert_failed_cleanly(root, info, before)


@pytest.mark.parametrize("name", ["missing.zip", "garbage.zip", "MNIST_Data.zip"])
def test_download_failures_leave_nothing(served, tmp_path, name):
    base, md5s = served
    root = str(tmp_path / "datasets")
    before = _download_temp_dirs()
    url = f"{base}/{name}"
    failure = {
        "missing.zip": f"RuntimeError: Error while fetching file {url}. Dataset fetching aborted. Error: HTTP Error "
                       f"404: File not found",
        "garbage.zip": "BadZipFile: File is not a zip file",
        # synthetic content under the real checksums
        "MNIST_Data.zip": "; ".join(f"'{rel}' has MD5 {md5s[rel]}, expected {expected}"
                                    for rel, expected in data.MNIST_FILES.items())}[name]
    with raises_exactly(DataError, f"Could not download MNIST from {url}: {failure}. {WHAT_TO_DO}") as info:
        data.download_mnist(root, timeout=5.0, url=url)
    _assert_failed_cleanly(root, info, before)


def test_download_stalled_server_times_out(served, tmp_path):
    base, _ = served
    root = str(tmp_path / "datasets")
    # The server sends 2 of 1000 bytes, then stalls: "timed out", not a short read, shows the timeout ended it.
    url = f"{base}/stall.zip"
    with raises_exactly(DataError, f"Could not download MNIST from {url}: RuntimeError: Error while fetching file "
                                   f"{url}. Dataset fetching aborted. Error: timed out. {WHAT_TO_DO}"):
        data.download_mnist(root, timeout=0.5, url=url)
    assert os.listdir(root) == []
    assert socket.getdefaulttimeout() is None  # restored


def test_download_verifies_moves_and_then_skips(served, tmp_path, monkeypatch):
    base, md5s = served
    monkeypatch.setattr(data, "MNIST_FILES", md5s)  # accept the served synthetic files
    root = tmp_path / "datasets"
    # A damaged earlier copy is replaced.
    (root / "MNIST_Data" / "train").mkdir(parents=True)
    (root / "MNIST_Data" / "train" / "train-images-idx3-ubyte").write_bytes(b"\0\0\x08\x03")
    target = data.download_mnist(str(root), timeout=5.0, url=f"{base}/MNIST_Data.zip")
    assert target == os.path.join(str(root), "MNIST_Data")
    assert data.check_mnist_dir(target) == target
    assert sorted(os.listdir(root)) == ["MNIST_Data"]
    assert {rel: data._md5(os.path.join(target, rel)) for rel in md5s} == md5s

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although valid data was there")

    import download
    monkeypatch.setattr(download, "download", no_download)
    assert data.download_mnist(str(root), url=_closed_port_url()) == target


def test_download_refuses_synthetic_and_bad_arguments(synth, tmp_path):
    root = os.path.dirname(synth)
    with raises_exactly(DataError, f"'{synth}' holds synthetic data (it has a SYNTHETIC file); remove it or choose "
                                   f"another root to download the real MNIST."):
        data.download_mnist(root, url=_closed_port_url())
    with raises_exactly(ValueError, "For 'download_mnist', the argument 'timeout' must be a positive float, but got "
                                    "0."):
        data.download_mnist(str(tmp_path), timeout=0)
    with raises_exactly(TypeError, "For 'download_mnist', the argument 'root' must be str or PathLike, but got None of "
                                   "type NoneType."):
        data.download_mnist(None)
    assert os.listdir(tmp_path) == []


# -------------------------------------------------------------------------------------- make_synthetic_mnist

def _file_bytes(path):
    out = {}
    for rel in data.MNIST_FILES:
        with open(os.path.join(path, rel), "rb") as f:
            out[rel] = f.read()
    return out


def test_synthetic_layout_balance_and_determinism(tmp_path):
    a = data.make_synthetic_mnist(str(tmp_path / "a"), num_train=205, num_test=50, seed=4)
    assert a == os.path.join(str(tmp_path / "a"), "MNIST_Data")
    assert data.check_mnist_dir(a) == a and data.is_synthetic(a)
    assert sorted(os.listdir(tmp_path / "a")) == ["MNIST_Data"]
    images = data.read_idx(os.path.join(a, "train", "train-images-idx3-ubyte"))
    labels = data.read_idx(os.path.join(a, "train", "train-labels-idx1-ubyte"))
    assert images.shape == (205, 28, 28) and labels.shape == (205,)
    counts = np.bincount(labels, minlength=10)
    assert counts.min() >= 20 and counts.max() <= 21
    # MNIST-like: black background, bright strokes, ink over roughly 10-25% of the mean intensity.
    assert (images == 0).mean() > 0.6 and images.max() >= 190 and 0.08 < images.mean() / 255 < 0.25
    # Per-class mean images differ: the classes are distinguishable.
    means = np.stack([images[labels == k].mean(0) for k in range(10)]).reshape(10, -1)
    assert np.min([np.abs(means[i] - means[j]).mean() for i in range(10) for j in range(i)]) > 5

    same = data.make_synthetic_mnist(str(tmp_path / "b"), num_train=205, num_test=50, seed=4)
    other = data.make_synthetic_mnist(str(tmp_path / "c"), num_train=205, num_test=50, seed=5)
    more = data.make_synthetic_mnist(str(tmp_path / "d"), num_train=300, num_test=50, seed=4)
    assert _file_bytes(a) == _file_bytes(same)
    assert _file_bytes(a)["train/train-images-idx3-ubyte"] != _file_bytes(other)["train/train-images-idx3-ubyte"]
    assert _file_bytes(a)["test/t10k-images-idx3-ubyte"] == _file_bytes(more)["test/t10k-images-idx3-ubyte"]


def test_synthetic_replaces_synthetic_never_real(tmp_path):
    root = str(tmp_path / "root")
    first = data.make_synthetic_mnist(root, num_train=30, num_test=20, seed=0)
    second = data.make_synthetic_mnist(root, num_train=40, num_test=20, seed=0)
    assert first == second
    assert data.read_idx(os.path.join(second, "train", "train-labels-idx1-ubyte")).shape == (40,)
    assert sorted(os.listdir(root)) == ["MNIST_Data"]
    os.remove(os.path.join(second, data.SYNTHETIC_MARKER))  # now it looks like real data
    before = _file_bytes(second)
    with raises_exactly(ValueError, f"For 'make_synthetic_mnist', the argument 'root' must not hold real data, but "
                                    f"'{second}' exists and is not synthetic; it is never replaced."):
        data.make_synthetic_mnist(root, num_train=30, num_test=20)
    assert _file_bytes(second) == before and sorted(os.listdir(root)) == ["MNIST_Data"]
    assert not data.is_synthetic(second)


def test_synthetic_interrupted_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real_write = data.write_idx

    def failing_write(path, array):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C half-way
        real_write(path, array)

    monkeypatch.setattr(data, "write_idx", failing_write)
    root = tmp_path / "root"
    with pytest.raises(KeyboardInterrupt):
        data.make_synthetic_mnist(str(root), num_train=30, num_test=20)
    assert os.listdir(root) == []


def test_synthetic_bad_arguments(tmp_path):
    with raises_exactly(ValueError, "For 'make_synthetic_mnist', the argument 'num_train' must be a positive int, but "
                                    "got 0."):
        data.make_synthetic_mnist(str(tmp_path), num_train=0)
    with raises_exactly(ValueError, "For 'make_synthetic_mnist', the argument 'seed' must be a non-negative int, but "
                                    "got -1."):
        data.make_synthetic_mnist(str(tmp_path), seed=-1)
    assert os.listdir(tmp_path) == []
    assert not data.is_synthetic(str(tmp_path))


@pytest.mark.slow  # make test-all (make test answers within 8 minutes)
def test_lenet5_learns_synthetic(tmp_path):
    """The point of the synthetic set: LeNet5 learns it quickly (96.6-98.2% over seeds 0-3 when measured)."""
    import mindspore as ms
    from mindspore import nn
    from ms_accum.demo.models import LeNet5

    path = data.make_synthetic_mnist(str(tmp_path), num_train=2000, num_test=500, seed=0)
    ms.set_seed(0)
    net = LeNet5()
    optimizer = nn.Adam(net.trainable_params(), 3e-3)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    for epoch in range(3):
        for x, y in data.create_dataset(path, 64, "train", seed=epoch).create_tuple_iterator(num_epochs=1):
            step(x, y)
    correct = total = 0
    for x, y in data.create_dataset(path, 100, "test").create_tuple_iterator(output_numpy=True, num_epochs=1):
        correct += int((net(ms.Tensor(x)).asnumpy().argmax(1) == y).sum())
        total += len(y)
    assert total == 500
    assert correct / total > 0.9

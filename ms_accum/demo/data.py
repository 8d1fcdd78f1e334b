"""MNIST for the tutorials: locate, check, download, synthesize and load it as MindSpore datasets.

The layout is the one MindSpore's documentation unpacks `MNIST_Data.zip` to::

    MNIST_Data/train/train-images-idx3-ubyte   MNIST_Data/train/train-labels-idx1-ubyte
    MNIST_Data/test/t10k-images-idx3-ubyte     MNIST_Data/test/t10k-labels-idx1-ubyte

Everything that reads these files checks them first with :func:`check_mnist_dir` (headers and sizes only),
because `mindspore.dataset.MnistDataset` reports a missing or damaged file late, from C++, in the middle of
an iterator, or not at all (a wrong directory silently yields zero samples).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .._validation import (ArgumentTypeError, ArgumentValueError, MessageError, NoBatchError, check_isinstance,
                           check_positive_float, check_positive_int, check_value_in, door)

if TYPE_CHECKING:  # the dataset engine is imported only when a pipeline is built
    from mindspore.dataset import Dataset

PathLike = Union[str, "os.PathLike[str]"]

MNIST_URL = "https://mindspore-website.obs.cn-north-4.myhuaweicloud.com/notebook/datasets/MNIST_Data.zip"
MNIST_FILES: Dict[str, str] = {
    "train/train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train/train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "test/t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "test/t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
ENV_VAR = "MS_ACCUM_MNIST"
DEFAULT_DATA_DIR = os.path.join(".", "datasets", "MNIST_Data")
SYNTHETIC_MARKER = "SYNTHETIC"

# (images, labels) of each split, relative to the MNIST_Data directory.
_SPLITS: Dict[str, Tuple[str, str]] = {
    "train": ("train/train-images-idx3-ubyte", "train/train-labels-idx1-ubyte"),
    "test": ("test/t10k-images-idx3-ubyte", "test/t10k-labels-idx1-ubyte"),
}
_IMAGE_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
_LABEL_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension
_SIDE = 28

# idx type codes (third magic byte); every multi-byte type is big-endian on disk.
_IDX_DTYPES: Dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}

# Normalization of the documentation (MNIST's pixel mean and std on [0, 1]).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

_WHAT_TO_DO = ("Put MNIST (the four idx files, uncompressed, as MNIST_Data/train/ and MNIST_Data/test/) in a "
               "directory and pass it with --data DIR or set the environment variable "
               f"{ENV_VAR}=DIR.")


class DataError(MessageError, ValueError):
    """The data on disk (or behind a URL) is missing, damaged or not what was expected."""


@door("resolve_data_dir")
def resolve_data_dir(path: Optional[PathLike] = None) -> str:
    """
    Choose the MNIST directory: `path` if given, else the environment variable `MS_ACCUM_MNIST`, else
    ``./datasets/MNIST_Data``.

    Args:
        path (Union[str, os.PathLike], optional): An explicit directory, e.g. from ``--data``. Default: ``None``.

    Returns:
        str, the chosen directory (``~`` expanded). It is not checked: see :func:`check_mnist_dir`.

    Raises:
        TypeError: If `path` is neither None, a str nor an os.PathLike.
    """
    if path is not None:
        check_isinstance(path, "path", (str, os.PathLike))
        path = os.fspath(path)
    # An empty value (`--data ""`, `MS_ACCUM_MNIST=`) means "not set", as shells make such values easily.
    if not path:
        path = os.environ.get(ENV_VAR) or DEFAULT_DATA_DIR
    return os.path.expanduser(path)


def _idx_header(path: str, expected: Optional[int] = None) -> Tuple[np.dtype, Tuple[int, ...]]:
    """(dtype, shape) of an idx file, from its header; checks the magic number (`expected`, if given) and the size.

    Raises DataError naming the file if it is missing, not an idx file (of the `expected` kind), or not as long as
    its header says."""
    if not os.path.exists(path):
        hint = " (found a .gz beside it: decompress it)" if os.path.exists(path + ".gz") else ""
        raise DataError("idx file '{path}' is missing{hint}.", path=path, hint=hint)
    if not os.path.isfile(path):
        raise DataError("idx file '{path}' is not a regular file.", path=path)
    with open(path, "rb") as f:
        magic = f.read(4)
        if len(magic) < 4:
            raise DataError("idx file '{path}' is truncated: {value} bytes, shorter than its magic number.",
                            path=path, value=len(magic))
        zero, type_code, ndim = int.from_bytes(magic[:2], "big"), magic[2], magic[3]
        number = int.from_bytes(magic, "big")
        if zero != 0 or type_code not in _IDX_DTYPES or ndim == 0:
            raise DataError("idx file '{path}' has a bad magic number {number} (0x{number:08x}); it is not an "
                            "uncompressed idx file.", path=path, number=number)
        dims = f.read(4 * ndim)
    offset = 4 + 4 * ndim
    if len(dims) < 4 * ndim:
        raise DataError("idx file '{path}' is truncated: {value} bytes, shorter than its {offset}-byte header.",
                        path=path, value=4 + len(dims), offset=offset)
    if expected is not None and number != expected:
        raise DataError("MNIST file '{path}' has a bad magic number {number} (0x{number:08x}), expected {expected} "
                        "(0x{expected:08x}); it is not an uncompressed idx file of this kind.", path=path,
                        number=number, expected=expected)
    shape, dtype = tuple(int(d) for d in np.frombuffer(dims, dtype=">u4")), _IDX_DTYPES[type_code]
    size, implied = os.path.getsize(path), offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != implied:
        raise DataError("idx file '{path}' is {value}: {size} bytes, its header implies {implied}.", path=path,
                        value='truncated' if size < implied else 'too long', size=size, implied=implied)
    return dtype, shape


@door("check_mnist_dir")
def check_mnist_dir(path: PathLike) -> str:
    """
    Check that `path` holds the four MNIST idx files with sound headers, cheaply (headers and sizes only).

    For each file: it exists, its magic number is 2051 (images) or 2049 (labels), its size equals what the header
    implies, images are 28x28, and each split has as many labels as images. Pixel and label values are not read.

    Args:
        path (Union[str, os.PathLike]): The MNIST_Data directory, holding ``train/`` and ``test/``.

    Returns:
        str, `path` as a str.

    Raises:
        TypeError: If `path` is not a str or os.PathLike.
        DataError: If a file is missing, truncated, too long, has a bad magic number or image size, or the
            label and image counts of a split differ. The message names the file.
    """
    check_isinstance(path, "path", (str, os.PathLike))
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DataError("MNIST directory '{path}' does not exist or is not a directory. {WHAT_TO_DO}", path=path,
                        WHAT_TO_DO=_WHAT_TO_DO)
    # The tutorials pass 'MNIST_Data/train'; say so instead of only "missing train/train/...".
    one_split = os.path.basename(os.path.normpath(path)) in _SPLITS and not os.path.isdir(os.path.join(path, "train"))
    for images_rel, labels_rel in _SPLITS.values():
        images, labels = os.path.join(path, images_rel), os.path.join(path, labels_rel)
        try:
            _, (count, rows, cols) = _idx_header(images, _IMAGE_MAGIC)
            if (rows, cols) != (_SIDE, _SIDE):
                raise DataError("MNIST file '{images}' holds {rows}x{cols} images, expected {side}x{side}.",
                                images=images, rows=rows, cols=cols, side=_SIDE)
            _, (label_count,) = _idx_header(labels, _LABEL_MAGIC)
        except DataError as err:
            if not one_split:
                raise
            raise DataError("{err} '{path}' looks like one split: pass its parent, the directory that holds both "
                            "train/ and test/.", err=err, path=path) from None
        if label_count != count:
            raise DataError("MNIST file '{labels}' has {label_count} labels but '{images}' has {count} images.",
                            labels=labels, label_count=label_count, images=images, count=count)
    return path


def read_idx(path: PathLike) -> np.ndarray:
    """
    Read an idx file (the MNIST format) into an array.

    Args:
        path (Union[str, os.PathLike]): The file, uncompressed.

    Returns:
        numpy.ndarray, with the header's shape and dtype (uint8 for MNIST), in native byte order.

    Raises:
        DataError: If the file is missing, its magic number is not an idx one, or its size does not match its header.
    """
    path = os.fspath(path)
    dtype, dims = _idx_header(path)
    offset = 4 + 4 * len(dims)
    # idx stores multi-byte values big-endian: astype gives them in native byte order.
    return np.fromfile(path, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


@door("write_idx")
def write_idx(path: PathLike, array: Any) -> None:
    """
    Write an array as an idx file, atomically (a temporary file beside it, then a rename).

    Args:
        path (Union[str, os.PathLike]): The file to write; its directory must exist.
        array (numpy.ndarray): The data: uint8 for MNIST (idx3 images, idx1 labels); int8, int16, int32,
            float32 and float64 are written too. At least 1 dimension.

    Raises:
        TypeError: If `array` is not a numpy.ndarray or its dtype has no idx code. Values are never cast:
            a float image in [0, 1] written as uint8 would silently become zeros.
        ValueError: If `array` is 0-dimensional, or has more than 255 dimensions.
    """
    check_isinstance(array, "array", np.ndarray)
    codes = {dt.newbyteorder("=") if dt.itemsize > 1 else dt: code for code, dt in _IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=") if array.dtype.itemsize > 1 else array.dtype
    if native not in codes:
        raise ArgumentTypeError("{@array:subject} must have dtype uint8, int8, int16, int32, float32 or float64, but "
                                "got {dtype}.", dtype=array.dtype)
    if not 1 <= array.ndim <= 255:
        raise ArgumentValueError("{@array:subject} must have 1 to 255 dimensions, but got {ndim}.", ndim=array.ndim)
    path = os.fspath(path)
    code = codes[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    body = np.ascontiguousarray(array, dtype=_IDX_DTYPES[code]).tobytes()
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@door("download_mnist")
def download_mnist(root: PathLike = "./datasets", timeout: float = 30.0, url: Optional[str] = None) -> str:
    """
    Download MNIST as MindSpore's documentation does, verified, into ``root/MNIST_Data``.

    Nothing is downloaded when ``root/MNIST_Data`` already passes :func:`check_mnist_dir`. Otherwise the zip is fetched
    with the `download` package and unpacked into a temporary directory inside `root`; the MD5 of each of the four files
    is checked against `MNIST_FILES`, and only when all match are they moved into ``root/MNIST_Data/{train,test}``. On
    any failure the temporary directory is removed, so no partial file is left.

    Args:
        root (Union[str, os.PathLike]): The directory to hold ``MNIST_Data``. Default: ``"./datasets"``.
        timeout (float): Seconds to wait for the server to answer, so an offline machine fails fast.
            Default: ``30.0``.
        url (str, optional): Where to fetch the zip. Default: ``None``, meaning `MNIST_URL`.

    Returns:
        str, the MNIST directory, ``root/MNIST_Data``.

    Raises:
        TypeError: If `root` is not a path, `timeout` is not a number, or `url` is not a str.
        ValueError: If `timeout` is not positive.
        DataError: If the download, the archive or a checksum fails, or ``root/MNIST_Data`` holds synthetic
            data (it is never overwritten). The message says how to provide MNIST by hand.
    """
    check_isinstance(root, "root", (str, os.PathLike))
    timeout = check_positive_float(timeout, "timeout")
    url = MNIST_URL if url is None else check_isinstance(url, "url", str)
    root = os.fspath(root)
    target = os.path.join(root, "MNIST_Data")
    if is_synthetic(target):
        raise DataError("'{target}' holds synthetic data (it has a {SYNTHETIC_MARKER} file); remove it or choose "
                        "another root to download the real MNIST.", target=target, SYNTHETIC_MARKER=SYNTHETIC_MARKER)
    if os.path.isdir(target):
        with contextlib.suppress(DataError):  # missing or damaged: download, then replace the four files
            return check_mnist_dir(target)

    os.makedirs(root, exist_ok=True)
    # Inside root, so the final moves are renames on one filesystem: no half-copied file can appear.
    tmp = tempfile.mkdtemp(prefix=".MNIST_Data.download-", dir=root)
    try:
        failure = _fetch_verified(url, tmp, timeout)
        if failure is None:
            unpacked = _unpacked_root(tmp)
            for rel in MNIST_FILES:
                os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
                os.replace(os.path.join(unpacked, rel), os.path.join(target, rel))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Raised outside any `except` block on purpose: `download` keeps the zip in a temporary directory that
    # it deletes only when its frame is freed, and a chained exception would keep that frame alive.
    if failure is not None:
        raise DataError("Could not download MNIST from {url}: {failure}. {WHAT_TO_DO}", url=url, failure=failure,
                        WHAT_TO_DO=_WHAT_TO_DO)
    return check_mnist_dir(target)


def _unpacked_root(tmp: str) -> str:
    # MindSpore's zip holds MNIST_Data/{train,test}/...; accept a zip of the two folders alone as well.
    nested = os.path.join(tmp, "MNIST_Data")
    return nested if os.path.isdir(nested) else tmp


def _fetch_verified(url: str, tmp: str, timeout: float) -> Optional[str]:
    """Download and unpack `url` into `tmp` and check the MD5s; return None, or why it failed."""
    try:
        from download import download  # pylint: disable=import-outside-toplevel
        # `download` passes `timeout` to its header requests only; the body is read through a urlopen
        # without one, which would wait forever on a stalled server. The default socket timeout bounds it.
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(timeout)
        try:
            download(url, tmp, kind="zip", replace=True, timeout=timeout)
        finally:
            socket.setdefaulttimeout(previous)
    except Exception as err:  # pylint: disable=broad-except
        # `download` wraps network errors in RuntimeError and lets zipfile/OSError errors through.
        return f"{type(err).__name__}: {err}".replace("\n", " ")
    unpacked = _unpacked_root(tmp)
    problems = []
    for rel, expected in MNIST_FILES.items():
        file = os.path.join(unpacked, rel)
        if not os.path.isfile(file):
            problems.append(f"'{rel}' is not in the archive")
        else:
            actual = _md5(file)
            if actual != expected:
                problems.append(f"'{rel}' has MD5 {actual}, expected {expected}")
    return "; ".join(problems) if problems else None


@dataclass(frozen=True)
class _Reading:
    """What a pipeline reads and how it batches it: the options `create_dataset` and `datapipe` share."""

    batch_size: int
    usage: str
    shuffle: Optional[bool]  # None: shuffle the training split only
    drop_remainder: bool
    num_parallel_workers: int = 1
    num_shards: Optional[int] = None
    shard_id: Optional[int] = None
    num_samples: Optional[int] = None
    seed: Optional[int] = None

    def check(self) -> None:
        check_positive_int(self.batch_size, "batch_size")
        check_value_in(self.usage, "usage", tuple(_SPLITS))
        if self.shuffle is not None:
            check_isinstance(self.shuffle, "shuffle", bool)
        check_positive_int(self.num_parallel_workers, "num_parallel_workers")
        if (self.num_shards is None) != (self.shard_id is None):
            raise ArgumentValueError("the arguments {@num_shards} and {@shard_id} must be given together, but got "
                                     "{num_shards=}, {shard_id=}.", num_shards=self.num_shards, shard_id=self.shard_id)
        if self.num_shards is not None:
            check_positive_int(self.num_shards, "num_shards")
            check_positive_int(self.shard_id, "shard_id", minimum=0)
            if self.shard_id >= self.num_shards:
                raise ArgumentValueError("{@shard_id:subject} must be in [0, {num_shards}), but got {shard_id}.",
                                         num_shards=self.num_shards, shard_id=self.shard_id)
        if self.num_samples is not None:
            check_positive_int(self.num_samples, "num_samples")
        if self.seed is not None:
            check_positive_int(self.seed, "seed", minimum=0)
            if self.seed > 0xFFFFFFFF:
                raise ArgumentValueError("{@seed:subject} must be in [0, 4294967295], but got {seed}.", seed=self.seed)
        check_isinstance(self.drop_remainder, "drop_remainder", bool)


def _build_pipeline(data_path: PathLike, image_size: int, reading: _Reading) -> Dataset:
    """Validate, check the files, then build MnistDataset -> image ops + label cast -> batch."""
    check_isinstance(data_path, "data_path", (str, os.PathLike))
    reading.check()
    data_path = check_mnist_dir(data_path)

    # Imported here so the idx helpers and the downloader work without starting the dataset engine.
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    from mindspore.dataset import transforms  # pylint: disable=import-outside-toplevel

    # MnistDataset wants the directory that directly holds the idx files; given MNIST_Data itself it
    # silently yields 0 samples.
    dataset = ds.MnistDataset(os.path.join(data_path, reading.usage), usage=reading.usage, sampler=_sampler(reading),
                              num_parallel_workers=reading.num_parallel_workers)
    dataset = dataset.map(operations=_image_ops(image_size), input_columns="image",
                          num_parallel_workers=reading.num_parallel_workers)
    dataset = dataset.map(operations=transforms.TypeCast(ms.int32), input_columns="label",
                          num_parallel_workers=reading.num_parallel_workers)
    samples = dataset.get_dataset_size()
    dataset = dataset.batch(reading.batch_size, drop_remainder=reading.drop_remainder)
    if dataset.get_dataset_size() == 0:
        raise NoBatchError("the dataset yields no batch: fewer samples than {@batch_size:plain} {batch_size} with "
                           "drop_remainder=True ({num_samples=}, {num_shards=}).", batch_size=reading.batch_size,
                           num_samples=reading.num_samples, num_shards=reading.num_shards, samples=samples)
    return dataset


def _sampler(reading: _Reading):
    """One DistributedSampler (1 shard when not sharding) for every case: unlike RandomSampler, which reads the global
    dataset seed when an iterator starts, it takes the seed when it is built, so `seed` needs no global side effect
    (ds.config.set_seed also reseeds `random` and numpy). Each epoch reshuffles."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    shuffle = reading.usage == "train" if reading.shuffle is None else reading.shuffle
    sampler = ds.DistributedSampler(reading.num_shards or 1, reading.shard_id or 0, shuffle=shuffle,
                                    num_samples=reading.num_samples)
    if reading.seed is not None:
        sampler.seed = reading.seed
    return sampler


def _image_ops(image_size: int) -> list:
    """The image transforms of each pipeline, to CHW."""
    from mindspore.dataset import vision  # pylint: disable=import-outside-toplevel
    if image_size == _SIDE:  # the Accumulator page's datapipe
        image_ops = [vision.Rescale(1.0 / 255.0, 0.0), vision.Normalize(mean=(MNIST_MEAN,), std=(MNIST_STD,))]
    else:  # the LeNet tutorial's, with its normalization in the right order
        image_ops = [vision.Resize((image_size, image_size), interpolation=vision.Inter.LINEAR),
                     vision.Rescale(1.0 / 255.0, 0.0), vision.Rescale(1.0 / MNIST_STD, -MNIST_MEAN / MNIST_STD)]
    return image_ops + [vision.HWC2CHW()]


@door("create_dataset")
def create_dataset(data_path: PathLike, batch_size: int = 32, usage: str = "train", shuffle: Optional[bool] = None,
                   num_parallel_workers: int = 1, num_shards: Optional[int] = None, shard_id: Optional[int] = None,
                   num_samples: Optional[int] = None, seed: Optional[int] = None,
                   drop_remainder: bool = True) -> Dataset:
    r"""
    MNIST batches for LeNet5, as in MindSpore's LeNet tutorial, with the normalization in the right order.

    Each image is resized to 32x32 (bilinear), scaled to [0, 1], then normalized with MNIST's mean 0.1307
    and std 0.3081, and laid out CHW; labels are cast to int32. (The tutorial normalizes the raw [0, 255]
    pixels first and divides by 255 after, which gives values in about [-0.002, 0.033].)

    Args:
        data_path (Union[str, os.PathLike]): The MNIST_Data directory, holding ``train/`` and ``test/``.
        batch_size (int): Samples per batch. Default: ``32``.
        usage (str): ``"train"`` or ``"test"``. Default: ``"train"``.
        shuffle (bool, optional): Whether to shuffle (again every epoch). Default: ``None``, meaning ``True``
            for ``"train"`` and ``False`` for ``"test"``.
        num_parallel_workers (int): Workers of the reader and each map. Default: ``1``.
        num_shards (int, optional): Number of shards for data-parallel training; give `shard_id` with it.
            Default: ``None``.
        shard_id (int, optional): This process's shard, in [0, num_shards). Default: ``None``.
        num_samples (int, optional): Samples to read (per shard when sharding). Default: ``None``, all.
        seed (int, optional): Shuffle seed for this dataset only; all shards must use the same one.
            Default: ``None``, MindSpore's dataset seed (``mindspore.dataset.config.get_seed()``).
        drop_remainder (bool): Whether to drop the last, smaller batch. Default: ``True``.

    Returns:
        mindspore.dataset.Dataset, yielding ``image`` float32 :math:`(N, 1, 32, 32)` and ``label`` int32 :math:`(N,)`.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `batch_size`, `num_parallel_workers` or `num_samples` is not positive, `usage` is unknown, only
            one of `num_shards` and `shard_id` is given, `shard_id` is out of range, or no batch would be produced.
        DataError: If the MNIST files are missing or damaged.
    """
    return _build_pipeline(data_path, 32, _Reading(
        batch_size=batch_size, usage=usage, shuffle=shuffle, drop_remainder=drop_remainder,
        num_parallel_workers=num_parallel_workers, num_shards=num_shards, shard_id=shard_id, num_samples=num_samples,
        seed=seed))


@door("datapipe")
def datapipe(data_path: PathLike, batch_size: int = 32, usage: str = "train", shuffle: bool = False,
             drop_remainder: bool = False, **kwargs) -> Dataset:
    r"""
    MNIST batches for the MLP of MindSpore's "Gradient Accumulation" page (its `datapipe`): the 28x28 images
    scaled to [0, 1] and normalized (``vision.Normalize``), CHW, int32 labels. As on the page, nothing is shuffled and
    the last, smaller batch is kept unless asked otherwise.

    Args:
        data_path (Union[str, os.PathLike]): The MNIST_Data directory, holding ``train/`` and ``test/``.
        batch_size (int): Samples per batch. Default: ``32``.
        usage (str): ``"train"`` or ``"test"``. Default: ``"train"``.
        shuffle (bool): Whether to shuffle (again every epoch). Default: ``False``.
        drop_remainder (bool): Whether to drop the last, smaller batch. Default: ``False``.
        kwargs: `num_parallel_workers`, `num_shards`, `shard_id`, `num_samples`, `seed`, as :func:`create_dataset`
            takes them.

    Returns:
        mindspore.dataset.Dataset, yielding ``image`` float32 :math:`(N, 1, 28, 28)` and ``label`` int32 :math:`(N,)`.

    Raises:
        TypeError: If an argument has the wrong type, or an unknown keyword is given.
        ValueError: If an argument has a wrong value (see :func:`create_dataset`).
        DataError: If the MNIST files are missing or damaged.
    """
    return _build_pipeline(data_path, _SIDE, _Reading(batch_size=batch_size, usage=usage, shuffle=shuffle,
                                                      drop_remainder=drop_remainder, **kwargs))


# 5x7 bitmaps of the digits 0-9: distinct enough for a small CNN, varied below by affine jitter and ink.
_GLYPHS: Sequence[Sequence[str]] = (
    (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
)


def _glyph_bank() -> np.ndarray:
    """(10, 9, 7) float32 glyphs with a one-pixel zero border, so bilinear sampling fades out at the edges."""
    bank = np.zeros((10, 9, 7), dtype=np.float32)
    for digit, rows in enumerate(_GLYPHS):
        bank[digit, 1:-1, 1:-1] = [[ch == "#" for ch in row] for row in rows]
    return bank


def _render_digits(labels: np.ndarray, rng: np.random.Generator, chunk: int = 4096) -> np.ndarray:
    """Render `labels` as (N, 28, 28) uint8 images: glyph under a random affine map, stroke width and noise."""
    bank = _glyph_bank()
    out = np.empty((len(labels), _SIDE, _SIDE), dtype=np.uint8)
    ys, xs = np.mgrid[0:_SIDE, 0:_SIDE].astype(np.float32)
    for start in range(0, len(labels), chunk):
        lab = labels[start:start + chunk]
        n = len(lab)
        # Forward map glyph -> image: rotation @ shear @ scale (glyph pixel ~2.3-3.1 image pixels), then a
        # shift of the center; sampled through its inverse. Sizes keep every digit inside the 28x28 frame.
        angle = rng.uniform(-0.2, 0.2, n)
        shear = rng.uniform(-0.25, 0.25, n)
        sx, sy = rng.uniform(2.3, 3.0, n), rng.uniform(2.4, 3.1, n)
        cos, sin = np.cos(angle), np.sin(angle)
        a = np.stack([np.stack([cos * sx, (cos * shear - sin) * sy], -1),
                      np.stack([sin * sx, (sin * shear + cos) * sy], -1)], -2)  # (n, 2, 2)
        inv = np.linalg.inv(a).astype(np.float32)
        cx = 13.5 + rng.uniform(-2.0, 2.0, n).astype(np.float32)
        cy = 13.5 + rng.uniform(-2.0, 2.0, n).astype(np.float32)
        dx, dy = xs[None] - cx[:, None, None], ys[None] - cy[:, None, None]
        # Glyph coordinates relative to the bordered bank's center (3.0, 4.0).
        u = inv[:, 0, 0, None, None] * dx + inv[:, 0, 1, None, None] * dy + 3.0
        v = inv[:, 1, 0, None, None] * dx + inv[:, 1, 1, None, None] * dy + 4.0
        u, v = np.clip(u, 0.0, 6.0), np.clip(v, 0.0, 8.0)
        u0, v0 = np.minimum(np.floor(u).astype(np.int64), 5), np.minimum(np.floor(v).astype(np.int64), 7)
        fu, fv = u - u0, v - v0
        # Bilinear sampling as four gathers from each sample's glyph.
        idx = np.arange(n)[:, None, None]
        glyphs = bank[lab]
        val = ((1 - fv) * (1 - fu) * glyphs[idx, v0, u0] + (1 - fv) * fu * glyphs[idx, v0, u0 + 1]
               + fv * (1 - fu) * glyphs[idx, v0 + 1, u0] + fv * fu * glyphs[idx, v0 + 1, u0 + 1])
        # A lower threshold on the interpolated coverage draws a thicker stroke; the ramp keeps edges soft.
        thresh = rng.uniform(0.2, 0.55, n).astype(np.float32)[:, None, None]
        ink = np.clip((val - thresh) / 0.25 + 0.5, 0.0, 1.0)
        peak = rng.uniform(190.0, 255.0, n).astype(np.float32)[:, None, None]
        noise = rng.normal(0.0, 12.0, (n, _SIDE, _SIDE)).astype(np.float32)
        # Noise only near strokes keeps the background exactly 0, as in MNIST.
        img = ink * peak + noise * (ink > 0)
        out[start:start + n] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return out


@door("make_synthetic_mnist")
def make_synthetic_mnist(root: PathLike, num_train: int = 2000, num_test: int = 500, seed: int = 0) -> str:
    """
    Write a synthetic MNIST stand-in to ``root/MNIST_Data``: valid idx files of learnable digit images.

    Each image is one of ten 5x7 pixel-font digits under a random rotation, shear, scale and shift, with
    random stroke width, brightness and noise; labels are balanced (each digit within one of N/10). A LeNet5
    learns it to high accuracy within an epoch or two. A `SYNTHETIC` file marks the directory (see
    :func:`is_synthetic`). The directory is built in a temporary directory inside `root` and renamed into
    place, so an interrupted run leaves nothing half-written. The train and test sets are drawn from
    separate streams of `seed`: changing `num_train` does not change the test set.

    Args:
        root (Union[str, os.PathLike]): The directory to hold ``MNIST_Data``; created if needed.
        num_train (int): Training images. Default: ``2000``.
        num_test (int): Test images. Default: ``500``.
        seed (int): Seed of the generator; the same seed gives the same files. Default: ``0``.

    Returns:
        str, the MNIST directory, ``root/MNIST_Data``.

    Raises:
        TypeError: If `root` is not a path or a count or `seed` is not an int.
        ValueError: If a count is not positive or `seed` is negative, or ``root/MNIST_Data`` exists and is not
            synthetic (real data is never replaced).
    """
    check_isinstance(root, "root", (str, os.PathLike))
    check_positive_int(num_train, "num_train")
    check_positive_int(num_test, "num_test")
    check_positive_int(seed, "seed", minimum=0)
    root = os.fspath(root)
    target = os.path.join(root, "MNIST_Data")
    if os.path.lexists(target) and not is_synthetic(target):
        raise ArgumentValueError("{@root:subject} must not hold real data, but '{target}' exists and is not "
                                 "synthetic; it is never replaced.", target=target)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".MNIST_Data.synthetic-", dir=root)
    old = None
    try:
        for split, count, stream in (("train", num_train, 0), ("test", num_test, 1)):
            rng = np.random.default_rng([seed, stream])
            labels = rng.permutation(np.arange(count) % 10).astype(np.uint8)
            images_rel, labels_rel = _SPLITS[split]
            os.makedirs(os.path.join(tmp, split))
            write_idx(os.path.join(tmp, images_rel), _render_digits(labels, rng))
            write_idx(os.path.join(tmp, labels_rel), labels)
        with open(os.path.join(tmp, SYNTHETIC_MARKER), "w", encoding="utf-8") as f:
            f.write(f"Synthetic MNIST stand-in written by ms_accum.demo.data.make_synthetic_mnist: "
                    f"num_train={num_train} num_test={num_test} seed={seed}. Not real MNIST.\n")
        check_mnist_dir(tmp)
        if os.path.lexists(target):
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            old = tempfile.mkdtemp(prefix=".MNIST_Data.old-", dir=root)
            os.replace(target, os.path.join(old, "MNIST_Data"))
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def is_synthetic(path: PathLike) -> bool:
    """
    Whether the MNIST directory `path` was written by :func:`make_synthetic_mnist` (has a `SYNTHETIC` file).

    Args:
        path (Union[str, os.PathLike]): The MNIST_Data directory.

    Returns:
        bool, True if `path` holds the `SYNTHETIC` marker.
    """
    return os.path.isfile(os.path.join(os.fspath(path), SYNTHETIC_MARKER))


@door("dataset_for")
def dataset_for(model: str, data_path: PathLike, batch_size: int, usage: str = "train", **kwargs):
    """
    The pipeline each model of `ms_accum.demo.models` was documented with: `create_dataset` (32x32) for
    ``"lenet5"``, `datapipe` (28x28) for ``"mlp"``. Evaluation keeps every test image (no dropped remainder).

    Args:
        model (str): ``"lenet5"`` or ``"mlp"``.
        data_path (Union[str, os.PathLike]): The MNIST_Data directory.
        batch_size (int): Samples per batch.
        usage (str): ``"train"`` or ``"test"``. Default: ``"train"``.
        kwargs: Passed on (shuffle, seed, num_samples, num_shards, shard_id, ...).

    Returns:
        mindspore.dataset.Dataset.

    Raises:
        ValueError: If `model` is unknown, or as the chosen pipeline raises.
    """
    builders = {"lenet5": create_dataset, "mlp": datapipe}
    check_value_in(model, "model", tuple(builders))
    if usage == "test":
        kwargs.setdefault("drop_remainder", False)
    return builders[model](data_path, batch_size, usage=usage, **kwargs)

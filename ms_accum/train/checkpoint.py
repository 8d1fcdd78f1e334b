"""Checkpoints: MindSpore's own `.ckpt` format or safetensors, written atomically, with metadata, loaded strictly.

`mindspore.save_checkpoint` writes straight into the target file, so a crash mid-save leaves a torn file. Here a
save goes to a temporary file beside it, synced, then `os.replace`s the target (atomic on POSIX). The newest
checkpoint of a run is found by listing the directory and skipping unreadable files, never through a pointer file.
Metadata travels inside the file under ``ms_accum.``-prefixed keys, apart from parameter names: in a `.ckpt` as
entries of its own (`append_dict`), in a `.safetensors` file as the header's string metadata, each value as JSON.
The extension tells the formats apart, as it does for MindSpore (`mindspore.load_checkpoint_async`).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from typing import Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import mindspore as ms
from mindspore import Parameter, nn

from .._choices import CHECKPOINT_FORMATS
from .._mindspore import mindspore_logger
from .._validation import ArgumentTypeError, ArgumentValueError, MessageError, Setting, door
from ..core.dropout import is_random_state

# The layout of what ms_accum writes beside the parameters: 1, the first; 2, training states also record the position
# in global samples with the per-rank batch size and the world size (resuming on another device count). A file of a
# later format than this ms_accum knows is refused rather than misread; MindSpore's own files have none (0).
FORMAT_VERSION = 2
_META_PREFIX = "ms_accum."
_TMP_PREFIX = "."
_HEADER_LENGTH = 8  # a safetensors file opens with its header's length, a little-endian uint64
CHECKPOINT_MODE = 0o640  # the files' permissions: read and write for the owner, read for the group
MetaValue = Union[int, float, str, bool]


class CheckpointError(MessageError, ValueError):
    """A checkpoint that cannot be read or does not fit the network; the message names the file (and no caller: the
    file, not the call, is at fault)."""


class CheckpointWriteError(CheckpointError, ArgumentValueError):
    """A checkpoint that could not be written: the function the user called is named in front (`door`), as for any
    argument refused, since the target `path` is one."""


@door("save_checkpoint")
def save_checkpoint(save_obj: Union[nn.Cell, list], path: str, metadata: Optional[Dict[str, MetaValue]] = None) -> str:
    """
    Saves `save_obj` to `path` atomically, with `metadata` and a CRC.

    Args:
        save_obj (Union[nn.Cell, list]): What `mindspore.save_checkpoint` accepts: a Cell or a list of
            ``{"name": str, "data": Tensor}``.
        path (str): Target file; its directory must exist. An existing file is replaced only once the new one
            is complete on disk. A name ending in ``.safetensors`` is written as safetensors, any other as a
            MindSpore `.ckpt`.
        metadata (dict, optional): ints, floats, bools or strings stored beside the parameters.

    Returns:
        str, `path`.

    Raises:
        TypeError: If a metadata value is not an int, float, bool or str.
        CheckpointWriteError: If the file cannot be written (no space left, no permission: any `OSError`), a
            `CheckpointError`; the message names the file, its directory and the cause. The temporary files are
            removed and no other file changes.
    """
    append = _appended(metadata or {})
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    file_format = checkpoint_format(path)
    # MindSpore appends the format's extension to any other name.
    tmp = os.path.join(directory, f"{_TMP_PREFIX}{name}.tmp.{file_format}")
    written = tmp if file_format == "ckpt" else os.path.join(directory, f"{_TMP_PREFIX}{name}.raw.safetensors")
    try:
        with _quiet_mindspore_log():  # its CRITICAL line would name our temporary file; the error below says more
            if file_format == "ckpt":
                ms.save_checkpoint(save_obj, tmp, append_dict=append, crc_check=True)
            else:
                # MindSpore's safetensors writer stores append_dict's strings as arrays that safetensors refuses, and
                # computes no CRC of bfloat16 (docs/mindspore.md, "Safetensors checkpoints"): the metadata goes into
                # the header.
                tensors = save_obj.get_parameters() if isinstance(save_obj, nn.Cell) else (e["data"] for e in save_obj)
                crc = not any(tensor.dtype == ms.bfloat16 for tensor in tensors)
                ms.save_checkpoint(save_obj, written, format="safetensors", crc_check=crc)
                _copy_with_metadata(written, tmp, append)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        # MindSpore writes its files read-only for their owner (0400); readable by the group, a file that rank 0
        # saved can be copied by another account to another node (docs/resume.md).
        os.chmod(tmp, CHECKPOINT_MODE)
        os.replace(tmp, path)
    except OSError as err:
        raise CheckpointWriteError("'{name}' could not be written in '{directory}': {value}. No earlier file was "
                                   "changed.", name=name, directory=directory, value=err.strerror or err) from err
    finally:
        # mindspore.save_checkpoint writes `path` with its extension replaced by ".tmp" first, and leaves that file
        # behind when the write fails.
        for leftover in {tmp, written, os.path.splitext(written)[0] + ".tmp"}:
            if os.path.exists(leftover):
                os.remove(leftover)
    # Durability of the rename itself; not every file system lets a directory be opened or synced, which is harmless.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def _appended(metadata: Dict[str, MetaValue]) -> Dict[str, MetaValue]:
    """`metadata`, checked, as the file's entries: prefixed, with ms_accum's format version."""
    for key, value in metadata.items():
        if not isinstance(value, (int, float, str, bool)):
            raise ArgumentTypeError("{@metadata:subject} must map names to int, float, bool or str, but '{key}' is "
                                    "{name}.", key=key, name=type(value).__name__)
    append = {_META_PREFIX + "format_version": FORMAT_VERSION}
    # A Python float would be stored as a float32 Tensor: as numpy's float64 it comes back as it was, so a resumed run's
    # running averages (the noise scale's, AdaptiveK's) continue bit for bit.
    append.update({_META_PREFIX + key: np.float64(value) if type(value) is float else value
                   for key, value in metadata.items()})
    return append


def checkpoint_format(path: str) -> str:
    """The format of the checkpoint `path`, by its extension: ``"safetensors"`` or ``"ckpt"`` (any other name)."""
    return "safetensors" if os.fspath(path).endswith(".safetensors") else "ckpt"


def _safetensors_header(handle) -> dict:
    """The JSON header of the safetensors file open in `handle`, which is left at the first tensor's bytes."""
    length, size = int.from_bytes(handle.read(_HEADER_LENGTH), "little"), os.fstat(handle.fileno()).st_size
    if length > size:
        raise CheckpointError("its header says {length} bytes, more than the file's {size}.", length=length, size=size)
    return json.loads(handle.read(length))


def _copy_with_metadata(source: str, target: str, metadata: Dict[str, MetaValue]) -> None:
    """Copies the safetensors file `source` to `target` with `metadata` added to its header's string metadata (where
    Hugging Face tools and `safetensors.safe_open(...).metadata()` read it), each value as JSON: ints, floats, bools
    and strings come back as they were. The tensors' bytes are copied as they are; their offsets count from the end
    of the header."""
    with open(source, "rb") as src, open(target, "wb") as dst:
        header = _safetensors_header(src)
        header.setdefault("__metadata__", {}).update({key: json.dumps(value) for key, value in metadata.items()})
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)  # the tensors stay 8-byte aligned, as safetensors' own writer keeps them
        dst.write(len(text).to_bytes(_HEADER_LENGTH, "little") + text)
        shutil.copyfileobj(src, dst)


@contextlib.contextmanager
def _quiet_mindspore_log():
    logger = mindspore_logger()
    disabled = getattr(logger, "disabled", None)
    if logger is not None:
        logger.disabled = True
    try:
        yield
    finally:
        if logger is not None:
            logger.disabled = disabled


def load_checkpoint(path: str) -> Tuple[Dict[str, Parameter], Dict[str, MetaValue]]:
    """
    Reads a checkpoint, checking its CRC.

    Args:
        path (str): The `.ckpt` or `.safetensors` file (told apart by the extension). A safetensors file is checked
            against MindSpore's CRC where it carries one (MindSpore writes none for bfloat16).

    Returns:
        tuple (params, metadata): the parameters by name, and the metadata written by `save_checkpoint`
        (empty for a checkpoint MindSpore wrote itself).

    Raises:
        CheckpointError: If the file is missing, is not a checkpoint, is truncated, fails its CRC, or was written in a
            later format than `FORMAT_VERSION` (by a newer ms_accum).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError("Checkpoint '{path}' does not exist.", path=path)
    try:
        if checkpoint_format(path) == "ckpt":
            # crc_check verifies the CRC where the file carries one; a file MindSpore wrote without one still loads.
            raw = ms.load_checkpoint(path, crc_check=True)
        else:
            with open(path, "rb") as handle:
                stored = _safetensors_header(handle).get("__metadata__") or {}
            raw = ms.load_checkpoint(path, format="safetensors", crc_check="crc_num" in stored)
            raw.update({key: json.loads(value) for key, value in stored.items() if key.startswith(_META_PREFIX)})
    except Exception as err:  # MindSpore raises ValueError or RuntimeError with C++ detail; the cause is one
        raise CheckpointError("'{path}' is not a readable MindSpore checkpoint (truncated, corrupt or another "
                              "format): {value}", path=path,
                              value=str(err).splitlines()[0] if str(err) else type(err).__name__) from None
    params, metadata = {}, {}
    for name, value in raw.items():
        if name.startswith(_META_PREFIX):
            # append_dict stores numbers as 0-d Parameters and strings as str; a safetensors header, values as given.
            if not isinstance(value, (str, int, float, bool)):
                array = value.asnumpy()
                value = array.item() if array.size == 1 else array.tolist()
            metadata[name[len(_META_PREFIX):]] = value
        else:
            params[name] = value
    version = metadata.pop("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError("Checkpoint '{path}' has ms_accum format {version!r}, newer than the format "
                              "{FORMAT_VERSION} this ms_accum reads: upgrade ms_accum to load it.", path=path,
                              version=version, FORMAT_VERSION=FORMAT_VERSION)
    return params, metadata


def load_into(network: nn.Cell, path: str, strict: bool = True,
              expected: Optional[Dict[str, MetaValue]] = None,
              contents: Optional[Tuple[Dict[str, Parameter], Dict[str, MetaValue]]] = None,
              network_name: str = "the network") -> Dict[str, MetaValue]:
    """
    Loads a checkpoint into `network`, checking everything before changing anything.

    Args:
        network (nn.Cell): The network to fill.
        path (str): The checkpoint.
        strict (bool): Refuse a checkpoint whose parameters are missing from or extra to the network's.
            Default: ``True``. Training state beside the network's parameters is ignored either way: per-parameter
            slots named ``<slot>.<parameter>`` (optimizer moments, accumulation buffers) and scalars (step counts,
            learning rate, window counters, dropout's seeds and offsets). Dropout streams
            (`ms_accum.core.dropout.DropoutStreams`) that the file lacks, as files of 0.3 and older do, keep their
            value.
        expected (dict, optional): Metadata values the checkpoint must carry, e.g. ``{"model": "lenet5"}``.
        contents (tuple, optional): ``(params, metadata)`` of `path` as `load_checkpoint` returned them, for a
            caller that read the file already (to check its metadata first): the file is then not read again.
        network_name (str): What the network is, for messages. Default: ``"the network"``.

    Returns:
        dict, the checkpoint's metadata.

    Raises:
        CheckpointError: If the file cannot be read, its metadata differs from `expected`, or (when `strict`) a
            parameter is missing or extra; or if a shape or dtype differs. The network is then left untouched.
    """
    params, metadata = load_checkpoint(path) if contents is None else contents
    for key, value in (expected or {}).items():
        if key in metadata and metadata[key] != value:
            raise CheckpointError("Checkpoint '{path}' was saved with {saved}, but {asked} was asked for.", path=path,
                                  saved=Setting(key, metadata[key]), asked=Setting(key, value))
    own = {p.name: p for p in network.get_parameters()}
    # What optimizers and accumulation buffers keep beside a network: a slot per parameter ("moments.w",
    # "accumulate.w") or a scalar ("global_step", "accumulate.mini_step"). No list of names to keep in step.
    params = {name: value for name, value in params.items()
              if name in own or not (name.partition(".")[2] in own or value.size <= 1)}
    missing = sorted(name for name in set(own) - set(params) if not is_random_state(own[name]))
    extra = sorted(set(params) - set(own))
    if strict and (missing or extra):
        parts = [f"{what} parameter(s) {_names(names)}" for what, names in (("missing", missing), ("unexpected", extra))
                 if names]
        raise CheckpointError("Checkpoint '{path}' does not fit {network_name}: {value}.", path=path,
                              network_name=network_name, value='; '.join(parts))
    for name in sorted(set(own) & set(params)):
        if tuple(own[name].shape) != tuple(params[name].shape) or own[name].dtype != params[name].dtype:
            raise CheckpointError("Checkpoint '{path}' does not fit {network_name}: parameter '{name}' has shape "
                                  "{shape} and dtype {dtype} in the file but {own_shape} and {own_dtype} in the "
                                  "network.", path=path, network_name=network_name, name=name,
                                  shape=tuple(params[name].shape), dtype=params[name].dtype,
                                  own_shape=tuple(own[name].shape), own_dtype=own[name].dtype)
    not_loaded, _ = ms.load_param_into_net(network, params, strict_load=True)
    not_loaded = [name for name in not_loaded if name not in own or not is_random_state(own[name])]
    if strict and not_loaded:  # cannot happen after the checks above; kept so a MindSpore change cannot slip by
        raise CheckpointError("Checkpoint '{path}' left parameter(s) {value} unloaded.", path=path,
                              value=_names(not_loaded))
    return metadata


def _names(names: Iterable[str], limit: int = 5) -> str:
    names = list(names)
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def checkpoint_path(directory: str, prefix: str, step: int, file_format: str = "ckpt") -> str:
    """The file of optimizer step `step`: ``{directory}/{prefix}-{step:09d}.{file_format}`` (sorts by name and step)."""
    return os.path.join(directory, f"{prefix}-{step:09d}.{file_format}")


def list_checkpoints(directory: str, prefix: str) -> List[Tuple[int, str]]:
    """(step, path) of every ``{prefix}-{step}.ckpt`` and ``{prefix}-{step}.safetensors`` in `directory`, oldest
    first (of one step, the `.ckpt` first); temporary files excluded."""
    if not os.path.isdir(directory):
        return []
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)\.(?:{'|'.join(CHECKPOINT_FORMATS)})$")
    matches = (pattern.match(name) for name in os.listdir(directory))
    return sorted((int(match.group(1)), os.path.join(directory, match.group(0))) for match in matches if match)


def find_latest(directory: str, prefix: str) -> Optional[str]:
    """The newest checkpoint of `prefix` in `directory` that reads back with a valid CRC, or None."""
    for _, path in reversed(list_checkpoints(directory, prefix)):
        with contextlib.suppress(CheckpointError):
            load_checkpoint(path)
            return path
    return None


def prune(directory: str, prefix: str, keep_last: int) -> List[str]:
    """Deletes all but the newest `keep_last` checkpoints of `prefix`; returns the deleted paths."""
    found = list_checkpoints(directory, prefix)
    doomed = [path for _, path in found[:max(len(found) - keep_last, 0)]]
    for path in doomed:
        os.remove(path)
    return doomed

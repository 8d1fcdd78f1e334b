"""Saving a run's whole training state every few optimizer steps, and resuming from the newest file."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple, Union

from mindspore import nn

from .checkpoint import CheckpointError, MetaValue, checkpoint_path, find_latest, load_checkpoint, load_into, prune, \
    save_checkpoint

STATE_KIND = "training_state"  # metadata "kind" of the files `resume` accepts
# Before ms_accum 0.2 the executor's buffer was named "grad_sum" (the Accumulator's "accumulate"): such files load
# under today's one name.
_OLD_BUFFER_PREFIX, _BUFFER_PREFIX = "grad_sum.", "accumulate."


@dataclass
class Position:
    """Where a run is: enough, with the dataset's seed, to continue it exactly (saved in training states)."""

    epoch: int = 1
    batch: int = 0  # batches of `epoch` already read
    step: int = 0  # optimizer steps (windows applied)
    dropped_windows: int = 0


class StateCheckpoints:
    """
    The training-state files of one run, ``{ckpt_dir}/{ckpt_name}-{step:09d}.ckpt``.

    Each file holds `state` (a `TrainingState`), the `Position` and `run`, the settings a resumed run must share. It
    is written when a window has just closed; its zero buffer is saved too, so loading never leaves a stale one.

    Args:
        state (nn.Cell): What to save and load, strictly.
        ckpt_dir (str): The run's directory.
        ckpt_name (str): The files' prefix.
        run (dict): Settings stored in every file and checked on resume.
        metadata (dict, optional): More values stored in every file, not checked.
        save_every (int, optional): Save every this many optimizer steps; ``None`` saves nothing.
        keep_last (int, optional): Keep only the newest `keep_last` files. Default: ``None``, keep all.
        writes (bool): Whether this process writes (rank 0 in data parallel; every rank reads). Default: ``True``.
    """

    def __init__(self, state: nn.Cell, ckpt_dir: Optional[str], ckpt_name: str, run: Dict[str, MetaValue],
                 metadata: Optional[Dict[str, MetaValue]] = None, save_every: Optional[int] = None,
                 keep_last: Optional[int] = None, writes: bool = True) -> None:
        self.state, self.ckpt_dir, self.ckpt_name, self.run = state, ckpt_dir, ckpt_name, run
        self.metadata = {**run, **(metadata or {}), "kind": STATE_KIND}
        self.save_every = save_every if writes else None
        self.keep_last = keep_last

    def resume(self, resume: Union[bool, str, os.PathLike, None], epochs: int) -> Tuple[Position, Optional[str]]:
        """Loads the file `resume` names (``True``: the newest readable one, if any); returns where it left off."""
        if resume in (None, False):
            return Position(), None
        path = find_latest(self.ckpt_dir, self.ckpt_name) if resume is True else os.fspath(resume)
        if path is None:
            return Position(), None
        contents = load_checkpoint(path)
        meta = contents[1]
        if meta.get("kind") != STATE_KIND:
            raise CheckpointError(f"Checkpoint '{path}' holds no training state to resume from (it was not saved "
                                  f"with 'save_every').")
        for key, value in self.run.items():
            if meta.get(key) != value:
                raise CheckpointError(f"Checkpoint '{path}' was saved with {key}={meta.get(key)!r}, but this run has "
                                      f"{key}={value!r}: resuming would not continue the same training.")
        if meta["epoch"] > epochs:
            raise CheckpointError(f"Checkpoint '{path}' is at epoch {meta['epoch']}, beyond this run's {epochs} "
                                  f"epochs.")
        params = {_BUFFER_PREFIX + name[len(_OLD_BUFFER_PREFIX):] if name.startswith(_OLD_BUFFER_PREFIX) else name:
                  value for name, value in contents[0].items()}
        load_into(self.state, path, strict=True, contents=(params, meta))
        return Position(**{key: int(meta[key]) for key in Position.__dataclass_fields__}), path

    def window_closed(self, position: Position) -> None:
        """Saves the state when `position.step` is due (and prunes old files)."""
        if self.save_every is None or position.step % self.save_every:
            return
        save_checkpoint(self.state, checkpoint_path(self.ckpt_dir, self.ckpt_name, position.step),
                        {**self.metadata, **asdict(position)})
        if self.keep_last is not None:
            prune(self.ckpt_dir, self.ckpt_name, self.keep_last)

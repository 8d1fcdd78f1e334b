"""Saving a run's whole training state every few optimizer steps, and resuming from the newest file, on as many
devices as before or on another number of them (the same global batch per update, the same data order)."""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Tuple, Union

from mindspore import nn

from .._validation import ArgumentValueError, Message, Setting, Term
from ..core.dropout import is_random_state

from .adaptive import AdaptiveSettings
from .kpolicy import KPolicy
from .schedule import pairs_text
from .windows import Position, _planned_windows
from .checkpoint import CheckpointError, CheckpointWriteError, MetaValue, checkpoint_path, find_latest, \
    _names, list_checkpoints, load_checkpoint, load_into, prune, save_checkpoint

STATE_KIND = "training_state"  # metadata "kind" of the files `resume` accepts
# Before ms_accum 0.2 the executor's buffer was named "grad_sum" (the Accumulator's "accumulate"): such files load
# under today's one name.
_OLD_BUFFER_PREFIX, _BUFFER_PREFIX = "grad_sum.", "accumulate."
# Settings a resumed run must share exactly. The layout (accumulate_step, rank_batch_size, world_size, num_batches) may
# change as long as the global batch per update and the samples per epoch stay.
_SAME = ("partial_window", "data_seed")
# What the run was built with (`ms_accum.train.fingerprint`), recorded since 1.3 and compared when the file has it.
_BUILT = {"optimizer": "optimizer", "network": "network (its parameters' names, shapes and dtypes)",
          "data": "data"}


class StateCheckpoints:
    """
    The training-state files of one run, ``{ckpt_dir}/{ckpt_name}-{step:09d}.{file_format}``.

    Each file holds `state` (a `TrainingState`), the `Position` and `run`, the settings a resumed run must share. It
    is written when a window has just closed; its zero buffer is saved too, so loading never leaves a stale one.

    Args:
        state (Union[TrainingState, ShardedState]): What to save and load, strictly; its `contents()` is what a file
            holds.
        ckpt_dir (str): The run's directory.
        ckpt_name (str): The files' prefix.
        run (dict): Settings stored in every file and checked on resume.
        metadata (dict, optional): More values stored in every file, not checked.
        save_every (int, optional): Save every this many optimizer steps; ``None`` saves nothing.
        keep_last (int, optional): Keep only the newest `keep_last` files. Default: ``None``, keep all.
        writes (bool): Whether this process writes (rank 0 in data parallel; every rank reads). Default: ``True``.
        schedule (KPolicy, optional): The run's K, looked ahead at (`KPolicy.peek`) to compare a resumed schedule with
            the saved one; its global batches are in `run`, and where they changed is saved too. Default: ``None``.
        file_format (str): ``"ckpt"`` or ``"safetensors"``, the files written; resuming reads either. Default:
            ``"ckpt"``.
    """

    def __init__(self, state: nn.Cell, ckpt_dir: Optional[str], ckpt_name: str, run: Dict[str, MetaValue],
                 metadata: Optional[Dict[str, MetaValue]] = None, save_every: Optional[int] = None,
                 keep_last: Optional[int] = None, writes: bool = True,
                 schedule: Optional[KPolicy] = None, file_format: str = "ckpt") -> None:
        self.state, self.ckpt_dir, self.ckpt_name, self.run = state, ckpt_dir, ckpt_name, run
        self.schedule, self.file_format = schedule, file_format
        # Where K changed so far, [(samples consumed, global batch)] (all that older files recorded).
        self.history: List[Tuple[int, int]] = []
        # Every window opened so far, as runs of evenly spaced openings [start, global batch, count] (windows at start,
        # start + batch, ...): the saved run's whole schedule, which a resumed run's callable is compared with.
        self.windows: List[List[int]] = []
        self.extra: Callable[[], Dict[str, MetaValue]] = dict  # more of the run's state, saved with every file
        self.resumed: Dict[str, MetaValue] = {}  # the metadata of the file resumed from
        # The run's settings win over the caller's metadata: resuming checks them.
        self.metadata = {**(metadata or {}), **run, "kind": STATE_KIND}
        self.save_every, self.writes, self.keep_last = save_every, writes, keep_last

    def resume(self, resume: Union[bool, str, os.PathLike, None], epochs: int) -> Tuple[Position, Optional[str]]:
        """Loads the file `resume` names (``True``: the newest readable one, if any); returns where it left off.

        The file may come from a run on another number of ranks, with another K and micro-batch size,
        if every update still sees the same global batch and an epoch the same samples: the position, kept in
        global samples, is then converted to this run's batches. The data order is the same when every rank reads
        its shard through MindSpore's `DistributedSampler` (`num_shards`, `shard_id`; a single process with
        ``num_shards=1``): rank r of n reads samples r, r + n, ... of one shuffled order."""
        if resume in (None, False):
            self._check_fresh()
            return Position(), None
        path = find_latest(self.ckpt_dir, self.ckpt_name) if resume is True else os.fspath(resume)
        if path is None:
            return Position(), None
        contents = load_checkpoint(path)
        meta = contents[1]
        if meta.get("kind") != STATE_KIND:
            raise CheckpointError("Checkpoint '{path}' holds no training state to resume from (it was not saved with "
                                  "{@save_every}).", path=path)
        for key in _SAME:
            if meta.get(key) != self.run[key]:
                raise CheckpointError("Checkpoint '{path}' was saved with {saved}, but this run has {this}: resuming "
                                      "would not continue the same training.", path=path,
                                      saved=Setting(key, meta.get(key)), this=Setting(key, self.run[key]))
        for key, what in _BUILT.items():
            if key in meta and meta[key] != self.run[key]:
                raise CheckpointError("Checkpoint '{path}' was saved by a run whose {what} was {saved}, but this "
                                      "run's is {this}: resuming would not continue the same training.", path=path,
                                      what=what, saved=meta[key], this=self.run[key])
        # Files of format 1 lack the per-rank batch size and world size: theirs were this run's, or it is refused.
        saved = {**self.run, **{key: meta[key] for key in ("accumulate_step", "num_batches", "rank_batch_size",
                                                           "world_size", "global_micro_batch") if key in meta}}
        if "mini_steps" in meta:  # files before 1.0 said K as train_process's argument (and the CLI's own K beside)
            saved["accumulate_step"] = meta["mini_steps"]
        if "global_micro_batch" not in meta:  # an older file: its batches were equal on every rank
            saved.pop("global_micro_batch")
        saved["global_batches"] = meta.get("global_batches", f"0:{int(saved['accumulate_step']) * _per_batch(saved)}")
        self.history = _pairs(meta.get("batch_history", ""))
        runs = meta.get("batch_windows", "")  # "0:64:8,512:128:3", as `window_closed` writes `windows`
        self.windows = [[int(v) for v in item.split(":")] for item in runs.split(",")] if runs else []
        position = Position(**{key: int(meta[key]) for key in Position.__dataclass_fields__})
        position.batch = int(meta.get("samples", position.batch * _per_batch(saved))) // _per_batch(self.run)
        # Which comparison applies follows what the two runs recorded (older files included): settings decided from
        # measurements are compared as settings; schedules, known ahead, by their global batches.
        if meta.get("adaptive_k", "") or self.run["adaptive_k"]:
            _check_adaptive(path, str(meta.get("adaptive_k", "")), saved["global_batches"], self.run["adaptive_k"])
        elif _pairs(saved["global_batches"])[1:] or _pairs(self.run["global_batches"])[1:] or \
                "callable" in (saved["global_batches"], self.run["global_batches"]):
            self._check_schedule(path, saved["global_batches"], epochs, position)
        else:
            _check_global_batch(path, saved, self.run)
        _check_epoch_samples(path, saved, self.run)
        if meta["epoch"] > epochs:
            raise CheckpointError("Checkpoint '{path}' is at epoch {value}, beyond this run's {epochs} epochs.",
                                  path=path, value=meta['epoch'], epochs=epochs)
        params = {_BUFFER_PREFIX + name[len(_OLD_BUFFER_PREFIX):] if name.startswith(_OLD_BUFFER_PREFIX) else name:
                  value for name, value in contents[0].items()}
        load_into(self.state, path, strict=True, contents=(params, meta))
        if any(is_random_state(p) and p.name not in params for p in self.state.get_parameters()):
            warnings.warn(f"Checkpoint '{path}' holds no dropout streams (ms_accum 0.3 kept them in the network, "
                          f"under other names): the dropout masks start afresh; everything else continues.",
                          UserWarning, stacklevel=2)
        self.resumed = meta
        return position, path

    def _check_fresh(self) -> None:
        """Refuses a fresh run that would save its states beside another run's: a later resume would continue whichever
        state is newest."""
        found = list_checkpoints(self.ckpt_dir, self.ckpt_name) if self.save_every is not None else []
        if found:
            raise ArgumentValueError("{@directory:subject} must not hold another run's training states, but '{path}' "
                                     "holds {files}: a fresh run would save its own beside them. Continue that run "
                                     "with {resume=}, or give another {@directory} or remove them.", path=self.ckpt_dir,
                                     files=_names(os.path.basename(path) for _, path in found), resume=True)

    def window_opened(self, samples: int, k: int) -> None:
        """Notes the window that opens after `samples` samples consumed with `k` micro-batches (where K changes)."""
        batch = k * _per_batch(self.run)
        if not self.history or self.history[-1][1] != batch:
            self.history.append((samples, batch))
        last = self.windows[-1] if self.windows else None
        if last is not None and last[1] == batch and last[0] + last[2] * batch == samples:
            last[2] += 1
        else:
            self.windows.append([samples, batch, 1])

    def _check_schedule(self, path: str, saved: str, epochs: int, position: Position) -> None:
        """Refuses a resume whose global batch schedule differs from the saved run's, naming where: a callable is
        compared with a saved table at the windows the saved run opened and at every window this run can still open
        from `position` on (K looked at in each, as the run will decide it)."""
        if "callable" not in (saved, self.run["global_batches"]):
            mine, theirs = dict(_pairs(self.run["global_batches"])), dict(_pairs(saved))
            points = sorted(set(mine) | set(theirs))
        else:  # a callable is known where the saved run evaluated it: at every window it opened, compare there
            theirs = dict(self.history)  # older files recorded only where K changed
            theirs.update((start + i * batch, batch) for start, batch, count in self.windows for i in range(count))
            if saved != "callable":  # the saved table gives its batch at every window this run opens too
                table = dict(_pairs(saved))
                ahead = _planned_windows(epochs, int(self.run["num_batches"]), self.schedule, _per_batch(self.run),
                                         position) or ()
                theirs.update((start, _at(table, start)) for _, _, start in ahead)
            points = sorted(theirs)
            mine = {s: self.schedule.peek(s) * _per_batch(self.run) for s in points}
            if saved == "callable" and points:
                saved = (f"callable, evaluated as {pairs_text(_changes(theirs))} in the {len(points)} windows it "
                         f"opened up to {points[-1]} samples")
        for point in points:
            a, b = _at(theirs, point), _at(mine, point)
            if a != b:
                raise CheckpointError("Checkpoint '{path}' was saved by a run whose global batch schedule (samples "
                                      "consumed: global batch) is {saved}, but this run's is {value}: from {point} "
                                      "samples consumed the saved run's global batch is {a}, this run's {b}; resuming "
                                      "would not continue the same training.", path=path, saved=saved,
                                      value=self.run['global_batches'], point=point, a=a, b=b)

    def window_closed(self, position: Position, stopping: bool = False) -> None:
        """Saves the state when `position.step` is due, or the run is `stopping` early (and prunes old files)."""
        due = self.save_every is not None and position.step % self.save_every == 0
        if not (due or stopping and self.ckpt_dir is not None):
            return
        # Every rank takes part (a sharded state gathers its parts); rank 0 alone writes.
        contents = self.state.contents()
        if not self.writes:
            return
        self.save(contents, checkpoint_path(self.ckpt_dir, self.ckpt_name, position.step, self.file_format),
                  {**self.metadata, **asdict(position), "samples": position.batch * _per_batch(self.run),
                   "batch_history": pairs_text(self.history),
                   "batch_windows": ",".join(f"{start}:{batch}:{count}" for start, batch, count in self.windows),
                   **self.extra()})
        if self.keep_last is not None:
            prune(self.ckpt_dir, self.ckpt_name, self.keep_last)

    def save(self, save_obj: nn.Cell, path: str, metadata: Dict[str, MetaValue]) -> str:
        """`save_checkpoint` into the run's directory; a failed save also names the newest complete training state,
        which a resumed run continues from."""
        try:
            return save_checkpoint(save_obj, path, metadata)
        except CheckpointWriteError as err:
            newest = find_latest(self.ckpt_dir, self.ckpt_name)
            # Unnamed: train_process, the only one to save states and what the user ran, names it at its door.
            if newest:
                error = CheckpointWriteError("{unwritten} The newest complete training state is '{newest}': {resume=} "
                                             "continues from it.", unwritten=err, newest=os.path.basename(newest),
                                             resume=True)
            else:
                error = CheckpointWriteError("{unwritten} '{directory}' holds no complete training state of '{name}' "
                                             "yet.", unwritten=err, directory=self.ckpt_dir, name=self.ckpt_name)
            raise error from err.__cause__


def _pairs(text: str) -> List[Tuple[int, int]]:
    """``"0:64,4096:128"`` (`pairs_text`) as [(0, 64), (4096, 128)] (a callable's table, ``"callable"``, has none)."""
    if text in ("", "callable"):
        return []
    return [(int(a), int(b)) for a, b in (item.split(":") for item in text.split(","))]


def _changes(table: Dict[int, int]) -> List[Tuple[int, int]]:
    """The points of a step table where its value changes."""
    points = sorted(table)
    return [(point, table[point]) for i, point in enumerate(points) if i == 0 or table[points[i - 1]] != table[point]]


def _at(table: Dict[int, int], samples: int) -> Optional[int]:
    """The value of a step table at `samples`."""
    starts = [s for s in table if s <= samples]
    return table[max(starts)] if starts else None


def _per_batch(run: Dict[str, MetaValue]) -> int:
    """Global samples in one batch of every rank (older files assumed equal batches on every rank)."""
    return int(run.get("global_micro_batch") or int(run["rank_batch_size"]) * int(run["world_size"]))


class Layout(Term):
    """A training state's window inside a message: K micro-batches of `batch` samples on each of `ranks` ranks."""

    def __init__(self, k: int, batch: int, ranks: int) -> None:
        self.k, self.batch, self.ranks = k, batch, ranks

    def __str__(self) -> str:
        return f"accumulate_step={self.k} x batch_size={self.batch} x {self.ranks} rank(s)"


def _check_global_batch(path: str, saved: Dict[str, MetaValue], run: Dict[str, MetaValue]) -> None:
    """Refuses a resume whose fixed global batch per update differs from the saved run's."""
    def layout(run):
        return Layout(int(run["accumulate_step"]), int(run["rank_batch_size"]), int(run["world_size"]))

    saved_batch = int(saved["accumulate_step"]) * _per_batch(saved)
    batch = int(run["accumulate_step"]) * _per_batch(run)
    if saved_batch != batch:
        if saved_batch % _per_batch(run) == 0:
            keeps = Message("{mini_steps=} keeps it", mini_steps=saved_batch // _per_batch(run))
        else:
            keeps = Message("no {@mini_steps} keeps it with {batch_size=} on {ranks} rank(s), as {saved} is not a "
                            "multiple of {per_batch}", batch_size=int(run["rank_batch_size"]),
                            ranks=run["world_size"], saved=saved_batch, per_batch=_per_batch(run))
        raise CheckpointError("Checkpoint '{path}' was saved with a global batch of {saved_batch} samples per update "
                              "({saved}), but this run has {batch} ({this}): resuming would not continue the same "
                              "training; {keeps}.", path=path, saved_batch=saved_batch, saved=layout(saved),
                              batch=batch, this=layout(run), keeps=keeps)


def _check_adaptive(path: str, saved: str, saved_batches: str, this: str) -> None:
    """Refuses a resume unless both runs chose K by the same `AdaptiveK` settings over the same global micro-batch
    (`AdaptiveK.settings`, JSON): the saved decisions and estimates mean nothing to other settings, and a fixed K or
    schedule would not continue them."""
    saved_settings, settings = (json.loads(text) if text else None for text in (saved, this))
    if saved_settings != settings:
        theirs = AdaptiveSettings(saved_settings) if saved else Message(
            "the global batch schedule (samples consumed: global batch) {batches}", batches=saved_batches)
        mine = AdaptiveSettings(settings) if this else "a fixed K or schedule"
        raise CheckpointError("Checkpoint '{path}' was saved by a run whose K came from {theirs}, but this run's comes "
                              "from {mine}: resuming would not continue the same training.", path=path,
                              theirs=theirs, mine=mine)


def _check_epoch_samples(path: str, saved: Dict[str, MetaValue], run: Dict[str, MetaValue]) -> None:
    """Refuses a resume whose samples per epoch differ from the saved run's."""
    saved_epoch, epoch = int(saved["num_batches"]) * _per_batch(saved), int(run["num_batches"]) * _per_batch(run)
    if saved_epoch != epoch:
        raise CheckpointError("Checkpoint '{path}' was saved by a run reading {saved_epoch} samples an epoch "
                              "({saved_batches} batches of {saved_batch} over all ranks), but this run reads {epoch} "
                              "({batches} batches of {batch}): resuming would not continue the same training.",
                              path=path, saved_epoch=saved_epoch, saved_batches=saved['num_batches'],
                              saved_batch=_per_batch(saved), epoch=epoch, batches=run['num_batches'],
                              batch=_per_batch(run))

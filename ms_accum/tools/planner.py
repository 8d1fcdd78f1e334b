"""Plan the micro-batch, K and structure for a global batch within a memory budget, from measured memory.

`plan` never trains in the caller's process: every measurement is a trial in a fresh Python process (``python -m
ms_accum.tools.planner``), which builds the model from its factory, trains a few windows with the executor over a
dataset of the factory's samples, and reports its peak memory and its time per window. A trial that runs out of memory
is killed alone, and nothing it allocated stays in the caller's process.

Memory is everything training holds (docs/verify-and-plan.md#what-a-budget-counts): the network, the optimizer's state,
the buffer, the activations and a training-state save. On CPU the growth of the process's peak resident memory (VmHWM)
from right after MindSpore's import; on GPU and Ascend the device's peak allocation
(`mindspore.runtime.max_memory_allocated`), which MindSpore does not report on CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .._choices import AUTO_STRUCTURE, DEMO_FACTORIES, DEVICES, TIMED_STRUCTURES
from ..train.plan import Plan, Trial, network_fingerprint
from .._validation import (Argument, ArgumentValueError, ChildError, Message, MessageError, StateError, as_data,
                           causes, check_isinstance, check_positive_int, check_value_in, describe_exception, door,
                           from_data, wrong_type)

MIB = 2 ** 20
WINDOWS = 4  # per trial: the first compiles, the others are timed; then a partial window of one micro-batch
# A candidate predicted above this multiple of the budget is not measured to confirm it: its trial could take the
# machine's memory for nothing.
CONFIRM_UP_TO = 1.5
# Fresh processes of one configuration do not peak alike (the runtime runs independent kernels on a thread pool), so
# a trial's peak is not a user's: a plan keeps this share of the budget free, so training with it stays within
# (measured in docs/mindspore.md#no-peak-memory-on-cpu).
HEADROOM = 0.10
_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kib": 2 ** 10, "kb": 10 ** 3, "m": MIB, "mib": MIB, "mb": 10 ** 6,
          "g": 2 ** 30, "gib": 2 ** 30, "gb": 10 ** 9, "t": 2 ** 40, "tib": 2 ** 40, "tb": 10 ** 12}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*")


@door("plan")
def parse_size(value: Union[str, int, float], arg_name: str = "memory") -> int:
    """
    Bytes of a memory size: a number of bytes, or a string such as ``"800MiB"``, ``"2GiB"``, ``"1.5GB"``, ``"512M"``.

    Args:
        value (Union[str, int, float]): The size.
        arg_name (str): The argument's name in messages (``"--memory"`` on a command line). Default: ``"memory"``.

    Returns:
        int, the bytes.

    Raises:
        ValueError: If `value` is not a positive size.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.fullmatch(value) if isinstance(value, str) else None
        if match is None or match.group(2).lower() not in _UNITS:
            raise ArgumentValueError("{arg_name:subject} must be a memory size such as '800MiB', '2GiB' or a "
                                     "number of bytes, but got {value!r}.", arg_name=Argument(arg_name), value=value)
        size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(size) or size < 1:
        raise ArgumentValueError("{arg_name:subject} must be a positive memory size, but got {value!r}.",
                                 arg_name=Argument(arg_name), value=value)
    return int(size)


@door("plan")
def plan(model: Union[str, Callable], global_batch: int, memory: Union[str, int, None] = None, *, ranks: int = 1,
         structures: Sequence[str] = TIMED_STRUCTURES, device: str = "CPU", timeout: float = 1800.0,
         log: Optional[Callable[[str], None]] = None, output: Optional[str] = None) -> Plan:
    """
    Chooses the micro-batch B, K and the structure that train `model` at `global_batch` within `memory`.

    B comes first: the largest divisor of the per-rank global batch whose peak memory, measured in fresh processes
    and fitted by a line (`_search`), stays within the budget less `HEADROOM`. Then, with a budget, every structure
    is timed on windows of that B and the fastest within the budget is chosen; with no budget, the structure is the
    memory-first one, as ``"auto"`` chooses (docs/verify-and-plan.md).

    Args:
        model (Union[str, Callable]): A factory, ``package.module:function`` (or the function itself, defined at a
            module's top level), returning ``(network, loss_fn, optimizer, sample[, dataset])``
            (`ms_accum.tools.factory`), or ``"lenet5"`` / ``"mlp"``. The trials import it in fresh processes, from the
            current directory.
        global_batch (int): Samples per optimizer step, over all ranks.
        memory (Union[str, int], optional): The budget per rank: ``"800MiB"``, ``"2GiB"`` or bytes. Default: ``None``,
            the device's free memory (CPU: MemAvailable).
        ranks (int): Data-parallel ranks sharing `global_batch`. Default: ``1``.
        structures (Sequence[str]): The structures to choose from. Default: all three.
        device (str): ``"CPU"``, ``"GPU"`` or ``"Ascend"``. Default: ``"CPU"``.
        timeout (float): Seconds a trial may take. Default: ``1800``.
        log (Callable[[str], None], optional): Called with a line before each trial.
        output (str, optional): A file to write the plan to (`Plan.save`), checked before any trial. Default: ``None``.

    Returns:
        Plan, with every trial and the fingerprint of the factory's network (`Plan.network`).

    Raises:
        TypeError: If `global_batch` or `ranks` is not an int.
        ValueError: Before any trial: if `output` cannot be written, `memory` is not a size, `global_batch` is not
            positive or does not divide by `ranks`, a structure is unknown, or the factory cannot be imported,
            returns the wrong things, or its network and loss do not take its samples. After the first trial: if
            even a micro-batch of one sample does not fit `memory` (the message gives the smallest budget that works).

    Examples:
        >>> from ms_accum import plan
        >>> # p = plan("mypackage.models:build", global_batch=256, memory="2GiB")
        >>> # executor = GradientAccumulation.from_plan(p, network, loss_fn, optimizer)
    """
    spec = _factory_spec(model)
    budget = _checked_budget(global_batch, memory, ranks, structures, device, output)
    runner = _Trials(spec, device, timeout, log)
    facts = runner.check()
    limit = budget if budget is not None else facts["free_mib"]
    baseline, line = _largest_batch(runner, global_batch // ranks, limit, structures, memory is not None)
    chosen = baseline
    if budget is not None and baseline.accumulate_step > 1:  # K = 1: one step, every structure alike
        chosen = _fastest(runner, baseline, structures, limit * (1 - HEADROOM))
    result = Plan(model=spec, global_batch=global_batch, ranks=ranks, batch_size=chosen.batch_size,
                  accumulate_step=chosen.accumulate_step, structure=chosen.structure, reduction=runner.reduction,
                  # The fitted line at B, moved by what the chosen structure measured over the memory-first one.
                  predicted_peak_mib=round(line(chosen.batch_size) + chosen.peak_mib - baseline.peak_mib, 1),
                  memory_mib=None if budget is None else round(budget, 1), budget_mib=round(limit, 1),
                  intercept_mib=round(line(0), 1), slope_mib=round(line(1) - line(0), 3), device=device,
                  trials=runner.trials, network=facts.get("network"))
    if output is not None:
        result.save(output)
    return result


def _checked_budget(global_batch: int, memory: Union[str, int, None], ranks: int, structures: Sequence[str],
                    device: str, output: Optional[str]) -> Optional[float]:
    """`plan`'s arguments checked before any trial; the budget in MiB, None without one."""
    if output is not None:
        check_output_path(output)
    check_positive_int(global_batch, "global_batch")
    check_positive_int(ranks, "ranks")
    if global_batch % ranks:
        raise ArgumentValueError("{@global_batch:subject} must be divisible by {@ranks} ({ranks}), but got "
                                 "{global_batch}.", ranks=ranks, global_batch=global_batch)
    budget = None if memory is None else parse_size(memory, "memory") / MIB
    check_isinstance(structures, "structures", (list, tuple))
    if not structures:
        raise ArgumentValueError("{@structures:subject} must name at least one structure, but got {structures!r}.",
                                 structures=structures)
    for structure in structures:
        check_value_in(structure, "structures", TIMED_STRUCTURES)
    check_value_in(device, "device", DEVICES)
    return budget


def _largest_batch(runner: "_Trials", per_rank: int, limit: float, structures: Sequence[str],
                   given: bool) -> Tuple[Trial, Callable[[float], float]]:
    """The trial of the memory-first structure at the largest B that fits `limit` MiB (`_search`), and the line fitted
    through its peaks; `given`: whether `limit` is the user's budget or the device's free memory."""
    memory_first = AUTO_STRUCTURE if AUTO_STRUCTURE in structures else structures[0]
    sizes = [b for b in range(1, per_rank + 1) if per_rank % b == 0]
    try:
        batch_size, line = _search(sizes, limit, lambda b: runner.run(b, per_rank // b, memory_first), given=given,
                                   headroom=HEADROOM)
    except ArgumentValueError as err:  # the first trial failed: raised from what its process raised, if anything
        err.__cause__ = err.__cause__ or runner.raised
        raise
    return next(t for t in runner.trials if t.batch_size == batch_size and t.structure == memory_first), line


def _fastest(runner: "_Trials", baseline: Trial, structures: Sequence[str], usable: float) -> Trial:
    """The fastest of `structures` on windows of `baseline`'s B and K, among those that peak within `usable` MiB;
    `baseline`, the memory-first structure's trial, when none does."""
    for structure in structures:
        if structure != baseline.structure:
            runner.run(baseline.batch_size, baseline.accumulate_step, structure)
    timed = [t for t in runner.trials if t.batch_size == baseline.batch_size and t.fits(usable) and t.ms_per_window]
    return min(timed, key=lambda t: t.ms_per_window, default=baseline)


@door("plan")
def check_output_path(path: Union[str, "os.PathLike"], arg_name: str = "output") -> str:
    """
    `path` if a plan can be written there (`plan`'s `output`, ``ms-accum plan --output``): called before any trial,
    so that hours of trials are not lost to a path found unwritable at the end. An existing file is left as it is;
    none is created.

    Args:
        path (Union[str, os.PathLike]): The file.
        arg_name (str): The argument's name in messages. Default: ``"output"``.

    Returns:
        str, `path`.

    Raises:
        TypeError: If `path` is not a path.
        ValueError: If `path` is a directory, or its directory does not exist or cannot be written.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise wrong_type(path, arg_name, "a file path")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ArgumentValueError("{arg_name:subject} must be a file path that can be written, but got "
                                 "'{path}', a directory.", arg_name=Argument(arg_name), path=path)
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as err:
        raise ArgumentValueError("{arg_name:subject} must be a file path that can be written, but got '{path}': "
                                 "{strerror}.", arg_name=Argument(arg_name), path=path, strerror=err.strerror) from None
    if not existed:
        os.remove(path)
    return path


@door("measure")
def measure(model: Union[str, Callable], batch_size: int, accumulate_step: int, structure: str = "three_graphs", *,
            device: str = "CPU", timeout: float = 1800.0) -> Trial:
    """
    One trial as `plan` makes them: `WINDOWS` windows of `accumulate_step` micro-batches of `batch_size`, then a
    partial window of one, trained by the executor with `structure` over a dataset of the factory's samples, in a fresh
    process: the peak is the structure's in an epoch that K does not divide (docs/structures.md: a partial window), the
    time per window that of the whole windows.

    Args:
        model (Union[str, Callable]): The factory, as `plan` takes it.
        batch_size (int): The micro-batch B.
        accumulate_step (int): K.
        structure (str): The executor's structure. Default: ``"three_graphs"``.
        device (str): ``"CPU"``, ``"GPU"`` or ``"Ascend"``. Default: ``"CPU"``.
        timeout (float): Seconds the trial may take. Default: ``1800``.

    Returns:
        Trial, its peak memory and time per window (or the error that stopped it).

    Raises:
        ValueError: As `plan`, for a factory that cannot be used.
    """
    spec = _factory_spec(model)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(accumulate_step, "accumulate_step")
    check_value_in(structure, "structure", TIMED_STRUCTURES)
    check_value_in(device, "device", DEVICES)
    runner = _Trials(spec, device, timeout, None)
    runner.check()
    return runner.run(batch_size, accumulate_step, structure)


def _search(sizes: List[int], budget: float, measure: Callable[[int], Trial], given: bool = True,
            headroom: float = 0.0):
    """The largest of `sizes` measured within the budget less its `headroom` share whose next larger size is measured
    (or predicted far) above it, and the line fitted through every measurement.

    A line is fitted through the peaks: peak ≈ intercept + slope * B, the activations growing with B (a one-sample step,
    often off the line, is left out once two larger sizes are measured). The smallest B is measured first, then the
    middle one, then the fit's guess of the largest that fits; the search ends when the chosen B was measured within the
    budget and the next larger size was measured above it (or is predicted above `CONFIRM_UP_TO` times it). `given`:
    whether `budget` is the user's or the device's free memory, as the message says it."""
    limit = budget * (1 - headroom)
    peaks: Dict[int, Optional[float]] = {}

    def run(b: int) -> Trial:
        trial = measure(b)
        peaks[b] = trial.peak_mib
        return trial

    first = run(sizes[0])
    if first.peak_mib is None:
        raise ArgumentValueError("a micro-batch of {size} sample(s) could not be trained: {error}.", size=sizes[0],
                                 error=first.error.rstrip('.'))
    if first.peak_mib > limit:
        what = Message("{@memory:subject}") if given else "the device's free memory"
        raise ArgumentValueError(
            "{what} ({budget:.0f} MiB) is below the step of one micro-batch of {size} sample(s), which peaked at "
            "{peak_mib:.0f} MiB: the smallest budget that works is {smallest} MiB (with {headroom:.0%} kept free).",
            what=what, budget=budget, size=sizes[0], peak_mib=first.peak_mib,
            smallest=math.ceil(first.peak_mib / (1 - headroom)), headroom=headroom)
    if len(sizes) > 1:
        run(sizes[len(sizes) // 2])  # the middle divisor: a line through the two ends of the range, not two neighbours
    while True:
        measured = {b: p for b, p in peaks.items() if p is not None}
        if len(measured) > 2:  # a step of one sample is often off the line (other kernels, fixed costs dominate)
            del measured[sizes[0]]
        line = _fit(measured)
        best = max(b for b, p in peaks.items() if p is not None and p <= limit)
        failed = min((b for b, p in peaks.items() if p is None or p > limit), default=math.inf)
        above = [b for b in sizes if best < b < failed]
        if not above:
            return best, line
        guesses = [b for b in above if line(b) <= limit]
        guess = guesses[-1] if guesses else above[0]
        if guess == above[0] and guess not in guesses and line(guess) > CONFIRM_UP_TO * limit:
            return best, line  # the next size is far above the budget: not worth a trial
        run(guess)


def _fit(peaks: Dict[int, float]) -> Callable[[float], float]:
    """Least squares line through (B, peak); flat through a single point."""
    xs, ys = list(peaks), list(peaks.values())
    if len(xs) < 2:
        return lambda b: ys[0]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs))
    return lambda b: mean_y + slope * (b - mean_x)


def _factory_spec(model: Union[str, Callable]) -> str:
    """`model` as a spec a fresh process can import."""
    from .factory import SEPARATOR
    if callable(model) and not isinstance(model, str):
        module = getattr(model, "__module__", None)
        qualname = getattr(model, "__qualname__", "")
        if module is None or not qualname.isidentifier():
            raise ArgumentValueError("{@model:subject} must be a function defined at a module's top level (fresh "
                                     "processes import it), but got {model!r}.", model=model)
        if module == "__main__":  # a script: its file's name is the module a fresh process imports
            path = getattr(sys.modules["__main__"], "__file__", None)
            if path is None:
                raise ArgumentValueError("{@model:subject} is defined in an interactive session; fresh processes "
                                         "cannot import it. Give 'package.module:function' instead.")
            directory, module = os.path.split(os.path.splitext(os.path.abspath(path))[0])
            if directory not in sys.path:
                sys.path.insert(0, directory)
        return f"{module}{SEPARATOR}{qualname}"
    check_isinstance(model, "model", str)
    if model not in DEMO_FACTORIES and SEPARATOR not in model:
        raise ArgumentValueError("{@model:subject} must be 'package.module:function' (a factory) or one of {models}, "
                                 "but got '{model}'.", models=sorted(DEMO_FACTORIES), model=model)
    return model


class _Trials:
    """Runs trials of one model in fresh processes and keeps them."""

    def __init__(self, spec: str, device: str, timeout: float, log: Optional[Callable[[str], None]]) -> None:
        self.spec, self.device, self.timeout, self.log = spec, device, timeout, log
        self.trials: List[Trial] = []
        self.reduction: Optional[str] = None  # the loss's, found by `check`
        self.raised: Optional[ChildError] = None  # what the last trial that failed raised in its process, if it did
        # The fresh process finds the factory's module where this process would: the current directory and sys.path.
        paths = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}

    def check(self) -> dict:
        """Imports the factory and runs its network and loss on two samples, in a fresh process; returns the
        reduction its loss needs (kept for `run`), the device's free memory and the network's fingerprint."""
        out = self._child(["check", self.spec, self.device])
        if "message" in out:  # the check's own error, whole: a command line says it in its flags
            raise from_data(out["message"]) from self.raised
        if "error" in out:
            raise ArgumentValueError("{@model:subject} could not be checked in a fresh process: {error}.",
                                     error=out["error"].rstrip(".")) from self.raised
        self.reduction = out["reduction"]
        return out

    def run(self, batch_size: int, accumulate_step: int, structure: str, reduction: Optional[str] = None) -> Trial:
        """One trial (`measure`), kept; `reduction`: the loss's, by default the one `check` found."""
        if self.log:
            self.log(f"trial: B={batch_size} K={accumulate_step} {structure}")
        out = self._child(["trial", self.spec, self.device, str(batch_size), str(accumulate_step), structure,
                           reduction or self.reduction])
        trial = Trial(batch_size=batch_size, accumulate_step=accumulate_step, structure=structure,
                      peak_mib=out.get("peak_mib"), ms_per_window=out.get("ms_per_window"), error=out.get("error"))
        self.trials.append(trial)
        return trial

    def _child(self, args: List[str]) -> dict:
        # The trial dies with the planner: killed with it (the trial asks the kernel, `_die_with_parent`), or killed
        # here when the planner is interrupted (KeyboardInterrupt, SystemExit) or fails. Its own session keeps Ctrl-C
        # from the terminal to the planner, which then ends the trial and whatever it started.
        process = subprocess.Popen([sys.executable, "-m", "ms_accum.tools.planner", *args],
                                   env={**self.env, _PARENT: str(os.getpid())}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"took more than {self.timeout:.0f} s"}
        finally:
            if process.poll() is None:  # the trial and whatever it started: its own session's process group
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    process.kill()
                process.wait()
        for line in reversed(stdout.splitlines()):
            if line.startswith("{"):
                out, cause = json.loads(line), None
                for said, frames in reversed(out.get("raised", ())):  # (`_raised`: outermost first) each from the next
                    error = ChildError(said, [traceback.FrameSummary(*frame) for frame in frames])
                    error.__cause__, cause = cause, error
                self.raised = cause or self.raised
                return out
        # Killed (the kernel's out-of-memory killer sends SIGKILL) or crashed before it could answer.
        tail = stderr.strip().splitlines()[-1:] or [""]
        reason = (f"killed by signal {-process.returncode}" if process.returncode < 0
                  else f"exit {process.returncode}: {tail[0][:200]}")
        return {"error": reason}


_PARENT = "MS_ACCUM_PLANNER_PID"  # the planner's pid, in a trial's environment


def _raised(err: BaseException) -> List[list]:
    """`err` and the exceptions it was raised from or while handling, outermost first, as JSON: each its line and its
    traceback's frames (file, line, function)."""
    return [[describe_exception(cause), [[frame.filename, frame.lineno, frame.name]
                                         for frame in traceback.extract_tb(cause.__traceback__)]]
            for cause in causes(err)[:16]]


def _die_with_parent() -> None:
    """In a trial: asks the kernel to kill this process when the planner that started it ends, however it ends
    (SIGKILL included; PR_SET_PDEATHSIG, Linux), and exits at once if the planner has already gone."""
    parent = os.environ.get(_PARENT)
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # the planner died before the request took effect
        os._exit(1)


# ------------------------------------------------------------------------------------------------ in the fresh process
def process_status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now; VmHWM: the peak so far), as the memory benchmark
    reads them."""
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise StateError("/proc/self/status must have a line {key}, but it has none (the memory figures read Linux's).",
                     key=key)


class PeakMemory:
    """The peak of everything a process holds from now on (docs/verify-and-plan.md#what-a-budget-counts), as a trial
    counts it: on CPU the growth of the process's peak resident memory (VmHWM) over its resident memory now; on GPU and
    Ascend the device's peak allocation from now (`mindspore.runtime.max_memory_allocated`). Start it right after
    MindSpore's import and before the network is built."""

    def __init__(self) -> None:
        import mindspore as ms
        self.on_cpu = ms.get_context("device_target") == "CPU"
        if self.on_cpu:
            self.start = process_status("VmRSS")
        else:
            ms.runtime.reset_peak_memory_stats()

    def mib(self) -> float:
        """The peak so far, in MiB."""
        import mindspore as ms
        peak = process_status("VmHWM") - self.start if self.on_cpu else ms.runtime.max_memory_allocated()
        return round(peak / MIB, 1)


def _child_check(spec: str, device: str) -> dict:
    import mindspore as ms
    from .factory import load_model
    from ..core.losses import window_reduction
    user = load_model(spec)  # checks sample(2) and runs it through the network and loss
    if device == "CPU":
        with open("/proc/meminfo", encoding="utf-8") as handle:
            free = next(int(line.split()[1]) / 1024 for line in handle if line.startswith("MemAvailable:"))
    else:
        free = ms.hal.get_device_properties(0).total_memory / MIB
    return {"reduction": "weighted_mean" if user.returns_weight else window_reduction(user.loss_fn, None),
            "free_mib": free, "network": network_fingerprint(user.network)}


def _child_trial(spec: str, batch_size: int, accumulate_step: int, structure: str, reduction: str) -> dict:
    import mindspore.dataset as ds
    from ..train.executor import GradientAccumulation
    from ..train.options import Checkpoints, LogOptions, WindowOptions
    from .factory import load_model
    memory = PeakMemory()  # before the factory builds the network and the optimizer's state: they count
    user = load_model(spec)
    columns = user.batch(batch_size * (accumulate_step * WINDOWS + 1))
    dataset = ds.NumpySlicesDataset(columns, [f"column_{i}" for i in range(len(columns))], shuffle=False)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    closed = []
    executor = GradientAccumulation(user.network, user.loss_fn, user.optimizer, structure=structure,
                                    window=WindowOptions(reduction=reduction))
    with tempfile.TemporaryDirectory() as directory:  # one training-state save, as a run that can resume makes
        executor.train_process(1, dataset, accumulate_step,
                               checkpoints=Checkpoints(directory=directory, name="trial", save_every=WINDOWS),
                               log=LogOptions(verbose=False, on_step=lambda _: closed.append(time.perf_counter())))
    return {"peak_mib": memory.mib(),
            "ms_per_window": round(statistics.median(b - a for a, b in zip(closed, closed[1:WINDOWS])) * 1e3, 2)}


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m ms_accum.tools.planner check SPEC DEVICE`` or ``... trial SPEC DEVICE B K STRUCTURE REDUCTION``:
    prints one JSON line (an ``error`` key when the model failed)."""
    parser = argparse.ArgumentParser(description="One trial of ms_accum.plan, in this fresh process.")
    parser.add_argument("command", choices=("check", "trial"))
    parser.add_argument("spec")
    parser.add_argument("device", choices=DEVICES)
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args(argv)
    _die_with_parent()
    os.environ.setdefault("GLOG_v", "3")
    from ..runtime import set_device
    set_device(args.device)
    try:
        with door("plan"):  # a trial's errors reach the user through `plan`, in its name
            if args.command == "check":
                out = _child_check(args.spec, args.device)
            else:
                batch_size, accumulate_step, structure, reduction = args.rest
                out = _child_trial(args.spec, int(batch_size), int(accumulate_step), structure, reduction)
    except (ValueError, TypeError, RuntimeError, MemoryError) as err:
        text = (err.render() if isinstance(err, Message) else str(err)).strip()  # unnamed: `plan` names it
        out = {"error": text.splitlines()[0] if text else type(err).__name__, "raised": _raised(err)}
        if isinstance(err, MessageError):  # as data too (`_Trials.check` raises it), if its values are data
            with contextlib.suppress(TypeError):
                out["message"] = as_data(err)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

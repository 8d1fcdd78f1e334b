"""A plan: the micro-batch B, K and the structure that `ms_accum.tools.planner.plan` chose, with what it measured.

It lives with training because the executor takes it (`GradientAccumulation.from_plan`, ``ms-accum train --plan``);
making one is the planner's job.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional

from .._choices import DEMO_FACTORIES, DEVICES, REDUCTIONS, STRUCTURES
from .._validation import ArgumentValueError, Aside, describe_exception, door
from ..deprecation import removed_from


def network_fingerprint(network: Any) -> dict:
    """
    What a plan records of the network it was made for (`Plan.network`): the number of trainable parameters, the
    number of values they hold, and a short hash of their sorted ``(name, shape, dtype)``.

    Args:
        network (nn.Cell): The network, as its factory built it.

    Returns:
        dict, ``{"parameters": int, "values": int, "hash": str}``.
    """
    params = network.trainable_params()
    described = sorted((p.name, [int(d) for d in p.shape], str(p.dtype)) for p in params)
    digest = hashlib.sha256(json.dumps(described).encode("utf-8")).hexdigest()[:16]
    return {"parameters": len(params), "values": int(sum(math.prod(shape) for _, shape, _ in described)),
            "hash": digest}


def _built_fingerprint(model: str, unrecorded: str) -> dict:
    """The fingerprint of the network that `model`'s factory builds now, imported as `ms_accum.tools.factory` imports
    it (the current directory first); a factory that cannot be built is refused, as nothing can then be compared."""
    module_name, _, function_name = DEMO_FACTORIES.get(model, model).partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return network_fingerprint(getattr(importlib.import_module(module_name), function_name)()[0])
    except Exception as err:  # noqa: BLE001  (whatever the factory raises, the plan cannot be checked)
        raise ArgumentValueError("{unrecorded}, and its model '{model}' cannot be built to compare it with the "
                                 "network given ({cause}): plan again for this network.", unrecorded=unrecorded,
                                 model=model, cause=describe_exception(err)) from err


def _describe(fingerprint: dict) -> str:
    return (f"{fingerprint['parameters']} trainable parameters of {fingerprint['values']} values (hash "
            f"{fingerprint['hash']})")


@removed_from("ms_accum.train.Trial")  # accumulate_steps, as a keyword and an attribute
@dataclass
class Trial:
    """One fresh-process measurement: micro-batch `batch_size`, windows of `accumulate_step`, one `structure`.

    `peak_mib` is None when the trial failed (`error` says why: killed for memory, or what it raised)."""

    batch_size: int
    accumulate_step: int
    structure: str
    peak_mib: Optional[float]
    ms_per_window: Optional[float] = None
    error: Optional[str] = None

    def fits(self, budget_mib: float) -> bool:
        return self.peak_mib is not None and self.peak_mib <= budget_mib


@removed_from("ms_accum.train.Plan")  # accumulate_steps, as a keyword and an attribute
@dataclass
class Plan:
    """
    What `plan` chose and everything it measured.

    Attributes:
        model (str): The factory (``package.module:function``) or built-in model planned.
        global_batch (int): Samples per optimizer step, over all ranks.
        ranks (int): Data-parallel ranks; each trains micro-batches of `batch_size`.
        batch_size (int): The micro-batch per rank, B, a divisor of ``global_batch // ranks``.
        accumulate_step (int): K, so that ``K * batch_size * ranks == global_batch``.
        structure (str): The executor's structure (``GradientAccumulation(structure=...)``).
        reduction (str): How the loss is reduced (``"weighted_mean"`` when it returns ``(loss, weight)``).
        predicted_peak_mib (float): The peak the fitted line predicts for `batch_size` with `structure`.
        memory_mib (float, optional): The budget; None when none was given and the device's free memory was used.
        budget_mib (float): The budget planned within: `memory_mib`, or the device's free memory.
        intercept_mib (float), slope_mib (float): The fitted line, peak ≈ intercept + slope * B (memory-first
            structure).
        device (str): Where the trials ran.
        trials (list[Trial]): Every measurement, in the order made.
        network (dict, optional): The network planned for (`network_fingerprint`), which `check_fits` compares;
            None in a plan written before ms_accum recorded it (then `check_fits` builds the plan's model to compare).
        path (str): The file the plan was loaded from (`load`), else None; not a field, not saved.
    """

    model: str
    global_batch: int
    ranks: int
    batch_size: int
    accumulate_step: int
    structure: str
    reduction: str
    predicted_peak_mib: float
    memory_mib: Optional[float]
    budget_mib: float
    intercept_mib: float
    slope_mib: float
    device: str
    trials: List[Trial] = field(default_factory=list)
    network: Optional[dict] = None

    path = None  # the file `load` read; a class attribute, not a field: neither saved nor compared

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    @door("Plan.from_dict")
    def from_dict(cls, values: dict, path: Optional[str] = None) -> "Plan":
        """The plan `to_dict` returned, each field checked (`path`, the file it came from, is named in errors).

        Raises:
            ValueError: If a field is missing or has the wrong type or value.
        """
        where = f"the field '{{}}' of the plan '{path}'" if path else "the field '{}' of the plan"
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(values, dict):
            raise ArgumentValueError("the plan{path} must be a JSON object of {names}, but got {name}.",
                                     path=f' {path!r}' if path else '', names=sorted(names), name=type(values).__name__)
        values = _renamed(values)
        missing = names - set(values) - _OPTIONAL
        if missing:
            raise ArgumentValueError("a plan must hold {required}, but {missing} are missing.",
                                     required=sorted(names - _OPTIONAL), missing=sorted(missing))

        def bad(name: str, expected: str, value: Any = None) -> ValueError:
            value = values[name] if value is None else value
            return ArgumentValueError("{field} must be {expected}, but got {value!r}.", field=where.format(name),
                                      expected=expected, value=value)

        if not isinstance(values["model"], str) or not values["model"]:
            raise bad("model", "a factory 'package.module:function' or a model's name")
        for name in ("global_batch", "ranks", "batch_size", "accumulate_step"):
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, "a positive int")
        for name, options in (("structure", STRUCTURES), ("reduction", REDUCTIONS), ("device", DEVICES)):
            if values[name] not in options or not isinstance(values[name], str):
                raise bad(name, f"one of {list(options)}")
        for name in ("predicted_peak_mib", "budget_mib", "intercept_mib", "slope_mib", "memory_mib"):
            value = values[name]
            if name == "memory_mib" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(name, "a number of MiB" + (" or null" if name == "memory_mib" else ""))
        product = values["accumulate_step"] * values["batch_size"] * values["ranks"]
        if product != values["global_batch"]:
            raise bad("global_batch", f"accumulate_step x batch_size x ranks ({values['accumulate_step']} x "
                                      f"{values['batch_size']} x {values['ranks']} = {product})")
        network = values.get("network")
        if network is not None and not (
                isinstance(network, dict) and set(network) == {"parameters", "values", "hash"}
                and all(isinstance(network[k], int) and not isinstance(network[k], bool) and network[k] >= 0
                        for k in ("parameters", "values")) and isinstance(network["hash"], str)):
            raise bad("network", "null or {'parameters': int, 'values': int, 'hash': str} (network_fingerprint)")
        trial_names = [f.name for f in dataclasses.fields(Trial)]
        trials = values["trials"]
        if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
            raise bad("trials", f"a list of trials, each an object of {trial_names}")
        try:
            trials = [Trial(**_renamed(trial)) for trial in trials]
        except TypeError as err:
            raise bad("trials", f"a list of trials, each an object of {trial_names}") from err
        plan = cls(**{**{k: values[k] for k in names if k in values}, "trials": trials})
        plan.path = path
        return plan

    @door("Plan.check_fits")
    def check_fits(self, network: Any = None, ranks: Optional[int] = None) -> "Plan":
        """
        Refuses to train with a plan made for another number of ranks or another network.

        Args:
            network (nn.Cell, optional): The network to train, as its factory built it; compared with the plan's
                `network` fingerprint (`network_fingerprint`), or, in a plan written before plans recorded one, with
                the network that the plan's model (its factory, or a built-in model) builds now. Default: ``None``,
                not checked.
            ranks (int, optional): The ranks of this run. Default: ``None``, not checked.

        Returns:
            Plan, this plan.

        Raises:
            ValueError: If `ranks` or `network` differ from what the plan was made for, or the plan records no
                network and its model cannot be built to compare (the message names the plan, what differs, and that
                it must be planned again).
        """
        name = f"'{self.path}'" if self.path else f"for '{self.model}'"
        if ranks is not None and ranks != self.ranks:
            raise ArgumentValueError(
                "the plan {name} was made for {planned} rank(s) (a global batch of {global_batch} = K "
                "{accumulate_step} x B {batch_size} x {planned} rank(s)), but this run has {ranks}: plan again for "
                "{ranks} rank(s).", name=name, planned=self.ranks, global_batch=self.global_batch,
                accumulate_step=self.accumulate_step, batch_size=self.batch_size, ranks=ranks)
        if network is None:
            return self
        actual = network_fingerprint(network)
        if self.network is not None and actual != self.network:
            raise ArgumentValueError(
                "the plan {name} was made for another network, {planned}, but the network given has {actual}: plan "
                "again for this network.", name=name, planned=_describe(self.network), actual=_describe(actual))
        if self.network is None:  # a plan of before fingerprints: its model, built now, is what it was made for
            unrecorded = f"the plan {name} records no network (it was written before plans recorded one)"
            planned = _built_fingerprint(self.model, unrecorded)
            if actual != planned:
                raise ArgumentValueError(
                    "{unrecorded}, and its model '{model}', built now, has {planned}, but the network given has "
                    "{actual}: plan again for this network.", unrecorded=unrecorded, model=self.model,
                    planned=_describe(planned), actual=_describe(actual))
        return self

    def save(self, path: str) -> str:
        """Writes the plan as JSON (what ``ms-accum plan --output`` writes and ``ms-accum train --plan`` reads)."""
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, indent=1)
        return path

    @classmethod
    @door("Plan.load")
    def load(cls, path: str) -> "Plan":
        """Reads a plan that `save` wrote, each field checked; `path` is kept in the plan's `path`.

        Raises:
            ValueError: If the file cannot be read or is not a plan, or a field has the wrong type or value (the
                message names the file and the field).
        """
        try:
            with open(path, encoding="utf-8") as handle:
                values = json.load(handle)
        except (OSError, ValueError) as err:
            raise ArgumentValueError("the file '{path}' is not a plan written by 'ms-accum plan --output'{aside}: "
                                     "{err}", path=path, err=err, aside=Aside(" or Plan.save")) from err
        required = {f.name for f in dataclasses.fields(cls)} - _OPTIONAL
        if not isinstance(values, dict) or required - set(_renamed(values)):
            held = sorted(values) if isinstance(values, dict) else type(values).__name__
            raise ArgumentValueError("the file '{path}' is not a plan written by 'ms-accum plan --output'{aside}: "
                                     "a plan must hold {required}, but got {held}.", aside=Aside(" or Plan.save"),
                                     path=path, required=sorted(required), held=held)
        return cls.from_dict(values, path)

    def __str__(self) -> str:
        budget = (f"a budget of {self.memory_mib:.0f} MiB" if self.memory_mib is not None
                  else f"the device's free memory ({self.budget_mib:.0f} MiB)")
        lines = [f"Plan for {self.model}: global batch {self.global_batch} = K={self.accumulate_step} x "
                 f"B={self.batch_size}" + (f" x {self.ranks} ranks" if self.ranks > 1 else "") +
                 f", structure '{self.structure}', predicted peak {self.predicted_peak_mib:.0f} MiB within {budget}",
                 f"  fit: peak = {self.intercept_mib:.1f} MiB + {self.slope_mib:.2f} MiB x B",
                 f"  {'B':>6} {'K':>5}  {'structure':<13}{'peak MiB':>10}{'ms/window':>11}"]
        for trial in self.trials:
            peak = "-" if trial.peak_mib is None else f"{trial.peak_mib:.0f}"
            time_ = "-" if trial.ms_per_window is None else f"{trial.ms_per_window:.0f}"
            mark = "" if trial.error is None else f"  ({trial.error})"
            lines.append(f"  {trial.batch_size:>6} {trial.accumulate_step:>5}  {trial.structure:<13}{peak:>10}"
                         f"{time_:>11}{mark}")
        return "\n".join(lines)


_OPTIONAL = {"network"}  # fields a plan written by an older ms_accum may lack


def _renamed(values: dict) -> dict:
    """A plan's fields as ms_accum 0.2 wrote them (``accumulate_steps``) under today's names."""
    if isinstance(values, dict) and "accumulate_steps" in values and "accumulate_step" not in values:
        values = {("accumulate_step" if k == "accumulate_steps" else k): v for k, v in values.items()}
    return values

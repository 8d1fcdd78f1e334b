"""What a run was built with, as its training states record it: the optimizer's class and settings, the network's
parameters and the data's columns. A resumed run built otherwise would not continue the same training (docs/resume.md).
"""
from __future__ import annotations

import hashlib
from typing import Dict

from mindspore import Parameter, Tensor, nn
from mindspore.dataset import Dataset

from .._mindspore import optimizer_attribute
from .lr import SamplesLR
from .plan import network_fingerprint
from .sharding import REBUILT

# What every optimizer is built with, before the settings of its own class (`REBUILT`'s, where ms_accum knows them).
_COMMON = ("learning_rate", "weight_decay")


def built_with(optimizer: nn.Optimizer, network: nn.Cell, dataset: Dataset) -> Dict[str, str]:
    """The run's ``optimizer``, ``network`` and ``data``, each one line a message can show: read before anything
    trains or loads (a resumed state's rates replace the factory's)."""
    settings = ", ".join(f"{name}={_value(optimizer_attribute(optimizer, name, None))}"
                         for name in _COMMON + REBUILT.get(type(optimizer), ()))
    net = network_fingerprint(network)
    # Per sample, not per batch: a state resumes on another number of ranks, with another micro-batch.
    columns = ", ".join(f"{[int(d) for d in shape[1:]]} {dtype}"
                        for shape, dtype in zip(dataset.output_shapes(), dataset.output_types()))
    return {"optimizer": f"{type(optimizer).__name__}({settings})",
            "network": f"{net['parameters']} parameters of {net['values']} values (hash {net['hash']})",
            "data": f"{len(dataset.get_col_names())} columns, per sample {columns}"}


def _value(value) -> str:
    """A setting as it was given: a number for a one-element Tensor, a list per group, a schedule by its class and a
    hash of the values it holds (a list of rates)."""
    if isinstance(value, (tuple, list, nn.CellList)):
        return f"[{', '.join(_value(v) for v in value)}]"
    if isinstance(value, (Tensor, Parameter)):
        array = value.asnumpy()
        return f"{array.item():.6g}" if array.size == 1 else f"{array.size} values (hash {_hash(array)})"
    if isinstance(value, SamplesLR):  # its Parameter holds the rate of the moment, not a setting
        return f"SamplesLR({getattr(value.schedule, '__qualname__', type(value.schedule).__name__)})"
    if isinstance(value, nn.Cell):
        held = [p.asnumpy() for p in value.get_parameters()]
        return type(value).__name__ + (f" (hash {_hash(*held)})" if held else "")
    return repr(value)


def _hash(*arrays) -> str:
    return hashlib.sha256(b"".join(array.tobytes() for array in arrays)).hexdigest()[:16]

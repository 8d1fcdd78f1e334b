"""Your own model, for the command line: a factory named ``package.module:function`` that a fresh process imports.

The function takes no arguments and returns ``(network, loss_fn, optimizer, sample)``: the network, its loss (a mean
over the batch), the optimizer over the network's parameters, and ``sample(batch_size)``, which returns one batch of
`batch_size` samples as the network and the loss take it, ``(data, label)`` (numpy arrays or Tensors). `sample` is how
the command line gets batches of any size without knowing your data: random ones of the right shapes are enough.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from mindspore import nn

from .._choices import DEMO_FACTORIES

SEPARATOR = ":"


@dataclass
class UserModel:
    """What a factory returned, checked."""

    network: nn.Cell
    loss_fn: nn.Cell
    optimizer: nn.Optimizer
    sample: Callable[[int], Sequence]


def is_factory(name: str) -> bool:
    """Whether `name` names a factory (``package.module:function``) rather than a demo network."""
    return SEPARATOR in name


def load_model(spec: str, cls_name: str = "load_model") -> UserModel:
    """
    Imports the factory `spec` names, calls it and checks what it returns; a demo network's name (``"lenet5"``,
    ``"mlp"``) stands for its factory in `ms_accum.demo.models`.

    The current directory is searched first, as ``python -m`` does, so a module beside the caller is found.

    Args:
        spec (str): ``package.module:function``, or ``"lenet5"`` / ``"mlp"``.
        cls_name (str): The caller's name, for messages. Default: ``"load_model"``.

    Returns:
        UserModel, the network, loss, optimizer and sample function.

    Raises:
        ValueError: If `spec` is not ``module:function``, the module cannot be imported, it has no such function, the
            function raises, or it does not return ``(network, loss_fn, optimizer, sample)`` of the right kinds.
    """
    module_name, _, function_name = DEMO_FACTORIES.get(spec, spec).partition(SEPARATOR)
    if not module_name or not function_name.isidentifier():
        raise ValueError(f"For '{cls_name}', the argument 'model' must be 'package.module:function' (a factory) or "
                         f"the name of a built-in model, but got '{spec}'.")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001  (whatever the user's module raises, it is their module that failed)
        raise ValueError(f"For '{cls_name}', the module '{module_name}' of the factory '{spec}' cannot be imported: "
                         f"{type(err).__name__}: {err}.") from err
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise ValueError(f"For '{cls_name}', the module '{module_name}' has no function '{function_name}' (the "
                         f"factory '{spec}').")
    try:
        parts = factory()
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"For '{cls_name}', the factory '{spec}' failed: {type(err).__name__}: {err}.") from err
    kinds = (("network", nn.Cell), ("loss_fn", nn.Cell), ("optimizer", nn.Optimizer))
    if not isinstance(parts, (tuple, list)) or len(parts) != 4:
        raise ValueError(f"For '{cls_name}', the factory '{spec}' must return (network, loss_fn, optimizer, sample), "
                         f"but returned {_kind(parts)}.")
    for (what, kind), value in zip(kinds, parts):
        if not isinstance(value, kind):
            raise ValueError(f"For '{cls_name}', the factory '{spec}' must return an nn.{kind.__name__} as its {what}, "
                             f"but returned {_kind(value)}.")
    if not callable(parts[3]):
        raise ValueError(f"For '{cls_name}', the factory '{spec}' must return sample(batch_size) as its fourth item, "
                         f"but returned {_kind(parts[3])}.")
    return UserModel(*parts)


def _kind(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{value!r}" if value is None else f"a {type(value).__name__}"

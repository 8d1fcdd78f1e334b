"""Your own model, for the command line: a factory named ``package.module:function`` that a fresh process imports.

The function takes no arguments and returns ``(network, loss_fn, optimizer, sample)`` or
``(network, loss_fn, optimizer, sample, dataset)``:

- the network, its loss (a mean or a sum over the batch; None for a network that computes its own loss from all the
  columns) and the optimizer over the network's parameters;
- ``sample(batch_size)``, one batch of `batch_size` samples as the network and the loss take it: its columns, the
  network's inputs then the loss's labels, ``(data, label)`` or ``(input_ids, attention_mask, token_type_ids, label)``
  (numpy arrays or Tensors, `batch_size` rows each; `ms_accum.core.columns`): how `verify` and `plan` get batches of
  any size without knowing your data (random ones of the right shapes are enough);
- ``dataset(batch_size, usage, shard_id, num_shards)``, for `train` and `eval`: a `mindspore.dataset.Dataset` of
  batches of those columns, of `batch_size`, of the ``"train"`` or ``"eval"`` split, the shard `shard_id` of
  `num_shards` (data parallel under msrun: give every shard the same number of batches).

docs/your-model.md shows one end to end.
"""
from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn
from mindspore.dataset import Dataset

from .._choices import DEMO_FACTORIES
from .._validation import ArgumentValueError, NoBatchError, describe_exception, door
from ..core.columns import columns_wanted, with_loss

SEPARATOR = ":"


@dataclass
class UserModel:
    """What a factory returned, checked; `spec` names the factory."""

    spec: str
    network: nn.Cell
    loss_fn: Optional[nn.Cell]
    optimizer: nn.Optimizer
    sample: Callable[[int], Sequence]
    dataset: Optional[Callable[..., Dataset]] = None
    returns_weight: bool = False  # whether the network with its loss returns (loss, weight): found by `load_model`

    @functools.cached_property
    def net_with_loss(self) -> nn.Cell:
        """The Cell from a batch's columns to the loss (`ms_accum.core.columns.with_loss`), built once."""
        return with_loss(self.network, self.loss_fn)

    def batch(self, batch_size: int) -> Tuple[np.ndarray, ...]:
        """
        ``sample(batch_size)`` as numpy arrays, checked: its columns, as many as the network and the loss take,
        `batch_size` rows each.

        Raises:
            ValueError: If `sample` raises, or returns anything else.
        """
        where = f"sample({batch_size}) of the factory '{self.spec}'"
        try:
            batch = self.sample(batch_size)
        except Exception as err:  # noqa: BLE001  (whatever the user's sample raises, it is theirs that failed)
            raise ArgumentValueError("{where} failed: {value}.", where=where, value=describe_exception(err)) from err
        if not isinstance(batch, (tuple, list)) or not all(isinstance(value, (np.ndarray, Tensor)) for value in batch):
            raise ArgumentValueError("{where} must return its columns, numpy arrays or Tensors (e.g. (data, label)), "
                                     "but returned {value}.", where=where, value=_kind(batch))
        wanted = columns_wanted(self.net_with_loss, len(batch))
        if wanted is not None:
            raise ArgumentValueError("{where} must return the columns of {wanted}, but returned {value}.",
                                     where=where, wanted=wanted, value=len(batch))
        arrays = tuple(value.asnumpy() if isinstance(value, Tensor) else value for value in batch)
        if any(value.shape[:1] != (batch_size,) for value in arrays):
            shapes = ", ".join(str(value.shape) for value in arrays)
            raise ArgumentValueError("{where} must return {batch_size} rows in each column, but returned arrays of "
                                     "shapes {shapes}.", where=where, batch_size=batch_size, shapes=shapes)
        return arrays

    def data(self, batch_size: int, usage: str, shard_id: int, num_shards: int) -> Dataset:
        """
        ``dataset(batch_size, usage, shard_id, num_shards)``, checked: a Dataset of two columns in batches of
        `batch_size`.

        Raises:
            ValueError: If the factory provides no dataset, or it raises, or returns anything else.
            NoBatchError: If the dataset yields no batch (a split smaller than `batch_size`, batched with
                ``drop_remainder=True``), a ValueError.
        """
        where = f"the factory '{self.spec}'"
        if self.dataset is None:
            raise ArgumentValueError("{where} provides no data: return dataset(batch_size, usage, shard_id, "
                                     "num_shards) as its fifth item (docs/your-model.md).", where=where)
        call = f"dataset({batch_size}, '{usage}', {shard_id}, {num_shards})"
        try:
            data = self.dataset(batch_size, usage, shard_id, num_shards)
        except Exception as err:  # noqa: BLE001
            raise ArgumentValueError("{call} of {where} failed: {value}.", call=call, where=where,
                                     value=describe_exception(err)) from err
        if not isinstance(data, Dataset):
            raise ArgumentValueError("{call} of {where} must return a mindspore.dataset.Dataset, but returned {value}.",
                                     call=call, where=where, value=_kind(data))
        wanted = columns_wanted(self.net_with_loss, len(data.get_col_names()))
        if wanted is not None or data.get_batch_size() != batch_size:
            raise ArgumentValueError("{call} of {where} must yield batches of {batch_size} of {wanted}, but yields "
                                     "the columns {columns} in batches of {given}.", call=call, where=where,
                                     batch_size=batch_size,
                                     wanted='the columns of ' + wanted if wanted else 'its columns',
                                     columns=data.get_col_names(), given=data.get_batch_size())
        if data.get_dataset_size() == 0:
            try:  # the shard's samples, counted as batches of one: only for the message, which holds without them
                samples = int(self.dataset(1, usage, shard_id, num_shards).get_dataset_size())
            except Exception:  # noqa: BLE001
                samples = None
            held = f"holds {samples} sample(s), fewer than" if samples is not None else "holds less than"
            shard = "" if num_shards == 1 else f"(shard {shard_id} of {num_shards}) "
            raise NoBatchError("{call} of {where} yields no batch: its '{usage}' split {shard}{held} one batch of "
                               "{batch_size}.", call=call, where=where, usage=usage, shard=shard, held=held,
                               batch_size=batch_size, samples=samples)
        return data


def is_factory(name: str) -> bool:
    """Whether `name` names a factory (``package.module:function``) rather than a demo network."""
    return SEPARATOR in name


@door("load_model")
def load_model(spec: str) -> UserModel:
    """
    Imports the factory `spec` names, calls it and checks what it returns; a demo network's name (``"lenet5"``,
    ``"mlp"``) stands for its factory in `ms_accum.demo.models`.

    The current directory is searched first, as ``python -m`` does, so a module beside the caller is found. Its
    ``sample(2)`` is checked (two rows of each column) and run once through the network and the loss, eagerly and
    in inference mode, so that samples the network cannot take are refused here, in the factory's terms.

    Args:
        spec (str): ``package.module:function``, or ``"lenet5"`` / ``"mlp"``.

    Returns:
        UserModel, the network, loss, optimizer, sample function and dataset function (None if not given).

    Raises:
        ValueError: If `spec` is not ``module:function``, the module cannot be imported, it has no such function, the
            function raises, it does not return ``(network, loss_fn, optimizer, sample[, dataset])`` of the right
            kinds, or ``sample(2)`` does not return two rows of the columns that the network and loss take.
    """
    module_name, _, function_name = DEMO_FACTORIES.get(spec, spec).partition(SEPARATOR)
    if not module_name or not function_name.isidentifier():
        raise ArgumentValueError("{@model:subject} must be 'package.module:function' (a factory) or the name of a "
                                 "built-in model, but got '{spec}'.", spec=spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001  (whatever the user's module raises, it is their module that failed)
        raise ArgumentValueError("the module '{module_name}' of the factory '{spec}' cannot be imported: {value}.",
                                 module_name=module_name, spec=spec, value=describe_exception(err)) from err
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise ArgumentValueError("the module '{module_name}' has no function '{function_name}' (the factory '{spec}').",
                                 module_name=module_name, function_name=function_name, spec=spec)
    try:
        parts = factory()
    except Exception as err:  # noqa: BLE001
        raise ArgumentValueError("the factory '{spec}' failed: {cause}.", spec=spec,
                                 cause=describe_exception(err)) from err
    kinds = (("network", nn.Cell), ("loss_fn", (nn.Cell, type(None))), ("optimizer", nn.Optimizer))
    if not isinstance(parts, (tuple, list)) or len(parts) not in (4, 5):
        raise ArgumentValueError("the factory '{spec}' must return (network, loss_fn, optimizer, sample) or (network, "
                                 "loss_fn, optimizer, sample, dataset), but returned {value}.", spec=spec,
                                 value=_kind(parts))
    for (what, kind), value in zip(kinds, parts):
        if not isinstance(value, kind):
            expected = "an nn.Cell or None" if what == "loss_fn" else f"an nn.{kind.__name__}"
            raise ArgumentValueError("the factory '{spec}' must return {expected} as its {what}, but returned {value}.",
                                     spec=spec, expected=expected, what=what, value=_kind(value))
    for position, what in ((3, "sample(batch_size) as its fourth item"),
                           (4, "dataset(batch_size, usage, shard_id, num_shards) as its fifth item")):
        if position < len(parts) and not callable(parts[position]):
            raise ArgumentValueError("the factory '{spec}' must return {what}, but returned {value}.", spec=spec,
                                     what=what, value=_kind(parts[position]))
    user = UserModel(spec, *parts)  # its fields in the factory's order: network, loss_fn, optimizer, sample[, dataset]
    _check_sample(user)
    return user


def _check_sample(user: UserModel) -> None:
    from ..core.losses import returns_weight  # one eager forward pass in inference mode: nothing compiles or moves
    batch = user.batch(2)
    try:
        user.returns_weight = returns_weight(user.net_with_loss, [Tensor(value) for value in batch])
    except Exception as err:  # noqa: BLE001  (whatever the user's network raises on its own samples)
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        dtypes = ", ".join(f"{value.dtype} {value.shape}" for value in batch)
        raise ArgumentValueError("the network and loss of the factory '{spec}' do not take the batch its sample(2) "
                                 "returns ({dtypes}): {name}: {first}", spec=user.spec, dtypes=dtypes,
                                 name=type(err).__name__, first=first) from err


def _kind(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{value!r}" if value is None else f"a {type(value).__name__}"

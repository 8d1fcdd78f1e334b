"""Evaluation: accuracy and loss of a network, or of a saved checkpoint loaded strictly."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from mindspore import Parameter, nn
from mindspore.dataset import Dataset
from mindspore.train import Accuracy, Callback, Loss, Model

from .._validation import (Argument, ArgumentValueError, check_isinstance, check_positive_int, check_value_in,
                           describe_exception, door)
from ..train.checkpoint import CheckpointError, MetaValue, load_checkpoint, load_into
from .data import dataset_for, resolve_data_dir
from .models import MODELS, build_model
from ..core.parallel import LocalSums
from ..tools.factory import is_factory, load_model
from ..train.validation import Evaluator, Validation


DEFAULT_BATCH_SIZE = 256  # the evaluation's batch when neither the caller nor the checkpoint says one


@dataclass
class EvalResult:
    """Test metrics: `accuracy` in [0, 1] (None for a network that is not a classifier), the mean `loss` (per batch for
    the built-in models, as `Model.eval` gives it; per sample for a factory's), and the number of `batches`."""

    accuracy: Optional[float]
    loss: float
    batches: int

    def as_dict(self) -> Dict[str, Optional[float]]:
        return asdict(self)

    def __str__(self) -> str:
        accuracy = "" if self.accuracy is None else f"held-out accuracy: {100 * self.accuracy:.2f}%, "
        return f"{accuracy}held-out loss: {self.loss:.6f}"


@door("evaluate")
def evaluate(network: nn.Cell, dataset: Dataset, loss_fn: Optional[nn.Cell] = None,
             callbacks: Optional[List[Callback]] = None) -> EvalResult:
    """
    Loss and, for a classifier, accuracy of `network` on `dataset`, through `mindspore.train.Model.eval`.

    A classifier is told by its labels: integer labels are classes (accuracy of the logits' argmax), any other labels
    are targets (regression, embeddings), for which only the loss is reported.

    Args:
        network (nn.Cell): The network.
        dataset (Dataset): Yields (data, label) batches.
        loss_fn (nn.Cell, optional): Default: softmax cross-entropy with sparse labels, mean over the batch.
        callbacks (list[Callback], optional): Passed to `Model.eval` (a progress bar, for instance).

    Returns:
        EvalResult.

    Raises:
        TypeError: If `network` is not a Cell or `dataset` not a Dataset.
        ValueError: If `dataset` yields no batch.
    """
    check_isinstance(network, "network", nn.Cell)
    check_isinstance(dataset, "dataset", Dataset)
    if dataset.get_dataset_size() == 0:
        raise ArgumentValueError("{@dataset:subject} must yield at least one batch, but it yields none.")
    loss_fn = loss_fn or nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    classifier = np.issubdtype(np.dtype(dataset.output_types()[-1]), np.integer)
    metrics = {"loss": Loss(), **({"accuracy": Accuracy()} if classifier else {})}
    found = Model(network, loss_fn, metrics=metrics).eval(dataset, callbacks=callbacks, dataset_sink_mode=False)
    return EvalResult(accuracy=float(found["accuracy"]) if classifier else None, loss=float(found["loss"]),
                      batches=dataset.get_dataset_size())


def recorded_data_dir(data_dir: str, ckpt_dir: str) -> str:
    """The ``data_dir`` metadata of a checkpoint saved in `ckpt_dir`: relative to it, so no machine's absolute path
    is stored and checkpoint and data can move together (read back by `checkpoint_data_dir`)."""
    return os.path.relpath(data_dir, ckpt_dir)


def checkpoint_data_dir(metadata: Dict[str, MetaValue], data: Optional[str] = None, ckpt: str = ".") -> str:
    """The MNIST directory to evaluate checkpoint `ckpt` on: `data`, else the one it was trained on if it is still
    there (recorded relative to the checkpoint's directory), else `resolve_data_dir`'s default."""
    if data is None and metadata.get("data_dir"):
        recorded = os.path.join(os.path.dirname(os.fspath(ckpt)), str(metadata["data_dir"]))
        data = recorded if os.path.isdir(recorded) else None
    return resolve_data_dir(data)


def _holds(params: Dict[str, Parameter], model: str) -> bool:
    """Whether a checkpoint's parameters include every parameter of `model`, with its shape."""
    own = {p.name: tuple(p.shape) for p in build_model(model).get_parameters()}
    return all(name in params and tuple(params[name].shape) == shape for name, shape in own.items())


@door("evaluate_checkpoint")
def evaluate_checkpoint(ckpt: str, model: Optional[str] = None, data: Optional[str] = None,
                        batch_size: Optional[int] = None, num_samples: Optional[int] = None,
                        callbacks: Optional[List[Callback]] = None,
                        arg_name: str = "model") -> Tuple[EvalResult, Dict[str, MetaValue]]:
    """
    Rebuilds the model a checkpoint was trained with, loads it strictly, and evaluates it on its evaluation data.

    A built-in model (``"lenet5"``, ``"mlp"``) is evaluated on MNIST's test split through `Model.eval`; a factory's
    (``package.module:function``, `ms_accum.tools.factory`) on the ``"eval"`` split of its ``dataset``, with its
    loss, as validation scores it during training (`ms_accum.train.validation`: batches of any number of columns,
    the loss weighted by samples, the accuracy for one column of integer classes).

    Args:
        ckpt (str): A checkpoint written by ms_accum (or any checkpoint of one of `MODELS`, with `model`).
        model (str, optional): ``"lenet5"``, ``"mlp"`` or a factory's ``package.module:function``; default: the model
            recorded in the checkpoint. If both are known they must agree.
        data (str, optional): MNIST directory of a built-in model; default: the one the checkpoint was trained on,
            else `resolve_data_dir`.
        batch_size (int, optional): Evaluation batch size. Default: ``None``, the micro-batch the checkpoint was trained
            with (its ``batch_size`` over its ``world_size``, as ``ms-accum train`` records them), else ``256``.
        num_samples (int, optional): Evaluate on the first `num_samples` test images only (built-in models).
        callbacks (list[Callback], optional): Passed to `Model.eval` (built-in models).
        arg_name (str): How messages name the argument `model` (``"--model"`` on the command line). Default:
            ``"model"``.

    Returns:
        tuple (EvalResult, metadata of the checkpoint).

    Raises:
        CheckpointError: If the file is missing, unreadable, of another model, or does not fit the network
            (missing, extra or reshaped parameters); nothing is half-loaded.
        DataError: If the test data is missing or corrupt.
        ValueError: If a factory fails, provides no evaluation data or data that yields no batch of `batch_size`
            (`ms_accum._validation.NoBatchError`), its network and loss cannot evaluate that data, or `data`,
            `num_samples` or `callbacks` is given with one.
    """
    if batch_size is not None:
        check_positive_int(batch_size, "batch_size")
    if num_samples is not None:
        check_positive_int(num_samples, "num_samples")
    contents = load_checkpoint(ckpt)
    metadata = contents[1]
    batch_size = batch_size or _trained_micro_batch(metadata) or DEFAULT_BATCH_SIZE
    recorded = metadata.get("model")
    if model is None:
        if not isinstance(recorded, str) or not (recorded in MODELS or is_factory(recorded)):
            raise CheckpointError("Checkpoint '{ckpt}' does not record its model: pass {arg_name}, one of {value} or "
                                  "package.module:function.", ckpt=ckpt, arg_name=arg_name, value=sorted(MODELS))
        model = recorded
    if is_factory(model):  # its dataset() decides its evaluation data: the built-in models' MNIST options are refused
        for given, what in ((data, "data"), (num_samples, "num_samples")):
            if given is not None:
                raise ArgumentValueError("{what:subject} applies to the built-in models' MNIST, but got {given!r} with "
                                         "the factory '{spec}', whose dataset() decides its evaluation data.",
                                         what=Argument(what), given=given, spec=model)
        return _evaluate_factory(model, ckpt, contents, batch_size, callbacks, arg_name), metadata
    check_value_in(model, arg_name, MODELS)
    network = build_model(model)
    _load(network, ckpt, model, contents, arg_name)
    dataset = dataset_for(model, checkpoint_data_dir(metadata, data, ckpt), batch_size, usage="test",
                          num_samples=num_samples)
    return evaluate(network, dataset, callbacks=callbacks), metadata


def _evaluate_factory(spec: str, ckpt: str, contents, batch_size: int, callbacks: Optional[List[Callback]],
                      arg_name: str) -> EvalResult:
    """The factory's network, loaded strictly from the checkpoint, evaluated on its ``"eval"`` split; data that yields
    no batch, or that the network and loss cannot take or that fails while read, is refused naming the call."""
    if callbacks:
        raise ArgumentValueError("{@callbacks:subject} applies to the built-in models, whose evaluation is MindSpore's "
                                 "Model.eval, but got {value} with the factory '{spec}'.", value=len(callbacks),
                                 spec=spec)
    user = load_model(spec)
    _load(user.network, ckpt, spec, contents, arg_name)
    dataset = user.data(batch_size, "eval", 0, 1)
    try:  # batches of any number of columns, and a network that computes its own loss, as in training
        scores = Evaluator(user.network, user.loss_fn, Validation(every=1)).score(dataset, LocalSums())
    except Exception as err:  # noqa: BLE001  (a shape the network does not take, or the data failed)
        cause = describe_exception(err).rstrip(".")
        raise ArgumentValueError("evaluating the factory '{spec}' on its dataset({batch_size}, 'eval', 0, 1) failed: "
                                 "{cause}.", spec=spec, batch_size=batch_size, cause=cause) from err
    return EvalResult(accuracy=scores.get("accuracy"), loss=scores["loss"], batches=dataset.get_dataset_size())


def _trained_micro_batch(metadata: Dict[str, MetaValue]) -> Optional[int]:
    """The micro-batch of one device that a checkpoint's run trained with (``batch_size`` over ``world_size``, as
    ``ms-accum train`` records them), or None if it does not say."""
    batch, world = metadata.get("batch_size"), metadata.get("world_size", 1)
    return batch // world if isinstance(batch, int) and isinstance(world, int) and 0 < world <= batch else None


def _load(network: nn.Cell, ckpt: str, model: str, contents, arg_name: str) -> None:
    """Loads strictly, naming the model chosen; a file that records no model and holds another built-in model's
    parameters is named as that model's."""
    try:
        load_into(network, ckpt, strict=True, expected={"model": model}, contents=contents,
                  network_name=f"the network of the model '{model}' ({arg_name})")
    except CheckpointError as err:
        fits = [] if "model" in contents[1] else [other for other in sorted(MODELS)
                                                 if other != model and _holds(contents[0], other)]
        if not fits:
            raise
        raise CheckpointError("{err} Its parameters are those of the model '{model}' (the file does not record its "
                              "model): evaluate it as '{model}'.", err=err, model=fits[0]) from None


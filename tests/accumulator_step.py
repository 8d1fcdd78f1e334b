"""The Accumulator as its documentation uses it, written once for the tests: `value_and_grad` of the network's loss
and an `@ms.jit` train step that hands each micro-batch's gradients to the Accumulator (benchmarks/common.py keeps
its own copy: tests do not import benchmark code)."""
from typing import Callable, Optional

import mindspore as ms
from mindspore import nn, ops

from ms_accum import Accumulator


def accumulator_step(network: nn.Cell, loss_fn: nn.Cell, accumulator: Accumulator,
                     weight: Optional[str] = None) -> Callable:
    """
    ``step(x, y) -> loss``: one micro-batch's gradient of ``loss_fn(network(x), y)``, accumulated in `accumulator`.

    Args:
        network (nn.Cell): The network.
        loss_fn (nn.Cell): Its loss.
        accumulator (Accumulator): Over the parameters of `network`.
        weight (str, optional): What a micro-batch weighs in its window: ``"returned"``, the weight `loss_fn` returns
            with its loss, ``(loss, weight)`` (``reduction="weighted_mean"``); ``"rows"``, its samples, ``x.shape[0]``
            (shares of unequal size). Default: ``None``, no weight given to the Accumulator.

    Returns:
        Callable, the `@ms.jit` train step.
    """
    parameters = accumulator.optimizer.parameters

    def forward(x, y):
        return loss_fn(network(x), y)

    if weight == "returned":
        grad_fn = ms.value_and_grad(forward, None, parameters, has_aux=True)

        @ms.jit
        def weighted_step(x, y):
            (loss, returned), grads = grad_fn(x, y)
            return ops.depend(loss, accumulator(grads, returned))
        return weighted_step

    grad_fn = ms.value_and_grad(forward, None, parameters)
    if weight == "rows":
        @ms.jit
        def rows_step(x, y):
            loss, grads = grad_fn(x, y)
            return ops.depend(loss, accumulator(grads, x.shape[0]))
        return rows_step

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        return ops.depend(loss, accumulator(grads))
    return step

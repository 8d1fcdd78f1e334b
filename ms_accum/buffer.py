"""The named state of one accumulation window, shared by every graph that touches it."""
from __future__ import annotations

import mindspore as ms
from typing import Optional

from mindspore import Parameter, ParameterTuple, Tensor

from ._validation import check_isinstance
from .guard import LossScaler, WindowGuard


class AccumulationBuffer:
    """
    One zero-initialised gradient buffer per parameter, the window's two counters, and its `WindowGuard`.

    It holds no copy of the parameters' values and no second all-zeros tuple, so its memory is exactly
    that of the trainable parameters plus two scalars. Every Cell built on one buffer reads and writes the
    same Parameters, so `TrainForwardBackward`, `TrainOptim`, `TrainClear` and `TrainAccumulationCell`
    can be mixed freely (the executor does so for an epoch's last, partial window).

    Args:
        params (Union[ParameterTuple, list[Parameter]]): The parameters to accumulate gradients for,
            usually `optimizer.parameters`.
        prefix (str): Name prefix of the state's Parameters. Default: ``"accumulate"``.
        policy (str): What a non-finite micro-batch does to its window: ``"skip_window"`` (default) or
            ``"skip_microbatch"`` (see `ms_accum.guard`).
        loss_scaler (Union[amp.StaticLossScaler, amp.DynamicLossScaler], optional): MindSpore's loss scaler for
            the backward passes. Default: ``None``.

    Attributes:
        grad_sum (ParameterTuple): The buffers, named ``<prefix>.<parameter name>``.
        mini_step (Parameter): int32, micro-batches in the open window.
        num_samples (Parameter): float32, the sum of their sample weights, the divisor of the mean.
        guard (WindowGuard): The non-finite check and loss scale every Cell on this buffer shares.

    Raises:
        TypeError: If `params` is not a sequence of Parameters, or `loss_scaler` is not a MindSpore loss scaler.
        ValueError: If `policy` is unknown.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from mindspore import nn
        >>> from ms_accum import AccumulationBuffer
        >>> net = nn.Dense(3, 2)
        >>> buffer = AccumulationBuffer(net.trainable_params())
        >>> [p.name for p in buffer.parameters()][:4]
        ['accumulate.weight', 'accumulate.bias', 'accumulate.mini_step', 'accumulate.num_samples']
    """

    def __init__(self, params, prefix: str = "accumulate", policy: str = "skip_window",
                 loss_scaler: Optional[LossScaler] = None) -> None:
        check_isinstance(params, "params", (ParameterTuple, list, tuple), "AccumulationBuffer")
        if not params or not all(isinstance(p, Parameter) for p in params):
            raise TypeError("For 'AccumulationBuffer', the argument 'params' must be a non-empty sequence of "
                            f"Parameters, but got {params!r}.")
        self.grad_sum = ParameterTuple(params).clone(prefix=prefix, init="zeros")
        self.mini_step = Parameter(Tensor(0, ms.int32), name=f"{prefix}.mini_step", requires_grad=False)
        self.num_samples = Parameter(Tensor(0.0, ms.float32), name=f"{prefix}.num_samples", requires_grad=False)
        self.guard = WindowGuard(policy, loss_scaler, prefix)

    def parameters(self) -> list:
        """All Parameters the buffer owns: the gradient buffers, the two counters, then the guard's."""
        return [*self.grad_sum, self.mini_step, self.num_samples, *self.guard.parameters()]

    def __len__(self) -> int:
        return len(self.grad_sum)

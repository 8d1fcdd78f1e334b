"""The benchmark's own copies of MindSpore's two documented accumulation implementations.

Copied from the documentation, not imported from ms_accum, so the comparison is against it as written:
- the gradient-accumulation page ("梯度累积"): the `@ms.jit_class` Accumulator with its second all-zeros copy, a
  `forward_fn` returning `loss / accumulate_step`, `value_and_grad`, and an `@ms.jit` train_step;
- the Cell-graph tutorial: TrainForwardBackward / TrainOptim / TrainClear, driven by the
  tutorial's Python loop (`if (k + 1) % mini_steps == 0: optim(); clear()`).
Only what a benchmark cannot take verbatim changed: the network and optimizer are arguments instead of globals.
"""
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops


# --------------------------------------------------------------------------- the gradient-accumulation page
@ms.jit_class
class DocAccumulator():
    def __init__(self, optimizer, accumulate_step, clip_norm=1.0):
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.inner_grads = optimizer.parameters.clone(prefix="accumulate_", init='zeros')
        self.zeros = optimizer.parameters.clone(prefix="zeros_", init='zeros')
        self.counter = Parameter(Tensor(1, ms.int32), 'counter_')
        assert accumulate_step > 0
        self.accumulate_step = accumulate_step
        self.map = ops.HyperMap()

    def __call__(self, grads):
        # 将单步获得的梯度累加至Accumulator的inner_grads
        self.map(ops.partial(ops.assign_add), self.inner_grads, grads)
        if self.counter % self.accumulate_step == 0:
            # 如果达到累积步数,进行参数优化更新
            self.optimizer(self.inner_grads)
            # 完成参数优化更新后,清零inner_grads
            self.map(ops.partial(ops.assign), self.inner_grads, self.zeros)
        # 计算步数加一
        ops.assign_add(self.counter, Tensor(1, ms.int32))
        return True


def accumulator_page_train_step(model, loss_fn, optimizer, accumulate_step):
    """The page's forward_fn / grad_fn / @ms.jit train_step around a DocAccumulator; returns (step, accumulator)."""
    accumulator = DocAccumulator(optimizer, accumulate_step)

    def forward_fn(data, label):
        logits = model(data)
        loss = loss_fn(logits, label)
        # loss除以累加步数accumulate_step
        return loss / accumulate_step

    grad_fn = ms.value_and_grad(forward_fn, None, model.trainable_params())

    @ms.jit
    def train_step(data, label):
        loss, grads = grad_fn(data, label)
        loss = ops.depend(loss, accumulator(grads))
        return loss

    return train_step, accumulator


# --------------------------------------------------------------------------------- the Cell-graph tutorial
_sum_op = ops.MultitypeFuncGraph("doc_grad_sum_op")
_clear_op = ops.MultitypeFuncGraph("doc_clear_op")


@_sum_op.register("Tensor", "Tensor")
def _cumulative_grad(grad_sum, grad):
    """Apply grad sum to cumulative gradient."""
    add = ops.AssignAdd()
    return add(grad_sum, grad)


@_clear_op.register("Tensor", "Tensor")
def _clear_grad_sum(grad_sum, zero):
    """Apply zero to clear grad_sum."""
    success = True
    success = ops.depend(success, ops.assign(grad_sum, zero))
    return success


class TrainForwardBackward(nn.Cell):
    def __init__(self, network, optimizer, grad_sum, sens=1.0):
        super(TrainForwardBackward, self).__init__(auto_prefix=False)
        self.network = network
        self.network.set_grad()
        self.network.add_flags(defer_inline=True)
        self.weights = ParameterTuple(network.trainable_params())
        self.optimizer = optimizer
        self.grad_sum = grad_sum
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = sens
        self.hyper_map = ops.HyperMap()

    def construct(self, *inputs):
        weights = self.weights
        loss = self.network(*inputs)
        sens = ops.Fill()(ops.DType()(loss), ops.Shape()(loss), self.sens)
        grads = self.grad(self.network, weights)(*inputs, sens)
        return ops.depend(loss, self.hyper_map(ops.partial(_sum_op), self.grad_sum, grads))


class TrainOptim(nn.Cell):
    def __init__(self, optimizer, grad_sum):
        super(TrainOptim, self).__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.grad_sum = grad_sum

    def construct(self):
        return self.optimizer(self.grad_sum)


class TrainClear(nn.Cell):
    def __init__(self, grad_sum, zeros):
        super(TrainClear, self).__init__(auto_prefix=False)
        self.grad_sum = grad_sum
        self.zeros = zeros
        self.hyper_map = ops.HyperMap()

    def construct(self):
        seccess = self.hyper_map(ops.partial(_clear_op), self.grad_sum, self.zeros)
        return seccess


class DocGradientAccumulation:
    """The tutorial's executor state (grad_sum + zeros clones and the three Cells); `micro_step` is its loop body."""

    def __init__(self, network, loss_fn, optimizer):
        params = optimizer.parameters
        self._grad_sum = params.clone(prefix="grad_sum", init='zeros')
        self._zeros = params.clone(prefix="zeros", init='zeros')
        self._train_forward_backward = TrainForwardBackward(nn.WithLossCell(network, loss_fn), optimizer,
                                                            self._grad_sum, 1.0).set_train()
        self._train_optim = TrainOptim(optimizer, self._grad_sum).set_train()
        self._train_clear = TrainClear(self._grad_sum, self._zeros).set_train()

    def run(self, batches, mini_steps):
        """The body of the tutorial's `train_process` over `batches` (no printing); returns the last loss."""
        loss = None
        for k, next_element in enumerate(batches):
            loss = self._train_forward_backward(*next_element)
            if (k + 1) % mini_steps == 0:
                self._train_optim()
                self._train_clear()
        return loss

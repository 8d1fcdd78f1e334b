"""The tutorials' networks: the two of MindSpore's gradient-accumulation documentation, and a character
Transformer for the sequence tutorial; and the networks that memory is measured on (benchmarks/, tests/test_memory.py),
each as a factory (``package.module:function``, see `ms_accum.tools.factory`) that `plan` and `verify` take."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import Normal

from .._validation import check_positive_int, check_value_in
from ..core.losses import TokenCrossEntropy


class LeNet5(nn.Cell):
    r"""
    LeNet5 as in MindSpore's Cell-graph gradient-accumulation tutorial (input 1x32x32).

    Args:
        num_class (int): Number of classes. Default: ``10``.
        num_channel (int): Input channels. Default: ``1``.

    Inputs:
        - **x** (Tensor) - Images of shape :math:`(N, C, 32, 32)`, float32.

    Outputs:
        Tensor of shape :math:`(N, num\_class)`, the logits.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, num_class: int = 10, num_channel: int = 1) -> None:
        super().__init__()
        check_positive_int(num_class, "num_class", "LeNet5")
        check_positive_int(num_channel, "num_channel", "LeNet5")
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * 5 * 5, 120, weight_init=Normal(0.02))
        self.fc2 = nn.Dense(120, 84, weight_init=Normal(0.02))
        self.fc3 = nn.Dense(84, num_class, weight_init=Normal(0.02))
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class MLP(nn.Cell):
    r"""
    The documentation's MNIST network: 784-512-512-10 with ReLU (input 1x28x28).

    Args:
        num_class (int): Number of classes. Default: ``10``.

    Inputs:
        - **x** (Tensor) - Images of shape :math:`(N, 1, 28, 28)`, float32.

    Outputs:
        Tensor of shape :math:`(N, num\_class)`, the logits.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, num_class: int = 10) -> None:
        super().__init__()
        check_positive_int(num_class, "num_class", "MLP")
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 512), nn.ReLU(),
            nn.Dense(512, 512), nn.ReLU(),
            nn.Dense(512, num_class),
        )

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(x))


class CharTransformer(nn.Cell):
    r"""
    A small causal language model from MindSpore's layers: character embedding plus learned positions, causal
    `nn.TransformerEncoderLayer` blocks, a linear head over the characters. The Shakespeare tutorial's model
    (`char_transformer` is its factory).

    Args:
        vocab (int): Number of character ids (the head's classes).
        width (int): Model width. Default: ``64``.
        heads (int): Attention heads per block; must divide `width`. Default: ``4``.
        layers (int): Transformer blocks. Default: ``2``.
        max_len (int): Longest sequence (the learned positions). Default: ``256``.

    Inputs:
        - **tokens** (Tensor) - int32 :math:`(N, L)`, character ids, :math:`L \le max\_len`.

    Outputs:
        Tensor of shape :math:`(N, L, vocab)`, the logits of each position's next character; no position sees a
        later one.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, vocab: int, width: int = 64, heads: int = 4, layers: int = 2, max_len: int = 256) -> None:
        super().__init__()
        for arg_name, value in (("vocab", vocab), ("width", width), ("heads", heads), ("layers", layers),
                                ("max_len", max_len)):
            check_positive_int(value, arg_name, "CharTransformer")
        if width % heads:
            raise ValueError(f"For 'CharTransformer', the argument 'heads' must divide 'width' ({width}), but got "
                             f"{heads}.")
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_len, width)
        self.blocks = nn.CellList([nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
                                   for _ in range(layers)])
        self.head = nn.Dense(width, vocab)

    def construct(self, tokens):
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position(ops.arange(length).astype(ms.int32))
        causal = ops.triu(ops.ones((length, length), ms.float32), 1) * -1e9  # no position sees a later one
        for block in self.blocks:
            x = block(x, src_mask=causal)
        return self.head(x)


class ConvNet(nn.Cell):
    r"""
    An activation-heavy, parameter-light network: four 3x3 convolutions of 32 channels with ReLU, global average
    pooling, a dense head (28,842 parameters). On 3x96x96 images its activations, not its parameters, decide a
    step's memory, which is what accumulation saves (`conv_net` is its factory).

    Args:
        num_class (int): Number of classes. Default: ``10``.
        num_channel (int): Input channels. Default: ``3``.

    Inputs:
        - **x** (Tensor) - Images of shape :math:`(N, C, H, W)`, float32.

    Outputs:
        Tensor of shape :math:`(N, num\_class)`, the logits.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, num_class: int = 10, num_channel: int = 3) -> None:
        super().__init__()
        check_positive_int(num_class, "num_class", "ConvNet")
        check_positive_int(num_channel, "num_channel", "ConvNet")
        layers = []
        for channels in (num_channel, 32, 32, 32):
            layers += [nn.Conv2d(channels, 32, 3), nn.ReLU()]
        self.body = nn.SequentialCell(layers)
        self.head = nn.Dense(32, num_class)

    def construct(self, x):
        return self.head(self.body(x).mean(axis=(2, 3)))


MODELS = {"lenet5": LeNet5, "mlp": MLP}
INPUT_SHAPES = {"lenet5": (1, 32, 32), "mlp": (1, 28, 28)}  # one image, as each model's MNIST pipeline gives it
# The documentation's settings: the Cell-graph tutorial trains LeNet5 with Momentum(0.01, 0.9); the Accumulator
# page trains the MLP with SGD(1e-2).
OPTIMIZER_DEFAULTS = {"lenet5": {"optimizer": "momentum", "lr": 0.01, "momentum": 0.9},
                      "mlp": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.0}}


def make_optimizer(settings: dict, params) -> nn.Optimizer:
    """The optimizer that `settings` (``optimizer``: momentum, sgd or adam; ``lr``; ``momentum``) describes."""
    if settings["optimizer"] == "momentum":
        return nn.Momentum(params, settings["lr"], settings["momentum"])
    if settings["optimizer"] == "sgd":
        return nn.SGD(params, settings["lr"], settings["momentum"])
    return nn.Adam(params, settings["lr"])


def build_model(name: str) -> nn.Cell:
    """Build a model by its name, ``"lenet5"`` or ``"mlp"``.

    Raises:
        ValueError: If `name` is not a known model.
    """
    return MODELS[check_value_in(name, "model", MODELS, "build_model")]()


def factory(name: str):
    """One demo network as a factory returns it (`ms_accum.tools.factory`): the network, the mean cross-entropy, its
    documented optimizer, and ``sample(batch_size)``, random images of its input shape with labels 0-9."""
    network = build_model(name)
    shape = INPUT_SHAPES[name]

    def sample(batch_size: int):
        rng = np.random.default_rng(batch_size)
        return (rng.standard_normal((batch_size, *shape)).astype(np.float32),
                rng.integers(0, 10, (batch_size,)).astype(np.int32))

    return (network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            make_optimizer(OPTIMIZER_DEFAULTS[name], network.trainable_params()), sample)


def lenet5():
    """The factory of ``--model lenet5``."""
    return factory("lenet5")


def mlp():
    """The factory of ``--model mlp``."""
    return factory("mlp")


# ----------------------------------------------------------------------------------- the networks memory is measured on
def _random_sample(inputs, targets):
    """``sample(n)``: `n` random inputs from ``inputs(rng, n)`` and targets from ``targets(rng, n)``, the same for the
    same `n`."""
    def sample(batch_size: int):
        rng = np.random.default_rng(batch_size)
        return inputs(rng, batch_size), targets(rng, batch_size)
    return sample


def conv_net():
    """Factory: `ConvNet` on 3x96x96 images, the mean cross-entropy, SGD(0.01); ``sample(n)``: random images, labels
    0-9. Activations dominate its memory: one step on 32 images costs about twice one on 4."""
    network = ConvNet()
    sample = _random_sample(lambda rng, n: rng.standard_normal((n, 3, 96, 96)).astype(np.float32),
                            lambda rng, n: rng.integers(0, 10, (n,)).astype(np.int32))
    return (network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.SGD(network.trainable_params(), 0.01), sample)


def char_transformer():
    """Factory: the Shakespeare tutorial's `CharTransformer` (65 characters, width 64, 4 heads, 2 blocks) on sequences
    of 256, its longest bucket, with its loss `TokenCrossEntropy` (``reduction="weighted_mean"``) and SGD(0.01);
    ``sample(n)``: random characters, every position a real one."""
    vocab, length = 65, 256
    network = CharTransformer(vocab, 64, 4, 2, length)
    sample = _random_sample(lambda rng, n: rng.integers(0, vocab, (n, length)).astype(np.int32),
                            lambda rng, n: rng.integers(0, vocab, (n, length)).astype(np.int32))
    return network, TokenCrossEntropy(), nn.SGD(network.trainable_params(), 0.01), sample


def wide_mlp():
    """Factory: a parameter-heavy MLP, three Dense(4096, 4096) and a Dense(4096, 10) with ReLU (192 MiB of float32
    parameters, each large weight a third of them), the mean cross-entropy, SGD(0.01) without momentum (no optimizer
    state); ``sample(n)``: random 4096-vectors, labels 0-9. Its gradients, not its activations, decide a step's
    memory: a copy of any one weight's gradient shows."""
    width = 4096
    network = nn.SequentialCell([nn.Dense(width, width), nn.ReLU(), nn.Dense(width, width), nn.ReLU(),
                                 nn.Dense(width, width), nn.ReLU(), nn.Dense(width, 10)])
    sample = _random_sample(lambda rng, n: rng.standard_normal((n, width)).astype(np.float32),
                            lambda rng, n: rng.integers(0, 10, (n,)).astype(np.int32))
    return (network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.SGD(network.trainable_params(), 0.01), sample)

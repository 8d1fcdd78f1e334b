"""The tutorials' networks: the two of MindSpore's gradient-accumulation documentation, and a character
Transformer for the sequence tutorial; and the networks that memory is measured on (benchmarks/, tests/test_memory.py),
each as a factory (``package.module:function``, see `ms_accum.tools.factory`) that `plan` and `verify` take."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import Normal, Uniform, initializer

from .._validation import ArgumentValueError, check_positive_int, check_value_in, door
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

    @door("LeNet5")
    def __init__(self, num_class: int = 10, num_channel: int = 1) -> None:
        super().__init__()
        check_positive_int(num_class, "num_class")
        check_positive_int(num_channel, "num_channel")
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

    @door("MLP")
    def __init__(self, num_class: int = 10) -> None:
        super().__init__()
        check_positive_int(num_class, "num_class")
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
    A small causal language model: character embedding plus learned positions, causal post-norm Transformer blocks
    (`EncoderLayer`, ReLU feed-forward of 4x the width, no dropout), a linear head over the characters. The
    Shakespeare tutorial's model (`char_transformer` is its factory).

    The blocks are written out rather than MindSpore's `nn.TransformerEncoderLayer`, which computes the same but
    holds more memory on CPU (docs/memory.md, `CharTransformer`).

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

    @door("CharTransformer")
    def __init__(self, vocab: int, width: int = 64, heads: int = 4, layers: int = 2, max_len: int = 256) -> None:
        super().__init__()
        for arg_name, value in (("vocab", vocab), ("width", width), ("heads", heads), ("layers", layers),
                                ("max_len", max_len)):
            check_positive_int(value, arg_name)
        _check_heads(width, heads)
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_len, width)
        # nn.TransformerEncoderLayer's settings: ReLU, LayerNorm epsilon 1e-5, no dropout.
        self.blocks = nn.CellList([EncoderLayer(width, heads, 4 * width, dropout=0.0, activation="relu",
                                                epsilon=1e-5) for _ in range(layers)])
        for block in self.blocks:
            # And its initialisation: nn.MultiheadAttention draws its joint (3·width, width) in-projection
            # Xavier-uniform, bound sqrt(6 / (4·width)), with zero biases; the other Dense layers are as nn.Dense's.
            for dense in (block.query, block.key, block.value):
                dense.weight.set_data(initializer(Uniform(float(np.sqrt(1.5 / width))), dense.weight.shape))
                dense.bias.set_data(initializer("zeros", dense.bias.shape))
        self.head = nn.Dense(width, vocab)

    def construct(self, tokens):
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position(ops.arange(length).astype(ms.int32))
        causal = ops.triu(ops.ones((length, length), ms.float32), 1) * -1e9  # no position sees a later one
        for block in self.blocks:
            x = block(x, causal)
        return self.head(x)


def _check_heads(width: int, heads: int) -> None:
    if width % heads:
        raise ArgumentValueError("{@heads:subject} must divide {@width} ({width}), but got {heads}.", width=width,
                                 heads=heads)


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

    @door("ConvNet")
    def __init__(self, num_class: int = 10, num_channel: int = 3) -> None:
        super().__init__()
        check_positive_int(num_class, "num_class")
        check_positive_int(num_channel, "num_channel")
        self.body = nn.SequentialCell([cell for channels in (num_channel, 32, 32, 32)
                                       for cell in (nn.Conv2d(channels, 32, 3), nn.ReLU())])
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
    """The optimizer that `settings` (``optimizer``: momentum, sgd or adam; ``lr``, a rate or a list of one per step,
    as MindSpore's optimizers take it; ``momentum``) describes."""
    if settings["optimizer"] == "momentum":
        return nn.Momentum(params, settings["lr"], settings["momentum"])
    if settings["optimizer"] == "sgd":
        return nn.SGD(params, settings["lr"], settings["momentum"])
    return nn.Adam(params, settings["lr"])


@door("build_model")
def build_model(name: str) -> nn.Cell:
    """Build a model by its name, ``"lenet5"`` or ``"mlp"``.

    Raises:
        ValueError: If `name` is not a known model.
    """
    return MODELS[check_value_in(name, "model", MODELS)]()


def _random_sample(inputs, targets):
    """``sample(n)``: `n` random inputs from ``inputs(rng, n)`` and targets from ``targets(rng, n)``, the same for the
    same `n`."""
    def sample(batch_size: int):
        rng = np.random.default_rng(batch_size)
        return inputs(rng, batch_size), targets(rng, batch_size)
    return sample


def _classifier(network: nn.Cell, optimizer: nn.Optimizer, shape: tuple) -> tuple:
    """What a factory of a classifier returns: `network`, the mean cross-entropy, `optimizer`, and ``sample(n)``:
    random normal inputs of `shape`, labels 0-9."""
    sample = _random_sample(lambda rng, n: rng.standard_normal((n, *shape)).astype(np.float32),
                            lambda rng, n: rng.integers(0, 10, (n,)).astype(np.int32))
    return network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), optimizer, sample


def factory(name: str):
    """One demo network as a factory returns it (`ms_accum.tools.factory`): the network, the mean cross-entropy, its
    documented optimizer, and ``sample(batch_size)``, random images of its input shape with labels 0-9."""
    network = build_model(name)
    optimizer = make_optimizer(OPTIMIZER_DEFAULTS[name], network.trainable_params())
    return _classifier(network, optimizer, INPUT_SHAPES[name])


def lenet5():
    """The factory of ``--model lenet5``."""
    return factory("lenet5")


def mlp():
    """The factory of ``--model mlp``."""
    return factory("mlp")


# ----------------------------------------------------------------------------------- the networks memory is measured on
def conv_net():
    """Factory: `ConvNet` on 3x96x96 images, the mean cross-entropy, SGD(0.01); ``sample(n)``: random images, labels
    0-9. Activations dominate its memory: one step on 32 images costs about twice one on 4."""
    network = ConvNet()
    return _classifier(network, nn.SGD(network.trainable_params(), 0.01), (3, 96, 96))


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
    return _classifier(network, nn.SGD(network.trainable_params(), 0.01), (width,))


# ------------------------------------------------------------------------------- real-size networks (benchmarks/)
class EncoderLayer(nn.Cell):
    r"""
    A post-norm Transformer encoder layer written out from MindSpore's basic layers, as BERT's: Dense query, key and
    value, scaled dot-product attention with `ops.matmul` and softmax, an output Dense, a GELU feed-forward block,
    a LayerNorm after each residual sum, dropout on the attention weights and on each block's output.

    MindSpore's own `nn.TransformerEncoderLayer` computes the same but, on CPU, held many times the memory: 4 layers
    of width 768 at sequence 512 were killed above 24 GB where these layers took 1.6 GB (docs/memory.md).

    Args:
        width (int): Model width.
        heads (int): Attention heads; must divide `width`.
        ffn (int): Width of the feed-forward block.
        dropout (float): Dropout probability. Default: ``0.1``.
        activation (str): ``"gelu"`` (BERT's, exact) or ``"relu"``. Default: ``"gelu"``.
        epsilon (float): LayerNorm's epsilon. Default: ``1e-12`` (BERT's).

    Inputs:
        - **x** (Tensor) - float32 :math:`(N, L, width)`.
        - **mask** (Tensor) - float32, added to the attention scores, broadcastable to :math:`(N, heads, L, L)`
          (``-1e9`` where a position must not see another), or None.

    Outputs:
        Tensor of shape :math:`(N, L, width)`.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    @door("EncoderLayer")
    def __init__(self, width: int, heads: int, ffn: int, dropout: float = 0.1, activation: str = "gelu",
                 epsilon: float = 1e-12) -> None:
        super().__init__()
        for arg_name, value in (("width", width), ("heads", heads), ("ffn", ffn)):
            check_positive_int(value, arg_name)
        _check_heads(width, heads)
        check_value_in(activation, "activation", ("gelu", "relu"))
        self.heads, self.head_width = heads, width // heads
        self.scale = 1.0 / float(np.sqrt(self.head_width))
        self.query, self.key, self.value = nn.Dense(width, width), nn.Dense(width, width), nn.Dense(width, width)
        self.output = nn.Dense(width, width)
        self.ffn_in, self.ffn_out = nn.Dense(width, ffn), nn.Dense(ffn, width)
        self.activation = nn.GELU(approximate=False) if activation == "gelu" else nn.ReLU()
        self.attention_norm = nn.LayerNorm((width,), epsilon=epsilon)
        self.ffn_norm = nn.LayerNorm((width,), epsilon=epsilon)
        self.attention_dropout = nn.Dropout(p=dropout)
        self.dropout = nn.Dropout(p=dropout)

    def _split(self, x, batch, length):
        return ops.transpose(ops.reshape(x, (batch, length, self.heads, self.head_width)), (0, 2, 1, 3))

    def construct(self, x, mask=None):
        batch, length, width = x.shape
        query = self._split(self.query(x), batch, length)
        key = self._split(self.key(x), batch, length)
        value = self._split(self.value(x), batch, length)
        scores = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2))) * self.scale
        if mask is not None:
            scores = scores + mask
        weights = self.attention_dropout(ops.softmax(scores, -1))
        context = ops.reshape(ops.transpose(ops.matmul(weights, value), (0, 2, 1, 3)), (batch, length, width))
        x = self.attention_norm(x + self.dropout(self.output(context)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.activation(self.ffn_in(x)))))


class Encoder(nn.Cell):
    r"""
    A BERT-shaped classifier: token and position embeddings with LayerNorm and dropout, `layers` `EncoderLayer`s,
    BERT's pooler (Dense and tanh on the first position) and a Dense head. With the defaults (BERT-base: vocabulary
    30,522, width 768, 12 heads, 12 layers, positions up to 512) it holds 109.5 million float32 parameters, 418 MiB.

    Args:
        vocab (int): Token ids. Default: ``30522``.
        width (int): Model width. Default: ``768``.
        heads (int): Attention heads. Default: ``12``.
        layers (int): Encoder layers. Default: ``12``.
        max_len (int): Longest sequence. Default: ``512``.
        num_class (int): Classes of the head. Default: ``2``.
        dropout (float): Dropout probability. Default: ``0.1``.

    Inputs:
        - **tokens** (Tensor) - int32 :math:`(N, L)`, :math:`L \le max\_len`.

    Outputs:
        Tensor of shape :math:`(N, num\_class)`, the logits.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    @door("Encoder")
    def __init__(self, vocab: int = 30522, width: int = 768, heads: int = 12, layers: int = 12, max_len: int = 512,
                 num_class: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        for arg_name, value in (("vocab", vocab), ("layers", layers), ("max_len", max_len), ("num_class", num_class)):
            check_positive_int(value, arg_name)
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_len, width)
        self.norm = nn.LayerNorm((width,), epsilon=1e-12)
        self.dropout = nn.Dropout(p=dropout)
        self.blocks = nn.CellList([EncoderLayer(width, heads, 4 * width, dropout) for _ in range(layers)])
        self.pooler = nn.Dense(width, width, activation="tanh")
        self.head = nn.Dense(width, num_class)

    def construct(self, tokens):
        x = self.embed(tokens) + self.position(ops.arange(tokens.shape[1]).astype(ms.int32))
        x = self.dropout(self.norm(x))
        for block in self.blocks:
            x = block(x)
        return self.head(self.pooler(x[:, 0]))


REAL_SIZE_OPTIMIZERS = ("sgd", "momentum", "adamw")


@door("real_size_optimizer")
def real_size_optimizer(name: str, params) -> nn.Optimizer:
    """``"sgd"`` (no state), ``"momentum"`` (one state tensor per parameter) or ``"adamw"`` (two) on `params`:
    the optimizers the real-size memory figures compare (benchmarks/memory.py)."""
    check_value_in(name, "optimizer", REAL_SIZE_OPTIMIZERS)
    if name == "sgd":
        return nn.SGD(params, 0.01)
    if name == "momentum":
        return nn.Momentum(params, 0.01, 0.9)
    return nn.AdamWeightDecay(params, 1e-4, weight_decay=0.01)


@door("deep_mlp")
def deep_mlp(optimizer: str = "sgd", layers: int = 12, width: int = 2048):
    """Factory: a parameter-heavy MLP, `layers` Dense(`width`, `width`) with ReLU and a Dense(`width`, 10) head (the
    defaults: 192 MiB of float32 parameters in 12 tensors of 16 MiB), the mean cross-entropy and `optimizer` (see
    `real_size_optimizer`); ``sample(n)``: random `width`-vectors, labels 0-9. Its gradients, not its activations,
    decide a step's memory."""
    check_positive_int(layers, "layers")
    check_positive_int(width, "width")
    network = nn.SequentialCell([cell for _ in range(layers) for cell in (nn.Dense(width, width), nn.ReLU())]
                                + [nn.Dense(width, 10)])
    return _classifier(network, real_size_optimizer(optimizer, network.trainable_params()), (width,))


@door("encoder")
def encoder(optimizer: str = "adamw", layers: int = 12, seq: int = 512, width: int = 768, vocab: int = 30522):
    """Factory: the BERT-shaped `Encoder` (BERT-base with the defaults: 418 MiB of parameters) on sequences of `seq`
    tokens, a two-class head, the mean cross-entropy and `optimizer` (see `real_size_optimizer`); ``sample(n)``:
    random token ids and labels."""
    check_positive_int(seq, "seq")
    network = Encoder(vocab, width, max(1, width // 64), layers, seq)
    sample = _random_sample(lambda rng, n: rng.integers(0, vocab, (n, seq)).astype(np.int32),
                            lambda rng, n: rng.integers(0, 2, (n,)).astype(np.int32))
    return (network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            real_size_optimizer(optimizer, network.trainable_params()), sample)

"""Small contrastive models and losses for the gradient-caching tests (test_cached.py, cached_worker.py).

- `TwoTower`: a query tower and a document tower (separate weights) over a (B, 2, 8) pair, returning ``(q, d)``;
  with ``dropout`` each tower ends in an `nn.Dropout`, so a zero in its output is a dropped unit (its mask).
- `InfoNCE`: in-batch negatives both ways (CLIP's symmetric loss) over ``q d^T / t``.
- `SupCon`: the supervised contrastive loss (Khosla et al. 2020) over `Encoder`'s normalized embeddings.
"""
import numpy as np
import mindspore as ms
from mindspore import nn, ops

TEMPERATURE = 0.5


class Tower(nn.Cell):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.hidden = nn.Dense(8, 16)
        self.out = nn.Dense(16, 4)
        self.dropout = nn.Dropout(p=dropout) if dropout else None

    def construct(self, x):
        y = self.out(ops.tanh(self.hidden(x)))
        if self.dropout is not None:
            y = self.dropout(y)
        return y


class TwoTower(nn.Cell):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.query = Tower(dropout)
        self.doc = Tower(dropout)

    def construct(self, pairs):
        return self.query(pairs[:, 0]), self.doc(pairs[:, 1])


class MaskedTwoTower(nn.Cell):
    """`TwoTower` with given dropout masks: input (B, 2, 8 + 4), the pair and its two towers' masks."""

    def __init__(self, keep: float) -> None:
        super().__init__()
        self.query = Tower()
        self.doc = Tower()
        self.scale = 1.0 / keep

    def construct(self, pairs):
        x, mask = pairs[:, :, :8], pairs[:, :, 8:]
        return self.query(x[:, 0]) * mask[:, 0] * self.scale, self.doc(x[:, 1]) * mask[:, 1] * self.scale


class InfoNCE(nn.Cell):
    """In-batch negatives, both ways as CLIP's loss: each query against every document and each document against every
    query; the labels are not used (a pair's positive is its own partner). One way only, shifting every document by
    one vector would not change the loss, so the document tower's last bias would get a gradient of pure rounding,
    which AdamW turns into full steps (conftest.make_optimizer)."""

    def __init__(self) -> None:
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, outputs, labels):
        q, d = outputs
        logits = ops.matmul(q, d.T) / TEMPERATURE
        targets = ops.arange(ops.shape(q)[0]).astype(ms.int32)
        return (self.ce(logits, targets) + self.ce(logits.T, targets)) / 2


class Encoder(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Dense(8, 16)
        self.out = nn.Dense(16, 4)

    def construct(self, x):
        return self.out(ops.tanh(self.hidden(x)))


class SupCon(nn.Cell):
    """Supervised contrastive: each anchor against all others, its positives those of its class."""

    def construct(self, emb, labels):
        z = emb / ops.sqrt((emb * emb).sum(1, keepdims=True) + 1e-12)
        n = ops.shape(z)[0]
        eye = ops.eye(n, n, ms.float32)
        logits = ops.matmul(z, z.T) / TEMPERATURE - eye * 1e4  # no anchor is its own negative
        log_prob = logits - ops.logsumexp(logits, 1, True)
        positives = ops.cast(ops.expand_dims(labels, 1) == ops.expand_dims(labels, 0), ms.float32) * (1.0 - eye)
        per_anchor = (positives * log_prob).sum(1) / ops.maximum(positives.sum(1), 1.0)
        return -per_anchor.mean()


def pairs(n: int, seed: int = 0):
    """n (query, document) pairs, a document a noisy copy of its query; labels: the pair's index (unused)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, 8)).astype(np.float32)
    d = q + 0.3 * rng.standard_normal((n, 8)).astype(np.float32)
    return np.stack([q, d], 1), np.arange(n, dtype=np.int32)


def classes(n: int, seed: int = 0):
    """n samples of 4 classes around 4 centres."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n).astype(np.int32)
    centres = rng.standard_normal((4, 8)).astype(np.float32)
    return (centres[labels] + 0.5 * rng.standard_normal((n, 8))).astype(np.float32), labels


KINDS = {"infonce": (TwoTower, InfoNCE, pairs), "supcon": (Encoder, SupCon, classes)}


def build(kind: str, seed: int = 0, **kwargs):
    """(network, loss, data maker) of `kind`, the network's weights fixed by `seed`."""
    net_cls, loss_cls, data = KINDS[kind]
    ms.set_seed(seed)
    return net_cls(**kwargs), loss_cls(), data

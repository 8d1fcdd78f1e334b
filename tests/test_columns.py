"""Batches of any number of columns: the first go to the network, the last to the loss (`ms_accum.core.columns`);
a network that computes its own loss takes them all. Exact against one step on the concatenated window."""
import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops

from ms_accum import GradientAccumulation
from ms_accum.core.columns import WithLossColumns, label_columns
from ms_accum.train.options import QUIET, WindowOptions
from conftest import copy_weights, raises_exactly

B, K, VOCAB, SEQ = 4, 4, 50, 6


class ThreeInputs(nn.Cell):
    """A BERT-shaped classifier's inputs: token ids, attention mask, token types."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, 8)
        self.types = nn.Embedding(2, 8)
        self.head = nn.Dense(8, 3)

    def construct(self, input_ids, attention_mask, token_type_ids):
        hidden = self.tokens(input_ids) + self.types(token_type_ids)
        mask = ops.expand_dims(attention_mask.astype(ms.float32), -1)
        return self.head((hidden * mask).sum(axis=1) / mask.sum(axis=1))


class OwnLoss(nn.Cell):
    """An HF-style model: it takes the labels too and returns its loss."""

    def __init__(self):
        super().__init__()
        self.model = ThreeInputs()
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, input_ids, attention_mask, token_type_ids, labels):
        return self.loss(self.model(input_ids, attention_mask, token_type_ids), labels)


def columns(n):
    rng = np.random.default_rng(0)
    mask = np.ones((n, SEQ), np.int32)
    mask[:, SEQ // 2:] = rng.integers(0, 2, (n, SEQ - SEQ // 2))
    return {"input_ids": rng.integers(0, VOCAB, (n, SEQ)).astype(np.int32), "attention_mask": mask,
            "token_type_ids": rng.integers(0, 2, (n, SEQ)).astype(np.int32),
            "label": rng.integers(0, 3, n).astype(np.int32)}


def large_batch_steps(net_with_loss, optimizer, data, windows):
    step = nn.TrainOneStepCell(net_with_loss, optimizer).set_train()
    for w in range(windows):
        step(*[Tensor(v[w * K * B:(w + 1) * K * B]) for v in data.values()])


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


@pytest.mark.parametrize("structure", ["three_graphs", pytest.param("fused", marks=pytest.mark.slow),
                                       pytest.param("window", marks=pytest.mark.slow),
                                       pytest.param("cached", marks=pytest.mark.slow)])
def test_a_three_input_network_equals_one_step_on_the_concatenated_window(structure):
    data = columns(2 * K * B)
    ms.set_seed(0)
    ours, reference = ThreeInputs(), ThreeInputs()
    copy_weights(ours, reference)
    executor = GradientAccumulation(ours, loss_fn(), nn.Adam(ours.trainable_params(), 1e-2), structure=structure)
    dataset = ds.NumpySlicesDataset(data, shuffle=False).batch(B)
    executor.train_process(1, dataset, K, checkpoints=None, log=QUIET)
    large_batch_steps(WithLossColumns(reference, loss_fn()),
                      nn.Adam(reference.trainable_params(), 1e-2), data, 2)
    for a, b in zip(ours.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)


def test_a_network_that_computes_its_own_loss_takes_every_column():
    data = columns(2 * K * B)
    ms.set_seed(0)
    ours, reference = OwnLoss(), OwnLoss()
    copy_weights(ours, reference)
    executor = GradientAccumulation(ours, None, nn.SGD(ours.trainable_params(), 0.5))
    dataset = ds.NumpySlicesDataset(data, shuffle=False).batch(B)
    result = executor.train_process(1, dataset, K, checkpoints=None, log=QUIET)
    assert len(result.steps) == 2 and all(np.isfinite(result.losses))
    large_batch_steps(reference, nn.SGD(reference.trainable_params(), 0.5), data, 2)
    for a, b in zip(ours.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)


class TwoLabels(nn.Cell):
    """A loss of two label columns: the classes and a per-sample weight."""

    def construct(self, logits, labels, weights):
        per_sample = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")(logits, labels)
        return (per_sample * weights).mean()


def test_the_labels_a_loss_takes_are_the_last_columns():
    assert label_columns(loss_fn()) == 1 and label_columns(TwoLabels()) == 2
    data = columns(K * B)
    data["weight"] = np.linspace(0.5, 1.5, K * B).astype(np.float32)
    ms.set_seed(0)
    ours, reference = ThreeInputs(), ThreeInputs()
    copy_weights(ours, reference)
    executor = GradientAccumulation(ours, TwoLabels(), nn.SGD(ours.trainable_params(), 0.5))
    executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(B), K, checkpoints=None, log=QUIET)
    large_batch_steps(WithLossColumns(reference, TwoLabels(), 2), nn.SGD(reference.trainable_params(), 0.5), data, 1)
    for a, b in zip(ours.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)


def test_columns_that_cannot_feed_the_network_are_refused_before_compiling():
    net = ThreeInputs()
    executor = GradientAccumulation(net, loss_fn(), nn.SGD(net.trainable_params(), 0.1))
    data = columns(8)
    data.pop("token_type_ids")
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'train_dataset' must "
                                    "yield the columns of the network's 3 input(s), then the loss's 1 label(s), but it "
                                    "yields 3: ['input_ids', 'attention_mask', 'label']."):
        executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(B), K, checkpoints=None, log=QUIET)
    own = OwnLoss()
    executor = GradientAccumulation(own, None, nn.SGD(own.trainable_params(), 0.1))
    with raises_exactly(ValueError, "For 'GradientAccumulation.train_process', the argument 'train_dataset' must "
                                    "yield the columns of the network's 4 input(s) (it computes its own loss), but it "
                                    "yields 3: ['input_ids', 'attention_mask', 'label']."):
        executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(B), K, checkpoints=None, log=QUIET)
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'loss_fn' must be the loss of the whole "
                                    "window's outputs with structure='cached', but got None: gradient caching runs the "
                                    "loss apart from the network."):
        GradientAccumulation(own, None, nn.SGD(own.trainable_params(), 0.1), structure="cached")


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_verify_equivalence_takes_batches_of_any_number_of_columns():
    # verify_equivalence splits every column alike: three inputs and a label, two labels, or a network with its loss.
    from ms_accum import verify_equivalence
    data = list(columns(K * B).values())
    net = ThreeInputs()
    assert verify_equivalence(net, loss_fn(), nn.SGD(net.trainable_params(), 0.5), data, K).passed
    weights = np.linspace(0.5, 1.5, K * B).astype(np.float32)
    assert verify_equivalence(net, TwoLabels(), nn.SGD(net.trainable_params(), 0.5), data + [weights], K).passed
    own = OwnLoss()
    report = verify_equivalence(own, None, nn.SGD(own.trainable_params(), 0.5), data, K)
    assert report.passed and report.max_abs_diff < 1e-6, str(report)
    with raises_exactly(ValueError, "For 'verify_equivalence', the argument 'inputs' must yield the columns of the "
                                    "network's 4 input(s) (it computes its own loss), but it yields 3: [(16, 6), "
                                    "(16, 6), (16,)]."):
        verify_equivalence(own, None, nn.SGD(own.trainable_params(), 0.5), [data[0], data[1], data[3]], K)


class Tagger(nn.Cell):
    """A tagger of two inputs, token ids and their types: a class per position."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, 8)
        self.types = nn.Embedding(2, 8)
        self.head = nn.Dense(8, 5)

    def construct(self, input_ids, token_type_ids):
        return self.head(self.tokens(input_ids) + self.types(token_type_ids))


@pytest.mark.parametrize("structure", ["three_graphs", pytest.param("fused", marks=pytest.mark.slow)])
def test_a_token_weighted_loss_takes_its_label_column_after_several_inputs(structure):
    # TokenCrossEntropy returns (loss, tokens): micro-batches of 1 to SEQ real tokens weigh by their tokens, and the
    # window equals one step on the concatenated batch whose loss is the mean over all its real tokens.
    from ms_accum import TokenCrossEntropy
    from ms_accum.core.losses import LossOnly
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 5, (K * B, SEQ)).astype(np.int32)
    for i, real in enumerate(rng.integers(1, SEQ + 1, K * B)):
        targets[i, real:] = -100  # padding
    data = {"input_ids": rng.integers(0, VOCAB, (K * B, SEQ)).astype(np.int32),
            "token_type_ids": rng.integers(0, 2, (K * B, SEQ)).astype(np.int32), "targets": targets}
    ms.set_seed(0)
    ours, reference = Tagger(), Tagger()
    copy_weights(ours, reference)
    executor = GradientAccumulation(ours, TokenCrossEntropy(), nn.SGD(ours.trainable_params(), 0.5),
                                    structure=structure, window=WindowOptions(reduction="weighted_mean"))
    executor.train_process(1, ds.NumpySlicesDataset(data, shuffle=False).batch(B), K, checkpoints=None, log=QUIET)
    large_batch_steps(LossOnly(WithLossColumns(reference, TokenCrossEntropy())),
                      nn.SGD(reference.trainable_params(), 0.5), data, 1)
    for a, b in zip(ours.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)

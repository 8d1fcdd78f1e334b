"""Sparse gradients: an `nn.EmbeddingLookup(sparse=True)` model trains with accumulation like a big batch.

The embedding's gradient is a RowTensor (MindSpore's IndexedSlices: looked-up rows plus their indices); the
Cells and the Accumulator sum it into their dense buffer (`_ops._accumulate_row_tensor`).

The big-batch reference cannot be the sparse model itself: on CPU `nn.TrainOneStepCell` with `nn.SGD` or
`nn.Momentum` and a RowTensor gradient fails at run time (RuntimeError: "The pointer[input_kernel_tensor] is
null.", measured). It is the same model with the table read by a plain Gather (dense gradient), loaded with the
same initial weights and trained with the same optimizer on the concatenated window.

Graph mode only: in PyNative, MindSpore 2.10 hands back the embedding's gradient as its values alone, a
(B*T, dim) Tensor with the row indices lost, so nothing can apply it (`nn.TrainOneStepCell` + Adam fails with
"the var_shape: [50,8,] must be equal to [96,8,]"; the accumulator's `assign_add` with a shape mismatch).
"""
import functools

import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import initializer

from ms_accum import Accumulator, GradientAccumulation
from ms_accum.graphs import TrainAccumulationCell
from accumulator_step import accumulator_step
from conftest import copy_weights, make_optimizer, params_of, raises_exactly

VOCAB, DIM, CLASSES, TOKENS = 50, 8, 5, 6
SEEN = 40  # token ids are drawn below this: embedding rows SEEN..VOCAB-1 are never looked up
K, B, WINDOWS = 4, 4, 3


class GatherEmbedding(nn.Cell):
    """The table of `nn.EmbeddingLookup`, read by a plain Gather: its gradient is a dense Tensor."""

    def __init__(self):
        super().__init__()
        self.embedding_table = Parameter(initializer("normal", (VOCAB, DIM)), name="embedding_table")

    def construct(self, ids):
        return ops.gather(self.embedding_table, ids, 0)


class BagOfEmbeddings(nn.Cell):
    """Token ids (B, T) -> embeddings -> mean over the tokens -> Dense -> class logits."""

    def __init__(self, sparse: bool = True):
        super().__init__()
        self.embedding = nn.EmbeddingLookup(VOCAB, DIM, sparse=True) if sparse else GatherEmbedding()
        self.dense = nn.Dense(DIM, CLASSES)

    def construct(self, ids):
        return self.dense(self.embedding(ids).mean(axis=1))


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def sparse_and_dense_twin(seed: int = 0):
    ms.set_seed(seed)
    sparse = BagOfEmbeddings(sparse=True)
    dense = BagOfEmbeddings(sparse=False)
    copy_weights(sparse, dense)  # same parameter names, so the twin starts from identical weights
    return sparse, dense


def token_batches(n: int = K * B * WINDOWS, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, SEEN, (n, TOKENS)).astype(np.int32), rng.integers(0, CLASSES, (n,)).astype(np.int32)


def big_batch_reference(net, optimizer_name, ids, labels, windows=WINDOWS):
    """One TrainOneStepCell step per window, on the window's K*B samples concatenated."""
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn()), make_optimizer(optimizer_name, net.trainable_params()))
    step.set_train()
    for w in range(windows):
        window = slice(w * K * B, (w + 1) * K * B)
        step(Tensor(ids[window]), Tensor(labels[window]))
    return params_of(net)


@functools.lru_cache(maxsize=None)
def dense_reference(optimizer_name):
    """`big_batch_reference` of the dense twin on `token_batches()`, once per optimizer for the Cell, the executor and
    the Accumulator compared with it; nothing mutates the returned arrays."""
    ids, labels = token_batches()
    _, dense = sparse_and_dense_twin()
    return big_batch_reference(dense, optimizer_name, ids, labels)


def assert_matches(actual, expected):
    # Not bitwise: the big batch's mean over K*B samples and the window's mean of K micro-batch gradients add
    # the same float32 terms in a different order (measured differences <= 3e-8).
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)


def micro_batch(ids, labels, i):
    return Tensor(ids[i * B:(i + 1) * B]), Tensor(labels[i * B:(i + 1) * B])


def test_embedding_gradient_is_a_row_tensor():
    # Guards the tests below: they must exercise the RowTensor path, not a dense gradient. A RowTensor leaves
    # a graph as (indices, values, dense_shape), one row per looked-up token, duplicates not merged.
    net, _ = sparse_and_dense_twin()
    ids, labels = token_batches(B)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss_fn()), None, net.trainable_params())

    @ms.jit
    def grads_of(x, y):
        return grad_fn(x, y)[1]

    indices, values, dense_shape = grads_of(Tensor(ids), Tensor(labels))[0]
    assert tuple(dense_shape) == (VOCAB, DIM)
    assert values.shape == (B * TOKENS, DIM)
    np.testing.assert_array_equal(np.sort(indices.asnumpy()), np.sort(ids.ravel()))


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_fused_cell_matches_big_batch(optimizer):
    ids, labels = token_batches()
    sparse, _ = sparse_and_dense_twin()
    expected = dense_reference(optimizer)

    cell = TrainAccumulationCell(nn.WithLossCell(sparse, loss_fn()),
                                 make_optimizer(optimizer, sparse.trainable_params()), K)
    cell.set_train()
    for i in range(K * WINDOWS):
        before = params_of(sparse)
        cell(*micro_batch(ids, labels, i))
        if (i + 1) % K:  # inside a window nothing moves
            for a, e in zip(params_of(sparse), before):
                np.testing.assert_array_equal(a, e)
    assert_matches(params_of(sparse), expected)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("structure", [pytest.param("fused", marks=pytest.mark.slow), "three_graphs"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_executor_matches_big_batch(optimizer, structure):
    ids, labels = token_batches()
    sparse, _ = sparse_and_dense_twin()
    expected = dense_reference(optimizer)

    executor = GradientAccumulation(sparse, loss_fn(), make_optimizer(optimizer, sparse.trainable_params()),
                                    structure=structure)
    dataset = ds.NumpySlicesDataset({"ids": ids, "label": labels}, shuffle=False).batch(B)
    result = executor.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False)
    assert [r.samples for r in result.steps] == [K * B] * WINDOWS
    assert_matches(params_of(sparse), expected)


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_accumulator_matches_big_batch(optimizer):
    ids, labels = token_batches()
    sparse, _ = sparse_and_dense_twin()
    expected = dense_reference(optimizer)

    accumulator = Accumulator(make_optimizer(optimizer, sparse.trainable_params()), K)
    train_step = accumulator_step(sparse, loss_fn(), accumulator)
    for i in range(K * WINDOWS):
        train_step(*micro_batch(ids, labels, i))
    assert_matches(params_of(sparse), expected)


def test_rows_never_looked_up_get_zero_gradient_and_do_not_move():
    ids, labels = token_batches(K * B, seed=1)
    net, _ = sparse_and_dense_twin()
    table = net.embedding.embedding_table
    before = table.asnumpy().copy()
    cell = TrainAccumulationCell(nn.WithLossCell(net, loss_fn()), nn.SGD(net.trainable_params(), 0.1), K)
    cell.set_train()

    for i in range(K - 1):
        cell(*micro_batch(ids, labels, i))
    buffer = cell.buffer.grad_sum[0].asnumpy()  # the table's buffer, densified from K-1 RowTensors
    seen = np.unique(ids[:(K - 1) * B])
    unseen = np.setdiff1d(np.arange(VOCAB), seen)
    assert len(unseen) >= VOCAB - SEEN
    assert not buffer[unseen].any()
    assert buffer[seen].any(axis=1).all()

    cell(*micro_batch(ids, labels, K - 1))  # closes the window: plain SGD, no momentum, no weight decay
    after = table.asnumpy()
    seen = np.unique(ids)
    unseen = np.setdiff1d(np.arange(VOCAB), seen)
    np.testing.assert_array_equal(after[unseen], before[unseen])
    assert (after[seen] != before[seen]).any(axis=1).all()


def test_sparse_aware_optimizer_gets_the_dense_window_gradient():
    # The window's gradient leaves the dense buffer as a dense Tensor, so a sparse-aware optimizer takes its
    # dense path: LazyAdam then updates every row like Adam (moments of rows absent from the window decay and
    # those rows keep moving), equal to LazyAdam on the dense twin's big batch, not to LazyAdam's lazy update
    # of a sparse big batch. Likewise (measured, not tested here) FTRL's dense update sets rows that were never
    # looked up to zero, where its sparse update leaves them alone.
    rng = np.random.default_rng(2)
    ids = np.concatenate([rng.integers(0, 20, (K * B, TOKENS)),  # window 1 looks up rows 0..19 only,
                          rng.integers(20, SEEN, (K * B, TOKENS))]).astype(np.int32)  # window 2 rows 20..39
    labels = rng.integers(0, CLASSES, (2 * K * B,)).astype(np.int32)
    sparse, dense = sparse_and_dense_twin()
    reference = nn.TrainOneStepCell(nn.WithLossCell(dense, loss_fn()), nn.LazyAdam(dense.trainable_params(), 1e-2,
                                                                                    eps=1e-6))
    reference.set_train()
    cell = TrainAccumulationCell(nn.WithLossCell(sparse, loss_fn()),
                                 nn.LazyAdam(sparse.trainable_params(), 1e-2, eps=1e-6), K)
    cell.set_train()
    for w in range(2):
        window = slice(w * K * B, (w + 1) * K * B)
        reference(Tensor(ids[window]), Tensor(labels[window]))
        if w == 1:
            after_window_1 = sparse.embedding.embedding_table.asnumpy().copy()
        for i in range(w * K, (w + 1) * K):
            cell(*micro_batch(ids, labels, i))
    assert_matches(params_of(sparse), params_of(dense))
    rows_of_window_1 = slice(0, 20)
    moved = sparse.embedding.embedding_table.asnumpy()[rows_of_window_1] != after_window_1[rows_of_window_1]
    assert moved.any(axis=1).all()  # absent from window 2, yet every one of them moved in it


def test_skip_microbatch_is_refused_for_sparse_gradients_before_compiling():
    sparse, _ = sparse_and_dense_twin()
    # The executor's name and the user's own path of the cell, not those of the Cells the executor builds.
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'policy' must be 'skip_window' for a "
                                    "network with sparse gradients (its cell 'embedding'), but got 'skip_microbatch': "
                                    "MindSpore 2.10 cannot check sparse gradients one micro-batch at a time."):
        GradientAccumulation(sparse, loss_fn(), make_optimizer("momentum", sparse.trainable_params()),
                             policy="skip_microbatch")
    with raises_exactly(ValueError, "For 'GradientAccumulation', the argument 'skip_outliers' must be None for a "
                                    "network with sparse gradients (its cell 'embedding'): MindSpore 2.10 cannot leave "
                                    "sparse gradients out one micro-batch at a time."):
        GradientAccumulation(sparse, loss_fn(), make_optimizer("momentum", sparse.trainable_params()),
                             skip_outliers=6.0)


def test_statistics_of_sparse_gradients_equal_the_dense_twins():
    # A micro-batch's RowTensor is summed as its dense gradient. Its per-tensor sums are added one by one
    # (`_ops.SparseGradsNorm`): AddN refuses a HyperMap's outputs with a RowTensor among them (undetermined types).
    ids, labels = token_batches()
    norms = []
    for net in sparse_and_dense_twin():
        executor = GradientAccumulation(net, loss_fn(), make_optimizer("momentum", net.trainable_params()),
                                        structure="three_graphs", statistics=True)
        dataset = ds.NumpySlicesDataset({"ids": ids, "label": labels}, shuffle=False).batch(B)
        steps = executor.train_process(1, dataset, mini_steps=K, ckpt_dir=None, verbose=False).steps
        norms.append([(s.micro_batch_grad_norms, s.grad_norm) for s in steps])
    (sparse, dense) = norms
    assert len(sparse) == WINDOWS and all(len(micro) == K and window > 0 for micro, window in sparse)
    for (micro_s, window_s), (micro_d, window_d) in zip(sparse, dense):
        np.testing.assert_allclose(micro_s, micro_d, rtol=1e-6)
        np.testing.assert_allclose(window_s, window_d, rtol=1e-6)

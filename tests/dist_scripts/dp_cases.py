"""What the distributed workers and the single-process reference share: the cases, the network, the data.

Every case splits each global micro-batch between the ranks by `sizes` (rank r takes `sizes[r]` samples), so
the single-process reference trains on exactly the concatenation of what the ranks saw.
"""
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from ms_accum import TokenCrossEntropy

IN, HIDDEN, OUT = 20, 32, 5
T, PAD = 6, -100  # token cases: sequences of up to T positions, padding targets PAD

# name -> settings. `micro` is the number of micro-batches per rank; with micro % k != 0 the run ends with a
# partial window (the executor applies it, the Accumulator case calls flush()). `sizes` are the ranks'
# micro-batch sizes: unequal ones prove the exact sample weighting across ranks.
CASES = {
    "fused_unequal": dict(api="cell", k=4, micro=8, sizes=(3, 5), optimizer="momentum", reduction="mean",
                          clip_norm=None),
    "fused_sum_clip": dict(api="cell", k=2, micro=4, sizes=(4, 4), optimizer="sgd", reduction="sum",
                           clip_norm=0.5),
    "accumulator_unequal_clip": dict(api="accumulator", k=2, micro=5, sizes=(1, 3), optimizer="momentum",
                                     reduction="mean", clip_norm=0.5),
    "executor_fused": dict(api="executor", structure="fused", k=2, micro=5, sizes=(2, 6), optimizer="momentum",
                           reduction="mean", clip_norm=None),
    "executor_three_graphs": dict(api="executor", structure="three_graphs", k=2, micro=5, sizes=(2, 6),
                                  optimizer="momentum", reduction="mean", clip_norm=None),
    "executor_window": dict(api="executor", structure="window", k=2, micro=5, sizes=(2, 6), optimizer="momentum",
                            reduction="mean", clip_norm=None),
    # Token-weighted: equal sample counts, but rank 0's sequences are 4 to 6 tokens long and rank 1's one token, so
    # the window is the global batch's mean over its real tokens only if the counts are all-reduced with it.
    "executor_tokens": dict(api="executor", structure="three_graphs", k=2, micro=5, sizes=(2, 2), lengths=(4, 1),
                            optimizer="momentum", reduction="weighted_mean", clip_norm=None),
    "accumulator_tokens": dict(api="accumulator", k=2, micro=5, sizes=(2, 2), lengths=(4, 1), optimizer="momentum",
                               reduction="weighted_mean", clip_norm=0.5),
    # A NaN in rank 1's third micro-batch only (window 2 of 3), under dynamic loss scaling: every rank must skip that
    # window and halve the same scale, or the ranks' parameters would part.
    "executor_nan_on_one_rank": dict(api="executor", structure="three_graphs", k=2, micro=6, sizes=(2, 3),
                                     optimizer="momentum", reduction="mean", clip_norm=None, nan=(1, 2),
                                     loss_scale=2.0 ** 10),
}
# Two msrun launches on this machine acting as two nodes of 2 workers each (4 ranks; `dp_worker.py OUT nodes`).
NODE_CASES = {
    "executor_4_ranks": dict(api="executor", structure="three_graphs", k=2, micro=5, sizes=(1, 3, 2, 2),
                             optimizer="momentum", reduction="mean", clip_norm=None),
    "fused_4_ranks_tokens": dict(api="cell", k=2, micro=4, sizes=(2, 2, 2, 2), lengths=(6, 1, 3, 1),
                                 optimizer="momentum", reduction="weighted_mean", clip_norm=None),
}
# A batch ramp under data parallel (`dp_worker.ramp_runs`): K from the global samples consumed (the ranks' micro-batches
# of 2 and 6 make 8 a step), against the same data trained as fixed-K segments, one after another.
RAMP_CASE = dict(structure="fused", schedule={0: 1, 16: 2, 48: 4}, segments=[(0, 2, 1), (2, 6, 2), (6, 10, 4)],
                 micro=10, sizes=(2, 6), optimizer="momentum")
# The gradient noise scale under data parallel (`dp_worker.noise_scale_run`): K=2 micro-batches of 4 on each rank,
# 1000 windows of 16 samples. The estimate's moving averages forget with β = 0.99 (about the last 100 windows) and
# their bias correction is gone after about 500: more windows would not average the estimate over more of them.
NOISE_CASE = dict(samples=16000, noise_scale=12.0, k=2, batch=4)
NOISE_D = 256  # the noise-scale problem's dimension
# The case whose all-reduce launches the workers count with MindSpore's profiler.
PROFILED_CASE = "fused_unequal"


def make_net() -> nn.Cell:
    """A small MLP whose weights come from numpy, so every process starts from the same bits."""
    net = nn.SequentialCell([nn.Dense(IN, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, OUT)])
    rng = np.random.default_rng(1234)
    for param in net.trainable_params():
        param.set_data(Tensor(rng.standard_normal(param.shape).astype(np.float32) * 0.3))
    return net


def loss_fn(case: dict = None) -> nn.Cell:
    """The case's loss: a token-weighted case's returns (mean over real tokens, their count)."""
    if case is not None and case["reduction"] == "weighted_mean":
        return TokenCrossEntropy(PAD)
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def make_optimizer(name: str, params):
    if name == "sgd":
        return nn.SGD(params, 0.1)
    return nn.Momentum(params, 0.05, 0.9)


def global_micro_batches(case: dict, seed: int = 0):
    """The global micro-batches, in order: each the concatenation of the ranks' shares."""
    rng = np.random.default_rng(seed)
    total = sum(case["sizes"])
    if "lengths" not in case:
        return [(rng.standard_normal((total, IN)).astype(np.float32),
                 rng.integers(0, OUT, (total,)).astype(np.int32)) for _ in range(case["micro"])]
    # Rank r's sequences have lengths[r] to T real tokens when lengths[r] > 1, else exactly one.
    low = np.repeat(case["lengths"], case["sizes"])
    batches = []
    for _ in range(case["micro"]):
        x = rng.standard_normal((total, T, IN)).astype(np.float32)
        y = rng.integers(0, OUT, (total, T)).astype(np.int32)
        length = np.where(low > 1, rng.integers(low, T + 1), 1)
        y[np.arange(T)[None, :] >= length[:, None]] = PAD
        batches.append((x, y))
    return batches


def rank_share(case: dict, batch, rank: int, index: int = None):
    """Rank `rank`'s part of global micro-batch number `index`, NaN where the case's `nan` (rank, index) says."""
    start = sum(case["sizes"][:rank])
    x, y = batch
    x = x[start:start + case["sizes"][rank]].copy()
    if case.get("nan") == (rank, index):
        x[0, 0] = np.nan
    return x, y[start:start + case["sizes"][rank]]


def nan_window(case: dict):
    """The window that holds the case's NaN micro-batch, or None."""
    return None if "nan" not in case else case["nan"][1] // case["k"]


def params_of(net: nn.Cell) -> dict:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def regression_problem(n, noise_scale, seed=0):
    """A linear regression (network, x, y, the exact noise scale) whose per-sample gradients at the network's weights
    are 2 x (residuals of 1), x = mu + a random sign in each of NOISE_D coordinates: tr(Σ) / |G|² is `noise_scale`,
    with little kurtosis, so the estimator's spread over windows is small (README, "Statistics")."""
    ms.set_seed(seed)
    net = nn.Dense(NOISE_D, 1, has_bias=False)
    rng = np.random.default_rng(seed)
    x = np.sqrt(1.0 / noise_scale) + rng.choice([-1.0, 1.0], (n, NOISE_D))
    y = x @ net.weight.asnumpy()[0].astype(np.float64) - 1.0
    grads = 2 * (x @ net.weight.asnumpy()[0].astype(np.float64) - y)[:, None] * x  # per sample: MSE's gradient
    mean = grads.mean(0)
    exact = ((grads - mean) ** 2).sum(1).mean() / (mean @ mean)
    return net, x.astype(np.float32), y[:, None].astype(np.float32), exact

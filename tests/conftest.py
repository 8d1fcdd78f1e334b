"""Shared fixtures: execution mode, small networks with identical starting weights, real-MNIST lookup, and the
checks of a whole error message."""
import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

# Kernels are built into a cache of the test session's own, never into the user's (~/.cache/ms_accum): set before
# ms_accum loads, and inherited by every process a test starts (subprocesses, msrun's workers, pytest-xdist's workers,
# which so share the session's). A cache the developer names (MS_ACCUM_CACHE) is theirs to give.
if not os.environ.get("MS_ACCUM_CACHE"):
    os.environ["MS_ACCUM_CACHE"] = tempfile.mkdtemp(prefix="ms_accum-test-cache-")
    atexit.register(shutil.rmtree, os.environ["MS_ACCUM_CACHE"], ignore_errors=True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ms_accum  # noqa: F401,E402  (before mindspore, as the CLI and the tutorials: it caps oneDNN at AVX2 on AVX-512)
import mindspore as ms  # noqa: E402
from mindspore import Parameter, Tensor, nn

from ms_accum.demo.models import LeNet5, MLP

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


@pytest.fixture(autouse=True)
def _graph_mode_by_default():
    # Tests that need PyNative ask for it through `mode`; every other test starts in graph mode.
    ms.set_context(mode=ms.GRAPH_MODE)
    yield


@pytest.fixture(autouse=True)
def _no_traceback_asked(monkeypatch):
    # The command line's output as a user sees it by default, even where the developer's shell sets the variable
    # (`ms_accum.cli.failure`); subprocesses inherit the removal.
    monkeypatch.delenv("MS_ACCUM_TRACEBACK", raising=False)


@pytest.fixture(params=list(MODES))
def mode(request):
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


def make_net(kind: str, seed: int = 0) -> nn.Cell:
    ms.set_seed(seed)
    return {"mlp": MLP, "lenet5": LeNet5}[kind]()


def copy_weights(src: nn.Cell, dst: nn.Cell) -> None:
    ms.load_param_into_net(dst, {p.name: Parameter(Tensor(p.asnumpy().copy()), name=p.name)
                                 for p in src.trainable_params()}, strict_load=True)


def make_optimizer(name: str, params):
    if name == "sgd":
        return nn.SGD(params, 0.1)
    if name == "momentum":
        return nn.Momentum(params, 0.05, 0.9)
    if name == "adam":
        # Adam's first step is lr * g / (|g| + eps): for a gradient element that is a near-zero sum of
        # cancelling terms, it magnifies float32 summation-order rounding (~1e-10 absolute) by up to
        # lr / (4 * eps). With the default eps 1e-8 that reaches 2e-6 on a handful of the MLP's 670k weights,
        # for any two summation orders; eps 1e-6 keeps the magnification below the 1e-6 tolerance.
        return nn.Adam(params, 1e-3, eps=1e-6)
    raise ValueError(name)


def batch_for(kind: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    side = 32 if kind == "lenet5" else 28
    x = rng.standard_normal((n, 1, side, side)).astype(np.float32)
    y = rng.integers(0, 10, (n,)).astype(np.int32)
    return x, y


def params_of(net: nn.Cell):
    return [p.asnumpy().copy() for p in net.trainable_params()]


def mnist_dir():
    """Real MNIST from MS_ACCUM_MNIST or ../shared/data/MNIST_Data beside this checkout, else None."""
    for candidate in (os.environ.get("MS_ACCUM_MNIST"),
                      Path(__file__).resolve().parents[2] / "shared" / "data" / "MNIST_Data"):
        if candidate and (Path(candidate) / "train" / "train-images-idx3-ubyte").is_file():
            return str(candidate)
    return None


requires_mnist = pytest.mark.skipif(mnist_dir() is None,
                                    reason="real MNIST not found (set MS_ACCUM_MNIST or ../shared/data/MNIST_Data)")


@contextlib.contextmanager
def raises_exactly(error, message: str):
    """`pytest.raises(error)` whose message must be `message`, whole: its ``For '<name>', `` prefix says which name
    the user is told they called, and a fragment cannot see it."""
    with pytest.raises(error) as info:
        yield info
    assert str(info.value) == message


def cli_error(err: str) -> str:
    """The one error line of the command line's stderr (argparse prints its usage above it)."""
    return err.strip().splitlines()[-1]


# A module of factories (`ms_accum.tools.factory`) that tests write beside them as users_model.py: a good one and bad ones.
FACTORY = """
import numpy as np
from mindspore import nn


def build():
    net = nn.SequentialCell([nn.Dense(6, 16), nn.ReLU(), nn.Dense(16, 3)])

    def sample(n):
        rng = np.random.default_rng(n)
        return rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params()), sample


def two_things():
    return nn.Dense(2, 2), None


def no_optimizer():
    net, loss, _, sample = build()
    return net, loss, "sgd", sample


def broken():
    raise RuntimeError("no weights here")


def wrong_shapes():
    net, loss, opt, _ = build()
    return net, loss, opt, lambda n: (np.zeros((n, 5), np.float32), np.zeros(n, np.int32))
"""

"""MindSpore's doorway (`ms_accum._mindspore`): the supported releases, and every private or undocumented name of
MindSpore that ms_accum relies on, each checked on the running MindSpore (CI runs this file on every release of its
matrix), and what happens where a release lacks one: a fallback said once, or an error naming the feature, the name and
the release."""
import importlib.metadata
import inspect
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from packaging.specifiers import SpecifierSet
import mindspore as ms
from mindspore import Tensor, nn, ops

from ms_accum import _mindspore as door
from ms_accum._mindspore import MindSporeChangedError
from conftest import raises_exactly

VERSION = ms.__version__


@pytest.fixture(autouse=True)
def _fresh_lookups():
    """Each test looks its names up afresh, and leaves no cached fallback behind for the tests that follow."""
    cached = [value for value in vars(door).values() if hasattr(value, "cache_clear")]
    for function in cached:
        function.cache_clear()
    yield
    for function in cached:
        function.cache_clear()


def no_warning(function, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return function(*args)


def said_once(function, *args):
    """`function(*args)` twice: the value, after checking that the fallback was said once."""
    with pytest.warns(UserWarning) as caught:
        value = function(*args)
        assert function(*args) == value
    assert len(caught) == 1, [str(w.message) for w in caught]
    return value, str(caught[0].message)


def missing(what: str, then: str, feature: str) -> str:
    return (f"ms_accum's {feature} needs MindSpore's {what} (MindSpore 2.8–2.10), but MindSpore {VERSION} has none: "
            f"{then}")


# ------------------------------------------------------------------------------------------------------------------
# The supported releases


def test_the_supported_range():
    assert door.KNOWN == "2.8–2.10"
    assert door.release("2.10.0rc1") == (2, 10) and door.release("2.7.1.post1") == (2, 7)
    assert [door.supported(v) for v in ("2.7.2", "2.8.0", "2.9.0", "2.10.0", "2.11.0")] == [False, True, True, True,
                                                                                         False]
    assert door.supported(VERSION) and door.installed_version() == VERSION


def test_another_release_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv(door.UNSUPPORTED_VARIABLE, raising=False)
    with pytest.raises(ImportError, match=r"supports MindSpore >=2\.8,<2\.11, but found MindSpore 2\.7\.2"):
        door.check_version("2.7.2")
    monkeypatch.setenv(door.UNSUPPORTED_VARIABLE, "1")
    with pytest.warns(UserWarning, match="going on untested"):
        door.check_version("2.11.0")
    door.check_version(None)  # none installed: importing it fails anyway


# ------------------------------------------------------------------------------------------------------------------
# Every entry resolves on the running MindSpore


def check_primitives():
    cell = nn.Dropout(p=0.5)
    assert isinstance(door.primitives(cell)[door.DROPOUT_OP], ops.Dropout)
    dense = nn.Dense(2, 2)
    assert door.primitives(dense) == dict(dense._primitives)  # pylint: disable=protected-access  (MindSpore's record)
    from ms_accum.core.guard import sparse_gradient_cell
    table = nn.SequentialCell([nn.EmbeddingLookup(10, 4, sparse=True)])
    assert sparse_gradient_cell(table) == "0"  # its SparseGatherV2 found among the cell's primitives


def check_with_loss():
    net, loss = nn.Dense(3, 2), nn.MSELoss()
    wrapped = nn.WithLossCell(net, loss)
    assert door.with_loss_cells(wrapped) == (net, loss) and door.loss_of(wrapped) is loss
    assert door.loss_of(net) is None
    assert (door.WITH_LOSS_BACKBONE, door.WITH_LOSS_FN) == ("_backbone", "_loss_fn")


def check_with_loss_columns():
    from ms_accum.core.columns import WithLossColumns
    net = nn.Dense(3, 2)
    columns = WithLossColumns(net, nn.MSELoss())
    x, y = Tensor(np.ones((2, 3), np.float32)), Tensor(np.zeros((2, 2), np.float32))
    assert np.isclose(columns(x, y).asnumpy(), nn.WithLossCell(net, nn.MSELoss())(x, y).asnumpy())  # graph mode


def check_batchnorm():
    kinds = no_warning(door.batchnorm_types)
    assert all(issubclass(kind, kinds) for kind in (nn.BatchNorm1d, nn.BatchNorm2d, nn.SyncBatchNorm))
    assert not issubclass(nn.LayerNorm, kinds)


def check_dropout():
    ms.set_seed(3)
    cell = nn.Dropout(p=0.25)
    prim = no_warning(door.dropout_op, cell)
    keep, seed0, seed1 = door.dropout_settings(prim)
    assert keep == 0.75 and (seed0, seed1) != (0, 0)
    assert door.prim_attrs(prim)[door.RANDOM_EFFECT_ATTR]  # MindSpore marks its random ops so
    assert no_warning(door.dropout_op, nn.Dense(2, 2)) is None
    assert all(name in door.prim_attrs(ops.StandardNormal(seed=1, seed2=2)) for name in door.RANDOM_SEED_ATTRS[1])


def check_random_functions():
    names = no_warning(door.random_functions)
    assert {"uniform", "randn", "normal"} <= names
    assert set(door._RANDOM_FUNCTIONS_2_10) <= names  # pylint: disable=protected-access  (the fallback's list)


def check_aot():
    """ms_accum's dropout kernel, called by the aot convention in PyNative (where the C++ compiler is)."""
    from ms_accum.core import dropout, native
    try:
        dropout._library()  # pylint: disable=protected-access
    except native.KernelBuildError as err:
        pytest.skip(str(err))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        op = dropout.SeededDropout(0.5, seed=7)
        assert door.prim_attrs(op.primitive)[door.RANDOM_EFFECT_ATTR]  # mark_random
        out, offset = op.primitive(Tensor(np.ones(8, np.float32)))
        assert set(np.unique(out.asnumpy())) <= {0.0, 2.0} and int(offset.asnumpy()) == 0 and op.offset == 2
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def check_optimizer():
    params = nn.Dense(3, 2).trainable_params()
    plain = nn.Adam(params, 0.1, weight_decay=0.1, loss_scale=4.0)
    grouped = nn.Momentum([{"params": params[:1], "weight_decay": 0.01, "grad_centralization": True},
                           {"params": params[1:]}], 0.1, 0.9, loss_scale=2.0)
    read = door.optimizer_attribute
    assert read(plain, "loss_scale") == 4.0 and read(plain, "is_group") is False
    assert np.isclose(read(plain, "weight_decay").asnumpy(), 0.4)  # the decay given times loss_scale
    assert read(plain, "dynamic_weight_decay") is False
    assert read(plain, "use_lazy") is False and read(plain, "use_offload") is False
    assert read(nn.Adam(params, use_lazy=True), "use_lazy") is True
    assert read(nn.Adam(params, use_offload=True), "use_offload") is True
    assert read(grouped, "is_group") is True
    assert np.allclose(read(grouped, "group_weight_decay"), [0.02, 0.0])
    assert list(read(grouped, "group_grad_centralization")) == [True, False]
    assert read(nn.Adam(params, weight_decay=nn.CosineDecayLR(0.0, 0.1, 4)), "dynamic_weight_decay") is True
    assert read(nn.SGD(params), "use_lazy", False) is False  # not an Adam: the default


def check_listed_rates():
    params = nn.Dense(3, 2).trainable_params()
    assert door.listed_rates(nn.SGD(params, [0.1, 0.05, 0.02])) == 3
    assert door.listed_rates(nn.SGD(params, 0.1)) is None
    assert door.listed_rates(nn.SGD(params, nn.CosineDecayLR(0.0, 0.1, 4))) is None  # a schedule: no list
    grouped = nn.Momentum([{"params": params[:1], "lr": [0.2, 0.1, 0.05]}, {"params": params[1:]}],
                          [0.1, 0.05, 0.02], 0.9)
    assert door.listed_rates(grouped) == 3  # a list per group


def check_learning_rate_schedule():
    base = no_warning(door.learning_rate_schedule)
    assert issubclass(nn.CosineDecayLR, base) and issubclass(base, nn.Cell) and base is not nn.Cell
    assert door.LearningRateSchedule is base
    from ms_accum.train.lr import SamplesLR
    assert issubclass(SamplesLR, base)


def check_communication():
    assert door.communication_initialized() is False  # no init() in a test process
    assert isinstance(door.world_group(), str)


def check_logger():
    assert isinstance(no_warning(door.mindspore_logger), logging.Logger)


def check_onednn():
    import ctypes
    library = no_warning(door.onednn)
    assert library is not None, "MindSpore's oneDNN not found"

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int)]

    library.dnnl_version.restype = ctypes.POINTER(Version)
    major = library.dnnl_version().contents.major
    assert major == (2 if door.release(VERSION) < (2, 9) else 3), (VERSION, major)  # the table's library names
    assert door.ONEDNN_LIBRARIES[0 if major == 3 else 1].endswith(str(major))
    assert set(door.ONEDNN_ISA_VARIABLES) <= set(os.environ) or "avx512f" not in open("/proc/cpuinfo").read()


ENTRIES = {
    "onednn": check_onednn, "ONEDNN_LIBRARIES": check_onednn, "ONEDNN_ISA_VARIABLES": check_onednn,
    "primitives": check_primitives, "with_loss_cells": check_with_loss, "loss_of": check_with_loss,
    "WITH_LOSS_BACKBONE": check_with_loss_columns, "WITH_LOSS_FN": check_with_loss_columns,
    "batchnorm_types": check_batchnorm,
    "prim_attrs": check_dropout, "DROPOUT_OP": check_dropout, "DROPOUT_KEEP": check_dropout,
    "DROPOUT_SEEDS": check_dropout, "RANDOM_SEED_ATTRS": check_dropout, "RANDOM_EFFECT_ATTR": check_dropout,
    "dropout_op": check_dropout, "dropout_settings": check_dropout, "mark_random": check_aot,
    "random_functions": check_random_functions, "AOT": check_aot, "aot_primitive": check_aot,
    "OPTIMIZER_ATTRIBUTES": check_optimizer, "optimizer_attribute": check_optimizer,
    "learning_rate_schedule": check_learning_rate_schedule, "listed_rates": check_listed_rates,
    "communication_initialized": check_communication,
    "world_group": check_communication, "mindspore_logger": check_logger,
}
# The version gate and the door's own machinery, checked above or by the entries' fallbacks below.
GATE = {"SUPPORTED", "SUPPORTED_RANGE", "UNSUPPORTED_VARIABLE", "installed_version", "release", "supported",
        "check_version", "UnsupportedMindSporeError", "KNOWN", "MindSporeChangedError", "MessageError"}


def test_every_entry_is_checked():
    """A name added to the door gets its check here."""
    names = {name for name, value in vars(door).items() if not name.startswith("_")
             and not inspect.ismodule(value) and name not in {"annotations", "Optional", "Tuple"}}
    assert names - GATE == set(ENTRIES)


@pytest.mark.parametrize("check", sorted(set(ENTRIES.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__.removeprefix("check_"))
def test_entries_resolve_on_this_mindspore(check):
    check()


# ------------------------------------------------------------------------------------------------------------------
# Where a release lacks one: a fallback said once, or a clear error


def test_no_batchnorm_base_falls_back_to_the_public_classes(monkeypatch):
    import mindspore.nn.layer.normalization as normalization
    from ms_accum.tools.causes import batchnorm_cells
    net = nn.SequentialCell([nn.Dense(2, 2), nn.BatchNorm1d(2)])  # built first: MindSpore's own classes need the name
    monkeypatch.delattr(normalization, "_BatchNorm")
    kinds, said = said_once(door.batchnorm_types)
    assert kinds == (nn.BatchNorm1d, nn.BatchNorm2d, nn.SyncBatchNorm)
    assert said == missing("nn.layer.normalization._BatchNorm", "only nn.BatchNorm1d, nn.BatchNorm2d (nn.BatchNorm3d's "
                           "inner one) and nn.SyncBatchNorm and their subclasses are taken for BatchNorm.",
                           "BatchNorm detection")
    assert batchnorm_cells(net) == ["1"]


def test_no_random_function_list_falls_back_to_2_10s(monkeypatch):
    from mindspore.ops.function import random_func
    monkeypatch.delattr(random_func, "__all__")
    names, said = said_once(door.random_functions)
    assert names == frozenset(door._RANDOM_FUNCTIONS_2_10)  # pylint: disable=protected-access
    assert said == missing("list mindspore.ops.function.random_func.__all__", "it looks for the random functions of "
                           "MindSpore 2.10 instead.", "check for random ops")


def test_no_schedule_module_falls_back_to_the_public_schedules_base(monkeypatch):
    import mindspore.nn.learning_rate_schedule as schedules
    real = schedules.LearningRateSchedule
    monkeypatch.delattr(schedules, "LearningRateSchedule")
    base, said = said_once(door.learning_rate_schedule)
    assert base is real
    assert said == missing("module mindspore.nn.learning_rate_schedule", "ms_accum takes nn.WarmUpLR's base class "
                           "for it.", "learning-rate schedules")


def test_no_logger_leaves_mindspores_log_as_it_is(monkeypatch):
    import mindspore.log
    from ms_accum.train.checkpoint import _quiet_mindspore_log
    monkeypatch.delattr(mindspore.log, "_get_logger")
    logger, said = said_once(door.mindspore_logger)
    assert logger is None
    assert said == missing("mindspore.log._get_logger", "MindSpore's own line about a failed save is left in the log.",
                           "checkpoint writer")
    with _quiet_mindspore_log():  # the save's quieting does nothing (MindSpore's own log needs the name: no save here)
        pass


def test_a_dropout_op_ms_accum_cannot_read_keeps_mindspores_kernel():
    from ms_accum.core.dropout import DropoutStreams
    net = nn.SequentialCell([nn.Dense(4, 4), nn.Dropout(p=0.5)])
    prim = door.dropout_op(net[1])
    prim.del_prim_attr(door.DROPOUT_SEEDS[0])
    with pytest.warns(UserWarning) as caught:
        assert door.dropout_op(net[1]) is None
        assert len(DropoutStreams(net)) == 0  # nothing replaced: nn.Dropout draws with MindSpore's kernel
    assert [str(w.message) for w in caught] == [missing(
        "nn.Dropout to call an ops.Dropout 'dropout' holding 'keep_prob', 'Seed0', 'Seed1', 'side_effect_hidden'",
        "nn.Dropout keeps MindSpore's kernel: runs may differ and a resumed run draws other masks (docs/resume.md).",
        "seeded dropout")]
    with raises_exactly(MindSporeChangedError, missing("ops.Dropout to hold 'keep_prob', 'Seed0', 'Seed1'", "ms_accum "
                        "cannot draw the op's masks from its seeds.", "seeded dropout")):
        door.dropout_settings(prim)


def test_a_with_loss_cell_without_its_loss_is_refused_by_name():
    wrapped = nn.WithLossCell(nn.Dense(3, 2), nn.MSELoss())
    del wrapped._loss_fn  # pylint: disable=protected-access  (as a release that names it otherwise)
    with raises_exactly(MindSporeChangedError, missing(
            "nn.WithLossCell to keep its loss as '_loss_fn'", "give the network and the loss apart "
            "(GradientAccumulation(network, loss_fn, ...)), or the reduction to the AccumulationBuffer yourself.",
            "window reduction")):
        door.loss_of(wrapped)
    with raises_exactly(MindSporeChangedError, missing(
            "nn.WithLossCell to keep its Cells as '_backbone' and '_loss_fn'", "wrap the network and its loss in a "
            "Cell of your own that returns the loss, and pass loss_fn=None.", "loss columns (WithLossColumns)")):
        door.with_loss_cells(wrapped)


def test_an_optimizer_without_its_record_cannot_be_rebuilt_but_a_factory_can():
    from ms_accum.train.sharding import check_shardable
    optimizer = nn.Momentum(nn.Dense(3, 2).trainable_params(), 0.1, 0.9)
    del optimizer.dynamic_weight_decay
    with raises_exactly(MindSporeChangedError, missing(
            "Momentum to keep its 'dynamic_weight_decay'", "pass shard_optimizer a factory params -> optimizer that "
            "builds your optimizer over a rank's parameters.", "optimizer sharding")):
        check_shardable(optimizer, 2, True)
    factory = lambda params: nn.Momentum(params, 0.1, 0.9)  # noqa: E731
    assert check_shardable(optimizer, 2, factory) is factory


def test_no_communication_record(monkeypatch):
    import mindspore.communication
    from mindspore.communication import GlobalComm
    from ms_accum.core.parallel import data_parallel_info
    monkeypatch.delattr(GlobalComm, "INITED")
    # MindSpore's own get_group_size reads the name too; a release without it would answer by itself.
    monkeypatch.setattr(mindspore.communication, "get_group_size", lambda: 1)
    initialized, said = said_once(door.communication_initialized)
    assert initialized is False and data_parallel_info() is None  # one process: a single device, as before
    assert said == missing("communication.GlobalComm.INITED", "a process is taken for a rank of a data-parallel job "
                           "when mindspore.communication.get_group_size() is above 1.", "data parallel")
    monkeypatch.delattr(GlobalComm, "WORLD_COMM_GROUP")
    with raises_exactly(MindSporeChangedError, missing(
            "communication.GlobalComm.WORLD_COMM_GROUP", "ms_accum cannot name the group of all ranks for its "
            "collectives; train on one device.", "data parallel")):
        door.world_group()
    monkeypatch.setattr(mindspore.communication, "get_group_size", lambda: 2)
    assert door.communication_initialized() is True  # msrun's ranks


def test_importing_the_door_loads_no_mindspore():
    import subprocess
    import sys
    code = ("import sys; from ms_accum import _mindspore; "
            "assert 'mindspore' not in sys.modules, 'the door loaded MindSpore'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


# The supported releases: refused outside them before anything is built.

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> SpecifierSet:
    """pyproject.toml's MindSpore requirement."""
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.strip().startswith('"mindspore'):
            return SpecifierSet(line.strip().strip('",')[len("mindspore"):])
    raise AssertionError("pyproject.toml declares no MindSpore")


def _matrix() -> list:
    """The releases CI tests: the Makefile's older ones and the newest, running here under `make test-all`."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("OLDER_MINDSPORE :="):
            return line.split(":=")[1].split()
    raise AssertionError("the Makefile names no older MindSpore")


def test_the_declared_range_is_the_refused_ones_complement_and_holds_the_tested_releases():
    declared = _declared()
    assert str(declared) == str(SpecifierSet(door.SUPPORTED_RANGE))  # one range, in two files
    for version in [*_matrix(), ms.__version__]:
        assert version in declared and door.supported(version), version
    for version in ("2.7.2", "2.7.1.post1", "2.7.0", "2.11.0", "3.0.0", "1.10.1"):
        assert version not in declared and not door.supported(version), version


def test_pip_keeps_the_mindspore_it_finds():
    # pip keeps an installed MindSpore that satisfies ms_accum's requirement: the installed package's, as pip reads it
    requires = [r for r in importlib.metadata.requires("ms_accum") if r.startswith("mindspore")]
    assert requires and ms.__version__ in SpecifierSet(requires[0][len("mindspore"):].split(";")[0]), requires


def test_running_on_a_supported_release():
    assert door.supported(door.installed_version())
    assert door.installed_version() == ms.__version__


@pytest.mark.parametrize("version,release", [("2.7.1.post1", (2, 7)), ("2.10.0rc1", (2, 10)), ("2.9.0", (2, 9))])
def test_release_of_a_version_string(version, release):
    assert door.release(version) == release


def test_an_unreadable_version_is_refused():
    with pytest.raises(ImportError, match="cannot read the MindSpore version 'nightly'"):
        door.check_version("nightly")


# A MindSpore stand-in of another release, loaded before ms_accum: what `import ms_accum` meets in that environment.
SCRIPT = """
import sys, types
sys.modules["mindspore"] = types.SimpleNamespace(__version__={version!r})
try:
    import ms_accum
except ImportError as err:
    print("REFUSED", err)
else:
    print("IMPORTED", ms_accum.__version__)
"""


def _import_beside(version: str, tmp_path, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(version=version)))
    environ = {k: v for k, v in os.environ.items() if k != door.UNSUPPORTED_VARIABLE}
    return subprocess.run([sys.executable, "-W", "always", str(script)], capture_output=True, text=True,
                          timeout=120, env={**environ, **env})


@pytest.mark.parametrize("version", ["2.7.2", "2.11.0"])
def test_import_beside_an_unsupported_release_is_refused(tmp_path, version):
    out = _import_beside(version, tmp_path)
    assert out.stdout.strip() == (
        f"REFUSED ms_accum supports MindSpore >=2.8,<2.11, but found MindSpore {version}. Install a supported release "
        f"(pip install 'mindspore>=2.8,<2.11'); docs/mindspore.md, versions, says what breaks on others. To try it "
        f"anyway, set MS_ACCUM_ALLOW_UNSUPPORTED_MINDSPORE=1."), out.stderr


def test_a_maintainer_may_try_another_release_with_a_warning(tmp_path):
    out = _import_beside("2.11.0", tmp_path, MS_ACCUM_ALLOW_UNSUPPORTED_MINDSPORE="1")
    assert out.stdout.strip().startswith("IMPORTED")
    assert "found MindSpore 2.11.0" in out.stderr and "going on untested" in out.stderr


def test_import_beside_a_supported_release(tmp_path):
    assert _import_beside("2.9.0", tmp_path).stdout.strip().startswith("IMPORTED")

"""Every public name of ms_accum 0.2 (the flat package of commit b9d47ed), listed: each still works for this release,
and warns where it moved (`ms_accum/_compat.py`); the few internals that went are listed with what replaced them. The 0.2
keyword of K, ``accumulate_steps``, still builds a plan, a trial and a step record; every JSON the command line and a
plan file write spells K ``accumulate_step``, and the old spelling is still read."""
import importlib
import json
import sys
import warnings

import pytest

import ms_accum
from ms_accum import _compat, cli

# 0.2's `ms_accum.__all__`.
TOP_LEVEL = ["AccumulationBuffer", "Accumulator", "CharTransformer", "EquivalenceReport", "EvalResult",
             "GradientAccumulation", "LeNet5", "LossOnly", "MLP", "NonFiniteError", "Plan", "StepRecord",
             "TokenCrossEntropy", "TrainAccumulationCell", "TrainClear", "TrainForwardBackward", "TrainOptim",
             "TrainResult", "TrainWindowCell", "TrainingState", "evaluate", "evaluate_checkpoint",
             "init_data_parallel", "plan", "recompute_cells", "replace_batchnorm", "scale_lr", "verify_equivalence"]

# Every name a 0.2 module defined without a leading underscore (its private `_ops` aside), by 0.2 module.
MODULES = {
    "accumulator": "Accumulator",
    "buffer": "HALF Reduction SampleMean Sum WeightedMean RULES REDUCTIONS check_buffer_dtype AccumulationBuffer",
    "causes": "Cause batchnorm_cells stochastic_cells in_inference explain",
    "cells": "TrainingState TrainForwardBackward TrainOptim TrainClear TrainAccumulationCell",
    "checkpoint": "FORMAT_VERSION MetaValue CheckpointError save_checkpoint load_checkpoint load_into checkpoint_path "
                  "list_checkpoints find_latest prune",
    "data": "PathLike MNIST_URL MNIST_FILES ENV_VAR DEFAULT_DATA_DIR SYNTHETIC_MARKER MNIST_MEAN MNIST_STD DataError "
            "resolve_data_dir check_mnist_dir read_idx write_idx download_mnist create_dataset datapipe "
            "make_synthetic_mnist is_synthetic dataset_for",
    "evaluation": "EvalResult evaluate recorded_data_dir checkpoint_data_dir evaluate_checkpoint",
    "executor": "PARTIAL_WINDOWS STRUCTURES AUTO_STRUCTURE StepRecord NonFiniteError TrainResult GradientAccumulation "
                "windows_per_epoch count_windows",
    "factory": "SEPARATOR UserModel is_factory builtin_model load_model",
    "guard": "POLICIES LossScaler check_policy_fits sparse_gradient_cell WindowGuard",
    "losses": "TokenCrossEntropy LossOnly WEIGHTED check_loss_output returns_weight",
    "lr": "RULES scale_lr SamplesLR",
    "models": "LeNet5 MLP CharTransformer MODELS INPUT_SHAPES OPTIMIZER_DEFAULTS make_optimizer build_model",
    "norm": "replace_batchnorm",
    "parallel": "LAUNCHER_ROLES DataParallelInfo distributed_launch init_data_parallel data_parallel_info LocalSums "
                "AllReduceSums check_same_on_all_ranks gather_ints sums_reducer",
    "planner": "MIB TIMED_STRUCTURES REDUCTIONS DEVICES WINDOWS CONFIRM_UP_TO HEADROOM parse_size Trial Plan plan "
               "measure process_status main",
    "recompute": "recompute_cells",
    "resume": "STATE_KIND Position StateCheckpoints",
    "runtime": "DEVICES ISA_VARIABLE prefer_fast_cpu_kernels cpu_kernel_isa slow_cpu_kernels check_cpu_kernels "
               "set_device",
    "schedule": "ScheduleLike AccumulationSchedule pairs_text parse_schedule rampup",
    "statistics": "UNMEASURED OUTLIER_BETA MIN_OUTLIER_WARMUP NoStatistics Statistics OutlierFilter check_outliers "
                  "NoiseScale harmonic_mean",
    "verify": "EquivalenceReport verify_equivalence",
    "window": "TrainWindowCell",
}
# 0.2 internals that are gone: its executor's runners, which the structures replaced.
GONE = {"executor": ["MicroBatches", "ThreeGraphsRunner", "FusedRunner", "WindowRunner"]}

# The 0.2 command line: every command and flag is still accepted.
FLAGS = {
    "train": ["--model lenet5", "--accumulate-steps 2", "--batch-size 8", "--optimizer sgd", "--lr 0.1",
              "--momentum 0.5", "--seed 1", "--epochs 2", "--clip-norm 1", "--structure fused", "--statistics",
              "--noise-scale", "--skip-outliers 3", "--outlier-warmup 8", "--policy skip_window",
              "--stop-on-nonfinite", "--loss-scale static", "--loss-scale-value 8", "--recompute conv1",
              "--partial-window drop", "--num-samples 64", "--ckpt-dir c", "--save-every 2", "--keep-last 1",
              "--resume", "--no-eval", "--plan p.json", "--distributed", "--data d", "--device CPU", "--json",
              "--quiet", "--download", "--synthetic-fallback"],
    "eval": ["--ckpt c.ckpt", "--model lenet5", "--batch-size 64", "--num-samples 64", "--data d", "--device CPU",
             "--json", "--quiet"],
    "verify": ["--model lenet5", "--accumulate-steps 2", "--batch-size 8", "--optimizer sgd", "--lr 0.1",
               "--momentum 0.5", "--seed 1", "--rtol 1e-4", "--atol 1e-5", "--data d", "--device CPU", "--json",
               "--quiet", "--download", "--synthetic-fallback"],
    "plan": ["--model lenet5", "--global-batch 64", "--memory 1GiB", "--ranks 2", "--output p.json", "--device CPU",
             "--json", "--quiet"],
}


def _fresh(module: str):
    """`ms_accum.<module>` imported anew if it is an alias, so the alias warns again; (module, warnings). A module still
    at its 0.2 path stays as imported: running it again would make a second copy of each of its objects in this process
    (`ms_accum.set_device` would no longer be `ms_accum.runtime.set_device`)."""
    if module in _compat.MOVED:
        sys.modules.pop(f"ms_accum.{module}", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = importlib.import_module(f"ms_accum.{module}")
    return imported, [str(w.message) for w in caught if w.category is DeprecationWarning]


def test_every_top_level_name_of_0_2_imports_from_the_top():
    moved = []
    for name in TOP_LEVEL:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(ms_accum, name) is not None, name
        moved += [name] * any(w.category is DeprecationWarning for w in caught)
    # Those that moved out of the top (the demo's networks and evaluation, two helpers) warn; the others do not.
    assert set(moved) == set(TOP_LEVEL) & set(ms_accum._DEPRECATED) == {
        "CharTransformer", "EvalResult", "LeNet5", "MLP", "TrainingState", "evaluate", "evaluate_checkpoint",
        "recompute_cells", "scale_lr"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_name_of_each_0_2_module_is_found_at_its_0_2_path(module):
    old, messages = _fresh(module)
    new = _compat.MOVED.get(module)
    if new is not None:  # a moved module warns, naming where it went
        assert messages and messages[0].startswith(f"'ms_accum.{module}' is deprecated and will be removed in the next "
                                                   f"release; import 'ms_accum.{new}'"), messages
    for name in MODULES[module].split():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(old, name)
        assert value is not None, (module, name)
        place = _compat.MOVED_NAMES.get((module, name))
        if place is not None:  # it left its module's new place: found at its own, with a warning naming that
            assert [w.category for w in caught] == [DeprecationWarning], (module, name)
            assert str(caught[0].message).startswith(f"'ms_accum.{module}.{name}' is deprecated"), caught[0].message
            assert caught[0].filename == __file__  # the warning points at the user's line
    for name in GONE.get(module, []):
        with pytest.raises(AttributeError, match=f"'ms_accum.{module}.{name}' was removed in ms_accum 0.3: use the "
                                                 f"structures of 'ms_accum.train.structures'"):
            getattr(old, name)


def test_init_data_parallel_from_its_0_2_module_warns_and_is_todays():
    sys.modules.pop("ms_accum.parallel", None)
    with pytest.warns(DeprecationWarning) as caught:
        from ms_accum.parallel import DataParallelInfo, init_data_parallel
    from ms_accum.core.parallel import DataParallelInfo as info_now
    from ms_accum.train.distributed import init_data_parallel as now
    assert init_data_parallel is now and DataParallelInfo is info_now
    assert [str(w.message) for w in caught] == [
        "'ms_accum.parallel' is deprecated and will be removed in the next release; import 'ms_accum.core.parallel' "
        "(and 'ms_accum.train.distributed').",
        "'ms_accum.parallel.init_data_parallel' is deprecated and will be removed in the next release; import "
        "'init_data_parallel' from 'ms_accum.train.distributed'."]


def test_the_shims_of_0_2_helpers_compute_what_they_did():
    with pytest.warns(DeprecationWarning):
        from ms_accum.executor import windows_per_epoch
    assert [windows_per_epoch(10, 4), windows_per_epoch(10, 4, "drop"), windows_per_epoch(8, 4)] == [3, 2, 2]
    with pytest.warns(DeprecationWarning):
        from ms_accum.statistics import harmonic_mean
    assert harmonic_mean([2.0, 2.0, 4.0]) == pytest.approx(3 / 1.25)
    with pytest.warns(DeprecationWarning):
        from ms_accum.factory import builtin_model
    user = builtin_model("mlp")
    assert type(user.network).__name__ == "MLP" and user.batch(4)[0].shape == (4, 1, 28, 28)


def test_the_0_2_keyword_of_k_builds_a_plan_a_trial_and_a_step_record():
    from ms_accum import Plan, StepRecord
    from ms_accum.train.plan import Trial
    with pytest.warns(DeprecationWarning, match=r"'Plan\(accumulate_steps=...\)' is deprecated and will be removed in "
                                                r"the next release; use 'accumulate_step'."):
        old = Plan(model="lenet5", global_batch=16, ranks=1, batch_size=4, accumulate_steps=4, structure="fused",
                   reduction="mean", predicted_peak_mib=10.0, memory_mib=None, budget_mib=20.0, intercept_mib=1.0,
                   slope_mib=2.0, device="CPU")
    assert old == Plan("lenet5", 16, 1, 4, 4, "fused", "mean", 10.0, None, 20.0, 1.0, 2.0, "CPU")
    with pytest.warns(DeprecationWarning, match=r"'Trial\(accumulate_steps=...\)'"):
        assert Trial(batch_size=4, accumulate_steps=2, structure="fused", peak_mib=9.0) == Trial(4, 2, "fused", 9.0)
    with pytest.warns(DeprecationWarning, match=r"'StepRecord\(accumulate_steps=...\)'"):
        assert StepRecord(1, 1, 0.5, 4, 32, accumulate_steps=4).accumulate_step == 4
    with pytest.raises(TypeError, match="Plan\\(\\) got both 'accumulate_step' and its deprecated name "
                                        "'accumulate_steps'"):
        Plan("lenet5", 16, 1, 4, accumulate_step=4, accumulate_steps=4, structure="fused", reduction="mean",
             predicted_peak_mib=10.0, memory_mib=None, budget_mib=20.0, intercept_mib=1.0, slope_mib=2.0,
             device="CPU")


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_every_0_2_flag_is_still_accepted(command):
    argv = [command] + [word for flag in FLAGS[command] for word in flag.split()]
    args = cli.build_parser().parse_args(argv)
    assert args.command == command


def test_k_is_spelled_accumulate_step_in_every_json_the_cli_writes(tmp_path, capsys):
    """The plan file, `plan --json`, `train --json` and `verify --json` (`train` with a schedule too), and the
    checkpoint's metadata; a plan file and a checkpoint of 0.2, which say ``accumulate_steps``, are still read."""
    from ms_accum.train.checkpoint import load_checkpoint, save_checkpoint
    from ms_accum.train.plan import Plan
    from ms_accum.demo.data import make_synthetic_mnist
    from ms_accum.demo.models import MLP
    data = make_synthetic_mnist(str(tmp_path / "data"), num_train=64, num_test=32)
    common = ["--model", "mlp", "--batch-size", "8", "--data", data, "--json", "--quiet"]
    assert cli.main(["verify", "--accumulate-steps", "2", *common]) == 0
    verified = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert cli.main(["train", "--accumulate-steps", "2", "--ckpt-dir", str(tmp_path / "c"), "--no-eval", *common]) == 0
    trained = json.loads(capsys.readouterr().out.splitlines()[-1])
    _, meta = load_checkpoint(trained["checkpoint"])
    written = Plan("mlp", 16, 1, 8, 2, "fused", "mean", 10.0, None, 20.0, 1.0, 2.0, "CPU")
    plan_file = json.loads(open(written.save(str(tmp_path / "plan.json"))).read())
    for found in (verified, trained, meta, plan_file):
        assert "accumulate_step" in found and "accumulate_steps" not in found, found
    assert (verified["accumulate_step"], trained["accumulate_step"], meta["accumulate_step"]) == (2, [2] * 4, 2)
    # 0.2's spelling read back: a plan file, and a checkpoint `eval` describes.
    old = {("accumulate_steps" if k == "accumulate_step" else k): v for k, v in plan_file.items()}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Plan.load(str(tmp_path / "old.json")).accumulate_step == 2
    old_ckpt = save_checkpoint(MLP(), str(tmp_path / "old.ckpt"), {"model": "mlp", "accumulate_steps": 3, "step": 5})
    assert cli.main(["eval", "--ckpt", old_ckpt, "--data", data, "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{old_ckpt} (mlp, trained 5 optimizer steps with K=3)"

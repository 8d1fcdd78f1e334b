"""What ms_accum 1.0 keeps of 0.2 (the flat package of commit b9d47ed) and 0.3: every 0.2 command-line flag, and every
file they wrote (plan files and checkpoints that spell K ``accumulate_steps``). Their Python names that 0.3 kept for one
release with a warning (module paths, top-level names, the keyword ``accumulate_steps``) are gone in 1.0.0, each listed
in `ms_accum.deprecation.TABLE` with what replaces it; every JSON the command line and a plan file write spells K
``accumulate_step``."""
import importlib
import json

import pytest

import ms_accum
from ms_accum import cli
from ms_accum.deprecation import TABLE

# 0.2's `ms_accum.__all__`.
TOP_LEVEL = ["AccumulationBuffer", "Accumulator", "CharTransformer", "EquivalenceReport", "EvalResult",
             "GradientAccumulation", "LeNet5", "LossOnly", "MLP", "NonFiniteError", "Plan", "StepRecord",
             "TokenCrossEntropy", "TrainAccumulationCell", "TrainClear", "TrainForwardBackward", "TrainOptim",
             "TrainResult", "TrainWindowCell", "TrainingState", "evaluate", "evaluate_checkpoint",
             "init_data_parallel", "plan", "recompute_cells", "replace_batchnorm", "scale_lr", "verify_equivalence"]

# 0.2's modules (its private `_ops` too).
MODULES = ["_ops", "accumulator", "buffer", "causes", "cells", "checkpoint", "data", "evaluation", "executor",
           "factory", "guard", "losses", "lr", "models", "norm", "parallel", "planner", "recompute", "resume",
           "runtime", "schedule", "statistics", "verify", "window"]


def test_each_top_level_name_of_0_2_is_at_the_top_or_says_where_it_went():
    for name in TOP_LEVEL:
        if name in ms_accum.__all__:
            assert getattr(ms_accum, name) is not None
            continue
        entry = TABLE[f"ms_accum.{name}"]  # a name that left the top is in the table
        with pytest.raises(ImportError, match=f"'ms_accum.{name}' was removed in ms_accum {entry.removed_in}: "):
            getattr(ms_accum, name)
        layer = entry.use.split("'")[1]  # "import it from 'ms_accum.demo'": the name is there
        assert getattr(importlib.import_module(layer), name) is not None, (name, layer)


@pytest.mark.parametrize("module", MODULES)
def test_each_0_2_module_path_is_gone_and_the_table_says_where(module):
    if module == "runtime":  # never moved
        assert importlib.import_module("ms_accum.runtime").set_device is ms_accum.set_device
        return
    assert TABLE[f"ms_accum.{module}"].removed_in == "1.0.0"
    with pytest.raises(ModuleNotFoundError, match=f"No module named 'ms_accum.{module}'"):
        importlib.import_module(f"ms_accum.{module}")


def test_the_0_2_keyword_of_k_is_gone():
    from ms_accum.train import Plan, StepRecord, Trial
    for kind in (Plan, StepRecord, Trial):
        assert TABLE[f"ms_accum.train.{kind.__name__}(accumulate_steps=...)"].removed_in == "1.0.0"
        with pytest.raises(TypeError, match="unexpected keyword argument 'accumulate_steps'"):
            kind(accumulate_steps=4)


# The 0.2 command line: every command and flag is still accepted (K's flag in its old spelling, until 2.0.0).
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
    assert cli.main(["verify", "--accumulate-step", "2", *common]) == 0
    verified = json.loads(capsys.readouterr().out.splitlines()[-1])
    # K's old flag still trains, and says what to write instead (`ms_accum.deprecation`).
    assert cli.main(["train", "--accumulate-steps", "2", "--ckpt-dir", str(tmp_path / "c"), "--no-eval", *common]) == 0
    said = capsys.readouterr()
    trained = json.loads(said.out.splitlines()[-1])
    assert ("ms-accum train: warning: 'ms-accum train --accumulate-steps' is deprecated since ms_accum 1.0.0 and will "
            "be removed in 2.0.0; use --accumulate-step.") in said.err.splitlines()
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

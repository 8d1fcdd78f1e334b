"""What the command line says when something fails: one line, in its own terms.

- A newcomer's model (`fixtures/tokens.py`: a token-bag classifier batched with ``drop_remainder=True`` over 512
  training and 128 evaluation samples) is evaluated in its own micro-batches, or in --eval-batch-size; an evaluation
  split that yields no batch, or data of another shape, is one line naming the factory, the split and the batch size,
  and `train` still reports the checkpoint it saved.
- Each command, with the data failing where it is read, ends with one line on stderr, after the frames of the user's
  code that raised (run as a user runs it, in a fresh process, so MindSpore's own log would show too).
- When something fails (`ms_accum.cli.failure`): a bad argument is one line; an error in the user's code shows the
  user's frames (file, line, code; those MindSpore quotes of a construct it compiled or a dataset's function too),
  then the line; an error in ms_accum's own code says it is a bug and how to report it; --traceback and
  MS_ACCUM_TRACEBACK=1 show the whole stack of any error.
- Every error the command line prints names flags, files and commands, never the library's classes, methods or
  keywords: the walk below checks each whole message, and each against that rule.
"""
import json
import os
import re
import subprocess
import sys

import pytest

import ms_accum
from ms_accum import cli
from ms_accum.deprecation import TABLE
from ms_accum.demo.data import make_synthetic_mnist
from ms_accum.demo.models import MLP
from ms_accum.train.checkpoint import load_checkpoint, save_checkpoint
from ms_accum.train.plan import Plan, network_fingerprint
from conftest import cli_error

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
DISK = "RuntimeError: Exception thrown from user defined Python function in dataset. OSError: the disk went away"


def run_cli(*args, cwd):
    """The command in a fresh process, as a user runs it, with the fixtures' factories importable and MindSpore's log
    level left to the command line."""
    env = {key: value for key, value in os.environ.items() if key != "GLOG_v"}
    env["PYTHONPATH"] = os.pathsep.join([FIXTURES, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "ms_accum.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.fixture
def tokens(monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)  # where a user's module would be: importable


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
def test_a_newcomers_model_is_evaluated_in_its_own_micro_batches_or_as_asked(tokens, tmp_path, capsys):
    # 128 evaluation samples: the 256 that evaluation used to ask for were no batch at all.
    assert cli.main(["train", "--model", "tokens:build", "--batch-size", "16", "--accumulate-step", "2",
                     "--ckpt-dir", str(tmp_path), "--json", "--quiet"]) == 0
    trained = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert trained["batches"] == 128 // 16 and 0 <= trained["accuracy"] <= 1
    ckpt = trained["checkpoint"]
    assert cli.main(["eval", "--ckpt", ckpt, "--json", "--quiet"]) == 0  # the micro-batch the checkpoint records
    evaluated = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (evaluated["batches"], evaluated["accuracy"], evaluated["loss"]) == (
        8, trained["accuracy"], pytest.approx(trained["loss"], rel=1e-6))
    for flag in ("--eval-batch-size", "--batch-size"):  # eval's 0.2 spelling of it still works
        assert cli.main(["eval", "--ckpt", ckpt, flag, "32", "--json", "--quiet"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["batches"] == 4
    assert cli.main(["train", "--model", "tokens:build", "--batch-size", "16", "--accumulate-step", "2",
                     "--eval-batch-size", "64", "--ckpt-dir", str(tmp_path / "again"), "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["batches"] == 2


@pytest.mark.slow  # make test-all (make test answers within 8 minutes)
def test_an_evaluation_that_cannot_run_is_one_line_and_train_still_reports_its_checkpoint(tmp_path):
    common = ["--batch-size", "16", "--accumulate-step", "2", "--ckpt-dir", str(tmp_path), "--json", "--quiet"]
    out = run_cli("train", "--model", "tokens:build", "--eval-batch-size", "256", *common, cwd=tmp_path)
    ckpt = str(tmp_path / "tokens_build.ckpt")
    assert out.returncode == 1 and one_line(out.stderr) == (
        f"ms-accum train: error: For 'ms-accum train', dataset(256, 'eval', 0, 1) of the factory 'tokens:build' yields "
        f"no batch: its 'eval' split holds 128 sample(s), fewer than one batch of 256. Training finished and saved "
        f"{ckpt}: evaluate it with 'ms-accum eval --ckpt {ckpt} --eval-batch-size 128'.")
    summary = json.loads(out.stdout.strip().splitlines()[-1])  # what training did, for a script to read
    assert summary["checkpoint"] == ckpt and summary["optimizer_steps"] == 16 and "accuracy" not in summary
    assert load_checkpoint(ckpt)[1]["step"] == 16
    out = run_cli("eval", "--ckpt", ckpt, "--eval-batch-size", "200", cwd=tmp_path)
    assert out.returncode == 1 and one_line(out.stderr) == (
        "ms-accum eval: error: For 'ms-accum eval', dataset(200, 'eval', 0, 1) of the factory 'tokens:build' yields "
        "no batch: its 'eval' split holds 128 sample(s), fewer than one batch of 200. Pass a --eval-batch-size of at "
        "most 128.")
    # An evaluation split of another shape than the network takes: MindSpore's reason, in one line.
    out = run_cli("train", "--model", "tokens:flat_eval", *common, cwd=tmp_path)
    ckpt = str(tmp_path / "tokens_flat_eval.ckpt")
    assert out.returncode == 1 and one_line(out.stderr) == (
        f"ms-accum train: error: For 'ms-accum train', evaluating the factory 'tokens:flat_eval' on its dataset(16, "
        f"'eval', 0, 1) failed: ValueError: Features shape length must be equal to Labels shape length plus 1. "
        f"Training finished and saved {ckpt}: evaluate it with 'ms-accum eval --ckpt {ckpt}'.")
    assert json.loads(out.stdout.strip().splitlines()[-1])["checkpoint"] == ckpt


def without_markers(stderr: str) -> list:
    """The lines of `stderr` without the position markers (``^^^^``, ``~~^^~``) under a frame's code, which Python
    3.11 on prints and other versions do not."""
    return [line for line in stderr.rstrip("\n").splitlines() if line.strip(" ^~")]


def frame(path: str, function: str, code: str) -> list:
    """A frame of `path`'s `function` at its line `code` as a traceback prints it: the file and line, then the code."""
    lines = open(path, encoding="utf-8").read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"def {function}("))
    number = next(i for i, line in enumerate(lines) if i > start and line.strip() == code) + 1
    return [f'  File "{path}", line {number}, in {function}', f"    {code}"]


TOKENS = os.path.join(FIXTURES, "tokens.py")
GONE = 'raise OSError("the disk went away")'


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("command", ["train", "eval", "verify", "plan"])
def test_each_command_ends_in_one_line_when_its_data_fails_where_it_is_read(command, tmp_path):
    """The factory's data raises where the command reads it: in the training pipeline, in the evaluation pipeline, in
    `sample` (verify reads K*B samples; the planner's trial reads its windows in a fresh process, whose frames it
    carries back). The user's frames come first, those MindSpore quotes of the pipeline's map function too."""
    ckpt = str(tmp_path / "tokens_failing_eval.ckpt")
    header = "Traceback (most recent call last, your code's frames):"
    pipeline = [header, *frame(TOKENS, "read", GONE), DISK]
    commands = {
        "train": (["train", "--model", "tokens:failing_train", "--batch-size", "16", "--ckpt-dir", str(tmp_path)],
                  pipeline, f"ms-accum train: error: {DISK} (while training on dataset(16, 'train', 0, 1) of the "
                            f"factory 'tokens:failing_train')"),
        "eval": (["eval", "--ckpt", ckpt], pipeline,
                 f"ms-accum eval: error: For 'ms-accum eval', evaluating the factory 'tokens:failing_eval' on its "
                 f"dataset(16, 'eval', 0, 1) failed: {DISK}."),
        "verify": (["verify", "--model", "tokens:failing_sample", "--batch-size", "4"],
                   [header, *frame(TOKENS, "failing", GONE), "OSError: the disk went away"],
                   "ms-accum verify: error: For 'ms-accum verify', sample(16) of the factory 'tokens:failing_sample' "
                   "failed: OSError: the disk went away."),
        "plan": (["plan", "--model", "tokens:failing_sample", "--global-batch", "16", "--memory", "1GiB"],
                 [header, *frame(TOKENS, "failing", GONE), "OSError: the disk went away"],
                 "ms-accum plan: error: For 'ms-accum plan', a micro-batch of 1 sample(s) could not be trained: "
                 "sample(65) of the factory 'tokens:failing_sample' failed: OSError: the disk went away."),
    }
    if command == "eval":  # a checkpoint of the factory whose evaluation data fails, trained without evaluating
        made = run_cli("train", "--model", "tokens:failing_eval", "--batch-size", "16", "--ckpt-dir", str(tmp_path),
                       "--no-eval", "--quiet", cwd=tmp_path)
        assert made.returncode == 0, made.stderr[-2000:]
    argv, frames, message = commands[command]
    out = run_cli(*argv, "--quiet", cwd=tmp_path)
    assert out.returncode == 1 and without_markers(out.stderr) == [*frames, message], out.stderr[-3000:]


# --- Whose error it was: the user's frames, one line, or a bug. ---

HEADER = "Traceback (most recent call last, your code's frames):"
ZERO = '''\
def helper(width):
    return width // 0


def build():
    width = helper(16)
    return width
'''
ZERO_LINE = ("ms-accum train: error: For 'ms-accum train', the factory 'zero_factory:build' failed: ZeroDivisionError: "
             "integer division or modulo by zero.")


@pytest.fixture
def zero_factory(tmp_path, monkeypatch):
    """A user's factory, beside the command as a user's module is, whose build() calls a helper that divides by 0."""
    path = tmp_path / "zero_factory.py"
    path.write_text(ZERO)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "zero_factory", raising=False)  # imported again, from this test's directory
    return str(path)


def test_an_error_in_the_users_code_shows_its_frames_then_the_line(zero_factory, capsys):
    assert cli.main(["train", "--model", "zero_factory:build", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert without_markers(err) == [
        HEADER, *frame(zero_factory, "build", "width = helper(16)"), *frame(zero_factory, "helper", "return width // 0"),
        "ZeroDivisionError: integer division or modulo by zero", ZERO_LINE]
    assert f"{os.sep}ms_accum{os.sep}" not in err  # the user's frames only


@pytest.mark.parametrize("asked", ["after the command", "before it", "MS_ACCUM_TRACEBACK=1"])
def test_traceback_shows_the_whole_stack_of_any_error(asked, zero_factory, capsys, monkeypatch):
    """Every frame of every exception of the chain, ms_accum's included, then the line; for an argument refused too.
    Asked by --traceback after the command or before it, or by the environment."""
    before, after = (["--traceback"] if asked == "before it" else []), (["--traceback"] if asked.startswith("after")
                                                                         else [])
    if asked.startswith("MS_"):
        monkeypatch.setenv(*asked.split("="))
    assert cli.main([*before, "train", "--model", "zero_factory:build", "--quiet", *after]) == 1
    lines = without_markers(capsys.readouterr().err)
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == ZERO_LINE
    text = "\n".join(lines)
    for shown in (os.path.join("ms_accum", "tools", "factory.py"), os.path.join("ms_accum", "cli", "__init__.py"),
                  "\n".join(frame(zero_factory, "helper", "return width // 0")),
                  "The above exception was the direct cause of the following exception:",
                  "ms_accum._validation.ArgumentValueError: For 'ms-accum train', the factory 'zero_factory:build' "
                  "failed"):
        assert shown in text, shown
    assert cli.main([*before, "train", "--lr-rule", "sqrt", "--quiet", *after]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and os.path.join("ms_accum", "cli", "job.py") in lines[-4]
    assert lines[-1] == ("ms-accum train: error: For 'ms-accum train', --lr-rule needs --adaptive-k: it says how K "
                         "follows the noise scale.")


def test_a_bad_argument_is_one_line_and_a_usage_error_keeps_argparse_s_exit(capsys):
    assert cli.main(["train", "--lr-rule", "sqrt", "--quiet"]) == 1
    assert capsys.readouterr().err == ("ms-accum train: error: For 'ms-accum train', --lr-rule needs --adaptive-k: it "
                                       "says how K follows the noise scale.\n")
    with pytest.raises(SystemExit) as refused:  # argparse's usage error (exit 2), --traceback or not
        cli.main(["train", "--batch-size", "0", "--traceback"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err
    assert cli_error(err) == ("ms-accum train: error: For 'ms-accum train', the argument '--batch-size' must be a "
                              "positive int, but got 0.")
    # argparse's own refusals, a required flag missing and a flag no parser knows, in the same style
    for argv, line in ((["plan"], "ms-accum plan: error: For 'ms-accum plan', the argument '--global-batch' must be "
                                  "given."),
                       (["train", "--bogus"], "ms-accum: error: For 'ms-accum train', the argument '--bogus' is not "
                                              "one it takes (see --help).")):
        with pytest.raises(SystemExit) as refused:
            cli.main(argv)
        assert refused.value.code == 2 and cli_error(capsys.readouterr().err) == line


def test_an_error_in_ms_accum_s_own_code_says_it_is_a_bug(capsys, monkeypatch):
    """A bug stands in: the command reads an option no parser defines. operator.attrgetter is C, so the error is raised
    in ms_accum's own frame (`main`), as a bug's would be."""
    import operator
    monkeypatch.setattr(cli.train, "run", operator.attrgetter("no_such_option"))
    assert cli.main(["train", "--quiet"]) == 1
    assert capsys.readouterr().err == (
        f"ms-accum train: error: AttributeError: 'Namespace' object has no attribute 'no_such_option'\n"
        f"ms-accum train: this is a bug in ms_accum {ms_accum.__version__}: please report it with the output of the "
        f"same command with --traceback and what 'ms-accum env --json' prints, on the project's issue tracker "
        f"(README.md, Reporting a problem).\n")
    assert cli.main(["train", "--quiet", "--traceback"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-2:] == [
        "ms-accum train: error: AttributeError: 'Namespace' object has no attribute 'no_such_option'",
        f"ms-accum train: this is a bug in ms_accum {ms_accum.__version__}: please report it with this output and what "
        f"'ms-accum env --json' prints, on the project's issue tracker (README.md, Reporting a problem)."]


def test_help_says_what_a_failure_shows():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001  (argparse keeps them only there)
    for helped in (parser, *commands.values()):
        text = " ".join(helped.format_help().split())
        assert "your code's frames" in text and "--traceback, or MS_ACCUM_TRACEBACK=1" in text, helped.prog
    assert set(commands) == {"train", "eval", "verify", "plan", "env"}
    assert all("--traceback" in command.format_help() for command in commands.values())


# The message MindSpore 2.10 raises for a construct it cannot compile (a matmul of shapes 3 and 5 in the training
# branch of the user's network), and for a dataset's map function that raised: its lines, with these files.
COMPILED = """For 'MatMulExt' op, shape1[-1] must be equal to shape2[-2], but got 3 and 5.

----------------------------------------------------
- C++ Call Stack: (For framework developers)
----------------------------------------------------
mindspore/ops/infer/ops_func_impl//matmul_ext.cc:43 CheckMatMulShapes

----------------------------------------------------
- The Traceback of Net Construct Code:
----------------------------------------------------
# 0 In file {cells}:130, 14~35
        out = self.network(*inputs)
              ^~~~~~~~~~~~~~~~~~~~~
# 1 In file {user}:7~8, 8~37
        if self.training:
# 2 In file {user}:8, 12~37
            y = ops.matmul(y, self.w)
            ^~~~~~~~~~~~~~~~~~~~~~~~~
# 3 In file {user}:8, 16~37
            y = ops.matmul(y, self.w)
                ^~~~~~~~~~~~~~~~~~~~~
# 4 In file {mindspore}:8724, 11~49
    return auto_generate.matmul_ext(input, other)
           ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
 (See file 'rank_0/om/analyze_fail.ir' for more details.)"""
MAPPED = """Exception thrown from user defined Python function in dataset.

------------------------------------------------------------------
- Python Call Stack:
------------------------------------------------------------------
map operation: [PyFunc] failed. Error description:
ZeroDivisionError: Traceback (most recent call last):
  File "{mindspore}", line 202, in __call__
    result = self.transform(*args)
             ^^^^^^^^^^^^^^^^^^^^^
  File "{user}", line 13, in boom
    return a / helper(3)
               ^^^^^^^^^
  File "{user}", line 17, in helper
    return width // 0
           ~~~~~~^^~~
ZeroDivisionError: integer division or modulo by zero
"""
NETWORK = '''\
from mindspore import nn, ops


class Wide(nn.Cell):
    def construct(self, x):
        y = self.dense(x)
        if self.training:
            y = ops.matmul(y, self.w)
        return y


def boom(a):
    return a / helper(3)


def helper(width):
    return width // 0
'''


def test_the_frames_mindspore_quotes_are_the_users(tmp_path):
    """A graph's compile error and a pipeline's Python error are raised from MindSpore's frames; the user's lines are
    in its message, and shown as frames: one per function of the user's (the construct's innermost expression)."""
    import mindspore
    from ms_accum.cli import failure
    from ms_accum.graphs import cells
    user = tmp_path / "wide_network.py"
    user.write_text(NETWORK)
    files = {"cells": cells.__file__, "user": str(user), "mindspore": mindspore.__file__}
    assert failure.users_traceback(RuntimeError(COMPILED.format(**files))).splitlines() == [
        HEADER, *frame(str(user), "construct", "y = ops.matmul(y, self.w)"),
        "RuntimeError: For 'MatMulExt' op, shape1[-1] must be equal to shape2[-2], but got 3 and 5."]
    assert failure.users_traceback(RuntimeError(MAPPED.format(**files))).splitlines() == [
        HEADER, *frame(str(user), "boom", "return a / helper(3)"), *frame(str(user), "helper", "return width // 0"),
        "RuntimeError: Exception thrown from user defined Python function in dataset. ZeroDivisionError: integer "
        "division or modulo by zero"]
    assert failure.users_traceback(RuntimeError(COMPILED.format(cells=cells.__file__, user=cells.__file__,
                                                                mindspore=mindspore.__file__))) == ""


WIDE_FACTORY = '''\
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.dataset import NumpySlicesDataset


class Wide(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(6, 3)
        self.w = Parameter(Tensor(np.ones((5, 7), np.float32)))

    def construct(self, x):
        y = self.dense(x)
        if self.training:
            y = ops.matmul(y, self.w)
        return y


def build():
    network = Wide()

    def sample(n):
        return np.ones((n, 6), np.float32), np.zeros(n, np.int32)

    def dataset(batch_size, usage, shard_id, num_shards):
        return NumpySlicesDataset(sample(32), column_names=["data", "label"], shuffle=False).batch(batch_size, True)
    return (network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
            nn.SGD(network.trainable_params()), sample, dataset)
'''


@pytest.mark.slow  # make test-all: compiles a graph
def test_a_construct_that_does_not_compile_shows_the_users_line(tmp_path, monkeypatch, capsys):
    """The network takes sample(2) in inference mode (the factory's check) and fails to compile for training: the
    line MindSpore names in the user's construct is shown as the user's frame."""
    user = tmp_path / "wide_factory.py"
    user.write_text(WIDE_FACTORY)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--model", "wide_factory:build", "--batch-size", "8", "--quiet", "--no-eval"]) == 1
    lines = without_markers(capsys.readouterr().err)
    assert lines[:3] == [HEADER, *frame(str(user), "construct", "y = ops.matmul(y, self.w)")], lines
    assert lines[-1].startswith("ms-accum train: error: RuntimeError: For 'MatMulExt' op, shape1[-1] must be equal to "
                                "shape2[-2], but got 3 and 5.")


# --- The walk: every error the command line can print, whole, in the command's terms. ---

# Names a command-line message must not show: the library's public names, its methods, the keywords its messages use
# for what the command line sets with a flag.
LIBRARY = sorted({name for name in list(ms_accum.__all__) + [key.split(".")[1] for key in TABLE
                                                              if key.count(".") == 1 and "(" not in key]
                  if name[0].isupper() or "_" in name}
                 | {"train_process", "from_plan", "check_fits", "Plan.save", "Plan.load", "Checkpoints"})


def assert_in_command_terms(line: str, command: str) -> None:
    assert line.startswith(f"ms-accum {command}: "), line
    assert set(re.findall(r"For '([^']*)'", line)) <= {f"ms-accum {command}"}, line
    named = [name for name in LIBRARY if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", line)]
    assert not named, (named, line)
    keywords = [name for name in cli.FLAGS if "_" in name and re.search(rf"(?<![\w-]){name}(?![\w-])", line)]
    keywords += [name for name in cli.FLAGS if re.search(rf"(?<![\w-]){name}=", line)]
    assert not keywords, (keywords, line)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """MNIST-format data of 256 training images, an MLP run's training states (windows of 2 x 8, one saved every 4
    windows, the newest two kept) and its checkpoint, plans and a checkpoint of the MLP as MindSpore saves it."""
    root = tmp_path_factory.mktemp("walk")
    data = make_synthetic_mnist(str(root / "data"), num_train=256, num_test=64)
    assert cli.main(["train", "--model", "mlp", "--batch-size", "8", "--accumulate-step", "2", "--data", data,
                     "--ckpt-dir", str(root / "ck"), "--save-every", "4", "--no-eval", "--quiet"]) == 0
    Plan("mlp", 16, 2, 4, 2, "fused", "mean", 10.0, 20.0, 20.0, 1.0, 2.0, "CPU").save(str(root / "ranks.json"))
    Plan("mlp", 16, 1, 8, 2, "fused", "mean", 10.0, 20.0, 20.0, 1.0, 2.0, "CPU", [],
         {"parameters": 1, "values": 2, "hash": "0123456789abcdef"}).save(str(root / "network.json"))
    save_checkpoint(MLP(), str(root / "mlp.ckpt"), {"model": "mlp"})
    return {"root": str(root), "data": data, "ck": str(root / "ck"), "state": str(root / "ck" / "mlp-000000016.ckpt")}


MLP_RUN = ["--model", "mlp", "--batch-size", "8", "--quiet", "--no-eval"]
NOISE = ("a micro-batch's gradient here is its share of one window loss, not a gradient of a loss of its own, and its "
         "norm says nothing about the gradient noise.")
WALK = [  # (argv with {names} of `files`, the whole line; None: nothing is said)
    (["train", *MLP_RUN, "--data", "{data}", "--accumulate-step", "3", "--ckpt-dir", "{ck}", "--resume"],
     "Checkpoint '{state}' was saved with a global batch of 16 samples per update (--accumulate-step 2 x --batch-size "
     "8), but this run has 24 (--accumulate-step 3 x --batch-size 8): resuming would not continue the same training; "
     "--accumulate-step 2 keeps it."),
    (["train", *MLP_RUN, "--data", "{data}", "--accumulate-step", "2", "--ckpt-dir", "{ck}", "--resume",
      "--partial-window", "drop"],
     "Checkpoint '{state}' was saved with --partial-window apply, but this run has --partial-window drop: resuming "
     "would not continue the same training."),
    (["train", *MLP_RUN, "--data", "{data}", "--accumulate-step", "2", "--ckpt-dir", "{ck}", "--resume", "--seed",
      "3"],
     "Checkpoint '{state}' was saved with --seed 0, but this run has --seed 3: resuming would not continue the same "
     "training."),
    (["train", *MLP_RUN, "--data", "{data}", "--accumulate-step", "2", "--ckpt-dir", "{ck}", "--resume",
      "{ck}/mlp.ckpt"],
     "Checkpoint '{ck}/mlp.ckpt' holds no training state to resume from (it was not saved with '--save-every')."),
    (["train", *MLP_RUN, "--data", "{data}", "--accumulate-schedule", "0:2,64:4", "--ckpt-dir", "{ck}", "--resume"],
     "Checkpoint '{state}' was saved by a run whose global batch schedule (samples consumed: global batch) is 0:16, "
     "but this run's is 0:16,64:32: from 64 samples consumed the saved run's global batch is 16, this run's 32; "
     "resuming would not continue the same training."),
    (["train", *MLP_RUN, "--data", "{data}", "--accumulate-step", "1", "--noise-scale", "--ckpt-dir", "{root}/n"],
     "For 'ms-accum train', the argument '--accumulate-step' must be at least 2 in some window with --noise-scale on "
     "one rank: the noise scale compares the micro-batch's gradient with the window's, and with one micro-batch per "
     "window they are one batch size, but got 1."),
    (["train", *MLP_RUN, "--data", "{data}", "--adaptive-k", "2:8", "--ckpt-dir", "{ck}", "--resume"],
     "Checkpoint '{state}' was saved by a run whose K came from the global batch schedule (samples consumed: global "
     "batch) 0:16, but this run's comes from --adaptive-k 2:8 --adaptive-fraction 1.0 --lr-rule none --batch-size 8: "
     "resuming would not continue the same training."),
    (["train", *MLP_RUN, "--data", "{data}", "--adaptive-k", "1:8", "--ckpt-dir", "{root}/a"],
     "For 'ms-accum train', the argument '--adaptive-k' must be at least 2 on one rank, but got 1: the noise scale "
     "compares the micro-batch's gradient with the window's, and a window of one micro-batch has one batch size, so K "
     "would never move."),
    (["train", *MLP_RUN, "--data", "{data}", "--adaptive-k", "2:8", "--accumulate-step", "4", "--ckpt-dir", "{root}/a"],
     "For 'ms-accum train', --adaptive-k sets K: give it without --accumulate-step."),
    (["train", *MLP_RUN, "--data", "{data}", "--lr-rule", "sqrt", "--ckpt-dir", "{root}/a"],
     "For 'ms-accum train', --lr-rule needs --adaptive-k: it says how K follows the noise scale."),
    (["train", "--data", "{data}", "--plan", "{root}/missing.json", "--ckpt-dir", "{root}/p"],
     "For 'ms-accum train', the file '{root}/missing.json' is not a plan written by 'ms-accum plan --output': [Errno "
     "2] No such file or directory: '{root}/missing.json'"),
    (["train", "--data", "{data}", "--plan", "{root}/ranks.json", "--ckpt-dir", "{root}/p"],
     "For 'ms-accum train', the plan '{root}/ranks.json' was made for 2 rank(s) (a global batch of 16 = K 2 x B 4 x 2 "
     "rank(s)), but this run has 1: plan again for 1 rank(s)."),
    (["train", "--data", "{data}", "--plan", "{root}/network.json", "--ckpt-dir", "{root}/p"],
     "For 'ms-accum train', the plan '{root}/network.json' was made for another network, 1 trainable parameters of 2 "
     "values (hash 0123456789abcdef), but the network given has 6 trainable parameters of 669706 values (hash {mlp}): "
     "plan again for this network."),
    (["train", *MLP_RUN, "--data", "{data}", "--structure", "cached", "--skip-outliers", "3", "--ckpt-dir", "{root}/s"],
     "For 'ms-accum train', the argument '--skip-outliers' must not be given with --structure cached, but got 3.0: a "
     "micro-batch left out would still be in the loss that made the others' gradients, so the update would equal no "
     "large-batch step."),
    (["train", *MLP_RUN, "--data", "{data}", "--structure", "cached", "--noise-scale", "--ckpt-dir", "{root}/s"],
     f"For 'ms-accum train', the arguments '--statistics' and '--noise-scale' must not be given with --structure "
     f"cached, but got no --statistics, --noise-scale: {NOISE}"),
    (["train", "--model", "tokens:per_sample_loss", "--batch-size", "16", "--ckpt-dir", "{root}/t", "--quiet"],
     "For 'ms-accum train', the loss_fn of the factory 'tokens:per_sample_loss' must reduce the batch to a scalar, but "
     "got SoftmaxCrossEntropyWithLogits with reduction 'none': build it with reduction='mean' (or 'sum')."),
    (["train", "--model", "tokens:build", "--batch-size", "1024", "--ckpt-dir", "{root}/t", "--quiet"],
     "For 'ms-accum train', dataset(1024, 'train', 0, 1) of the factory 'tokens:build' yields no batch: its 'train' "
     "split holds 512 sample(s), fewer than one batch of 1024. Pass a --batch-size of at most 512."),
    (["train", "--model", "tokens:diverging", "--batch-size", "16", "--accumulate-step", "2", "--stop-on-nonfinite",
      "--ckpt-dir", "{root}/t", "--quiet"],
     "For 'ms-accum train', epoch 1 step 2: the window's gradient or loss is not finite, so it was skipped "
     "(parameters unchanged; 1 window(s) skipped so far); stopping, as --stop-on-nonfinite asks."),
    (["train", "--distributed", "--data", "{data}", "--ckpt-dir", "{root}/d", "--quiet"],
     "For 'ms-accum train', distributed mode requested without a launcher: start it with msrun in front of its "
     "command, e.g. 'msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True <command>' (the "
     "environment variables MS_ROLE and MS_WORKER_NUM are not set)."),
    (["eval", "--ckpt", "{root}/mlp.ckpt", "--model", "lenet5", "--data", "{data}", "--quiet"],
     "Checkpoint '{root}/mlp.ckpt' was saved with --model mlp, but --model lenet5 was asked for."),
    (["verify", "--model", "mlp", "--batch-size", "32", "--accumulate-step", "16", "--data", "{data}", "--quiet"],
     "For 'ms-accum verify', --accumulate-step 16 x --batch-size 32 needs 512 training images, but {data} holds "
     "256."),
    (["verify", "--model", "tokens:per_sample_loss", "--batch-size", "4", "--quiet"],
     "For 'ms-accum verify', the loss_fn of the factory 'tokens:per_sample_loss' must reduce the batch to a scalar, "
     "but got SoftmaxCrossEntropyWithLogits with reduction 'none': build it with reduction='mean' (or 'sum')."),
    (["plan", "--model", "tokens:build", "--global-batch", "15", "--ranks", "2", "--quiet"],
     "For 'ms-accum plan', the argument '--global-batch' must be divisible by '--ranks' (2), but got 15."),
    (["plan", "--model", "tokens:build", "--global-batch", "16", "--output", "{root}", "--quiet"],
     "For 'ms-accum plan', the argument '--output' must be a file path that can be written, but got '{root}', a "
     "directory."),
    # Refused in the check's fresh process, and said here in flags: the error crossed back as data, not as text.
    (["plan", "--model", "tokens:per_sample_loss", "--global-batch", "16", "--memory", "1GiB", "--quiet"],
     "For 'ms-accum plan', the loss_fn of the factory 'tokens:per_sample_loss' must reduce the batch to a scalar, but "
     "got SoftmaxCrossEntropyWithLogits with reduction 'none': build it with reduction='mean' (or 'sum')."),
]


@pytest.mark.slow  # make test-all: make test keeps the core (docs/testing.md)
@pytest.mark.parametrize("argv, message", WALK, ids=[f"{i}-{argv[0]}" for i, (argv, _) in enumerate(WALK)])
def test_every_error_the_command_line_prints_names_flags_files_and_commands(argv, message, files, tokens, capsys):
    names = {**files, "mlp": network_fingerprint(MLP())["hash"]}
    argv = [arg.format(**names) for arg in argv]
    assert cli.main(argv) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"ms-accum {argv[0]}: error: {message.format(**names)}"
    assert_in_command_terms(line, argv[0])


def test_a_warning_and_a_full_disk_are_told_in_the_command_s_terms(files, tmp_path, capsys, monkeypatch):
    run = ["train", *MLP_RUN, "--data", files["data"], "--ckpt-dir", str(tmp_path)]
    assert cli.main(run + ["--accumulate-step", "64"]) == 0  # 32 batches an epoch: one partial window
    line = cli_error(capsys.readouterr().err)
    assert line == ("ms-accum train: warning: '--accumulate-step' (64) is larger than an epoch's 32 batches: every "
                    "window is partial and is applied at the end of the epoch.")
    assert_in_command_terms(line, "train")
    replace = os.replace

    def no_room_for_step_4(source, target):  # the disk fills up as the training state of step 4 is written
        if str(target).endswith("mlp-000000004.ckpt"):
            raise OSError(28, "No space left on device")
        return replace(source, target)
    monkeypatch.setattr(os, "replace", no_room_for_step_4)
    full = tmp_path / "full"
    run[run.index("--ckpt-dir") + 1] = str(full)
    assert cli.main(run + ["--accumulate-step", "2", "--save-every", "2"]) == 1
    line = cli_error(capsys.readouterr().err)
    assert line == (f"ms-accum train: error: For 'ms-accum train', 'mlp-000000004.ckpt' could not be written in "
                    f"'{full}': No space left on device. No earlier file was changed. The newest complete training "
                    f"state is 'mlp-000000002.ckpt': --resume continues from it.")
    assert_in_command_terms(line, "train")
    assert os.listdir(full) == ["mlp-000000002.ckpt"]  # and no temporary file left


def test_an_error_the_tool_did_not_foresee_is_one_line_saying_what_the_command_was_doing(files, capsys, monkeypatch):
    """Not the tool's own error: its type, its first line, and what the command was doing."""
    import mindspore.dataset
    from ms_accum.demo import data

    def unreadable(*args, **kwargs):
        raise MemoryError("cannot allocate the decoded images\n\nC++ stack of the allocator")
    # Raised in MindSpore's reader, which it stands for: a frame of this file would be the user's code.
    unreadable.__code__ = unreadable.__code__.replace(co_filename=mindspore.dataset.__file__)
    monkeypatch.setattr(data, "dataset_for", unreadable)
    assert cli.main(["train", *MLP_RUN, "--data", files["data"], "--ckpt-dir", files["root"] + "/m"]) == 1
    assert capsys.readouterr().err == ("ms-accum train: error: MemoryError: cannot allocate the decoded images (while "
                                       "reading the data of mlp)\n")
    assert cli.main(["verify", "--model", "mlp", "--data", files["data"]]) == 1
    assert capsys.readouterr().err == (f"ms-accum verify: error: MemoryError: cannot allocate the decoded images "
                                       f"(while reading the MNIST training images in {files['data']})\n")


def test_a_reworded_library_message_is_followed_by_the_command_line(files, tmp_path, capsys, monkeypatch):
    """Errors are data: the command line renders the arguments a message names, whatever the wording around them.
    The library's check is replaced by one that words the same refusal otherwise; the line follows it, in flags."""
    import ms_accum.train.structures.cached as cached
    from ms_accum._validation import ArgumentValueError

    def reworded(reduction, policy, statistics, noise_scale, skip_outliers):
        if skip_outliers is not None:
            raise ArgumentValueError("a reworded refusal: {structure=} leaves out nothing, so {@skip_outliers} "
                                     "({skip_outliers}) must {_none}; {resume=} is fine.", structure="cached",
                                     skip_outliers=skip_outliers, resume=True)
        return reduction

    monkeypatch.setattr(cached, "check_cached_options", reworded)
    run = ["train", *MLP_RUN, "--data", files["data"], "--ckpt-dir", str(tmp_path), "--structure", "cached",
           "--skip-outliers", "3"]
    assert cli.main(run) == 1
    assert cli_error(capsys.readouterr().err) == (
        "ms-accum train: error: For 'ms-accum train', a reworded refusal: --structure cached leaves out nothing, so "
        "'--skip-outliers' (3.0) must not be given; --resume is fine.")
    with pytest.raises(ArgumentValueError) as refused:
        reworded("mean", "skip_window", False, False, 3.0)
    assert str(refused.value) == ("a reworded refusal: structure='cached' leaves out nothing, so 'skip_outliers' "
                                  "(3.0) must be None; resume=True is fine.")
    assert refused.value.arguments == ("structure", "skip_outliers", "resume")


def test_no_regular_expression_reads_a_message():
    """The command line renders messages from their data: no module of `ms_accum.cli` imports `re`, and the library
    builds no message by substituting into another's text."""
    import ast
    import pathlib
    package = pathlib.Path(cli.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names} | {node.module for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom) and node.module}
        assert "re" not in imported, path

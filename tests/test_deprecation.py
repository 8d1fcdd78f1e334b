"""The deprecation table (`ms_accum.deprecation`): every entry well formed, every removed entry failing with the
table's line (a keyword's TypeError, a name's ImportError, an instance attribute's AttributeError, argparse's error for
a flag), every deprecation warning the package gives taken from the table, and the table's warning pointing at the
user's line."""
import ast
import functools
import inspect
import os
import pathlib
import re
import sys
import warnings

import pytest

import ms_accum
from ms_accum import deprecation
from ms_accum.deprecation import TABLE, removed, version
from removed_names import failure, importable

PACKAGE = pathlib.Path(ms_accum.__file__).parent
ROOT = PACKAGE.parent
KEYWORD = re.compile(r"^(ms_accum[\w.]*)\((\w+)=\.\.\.\)$")
FLAG = re.compile(r"^ms-accum (\w+) (--[\w-]+)$")


def _resolve(path: str):
    """The object at the dotted `path`: its longest importable module, then attributes."""
    found, names = importable(path)
    return functools.reduce(getattr, names, found)


def test_the_version_is_pyproject_s():
    """One version, written in pyproject.toml and ms_accum/__init__.py (which the table's removals compare with)."""
    declared = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert ms_accum.__version__ == declared and re.fullmatch(r"\d+\.\d+\.\d+", declared)


@pytest.mark.parametrize("key", sorted(TABLE))
def test_each_entry_is_well_formed(key):
    entry = TABLE[key]
    assert KEYWORD.match(key) or FLAG.match(key) or re.fullmatch(r"ms_accum(\.\w+)+", key), key
    assert entry.use and entry.removed_in
    if entry.deprecated_in is not None:
        assert version(entry.deprecated_in) < version(entry.removed_in), key
    if not removed(key):  # semantic versioning: what still warns goes at a major version
        assert version(entry.removed_in)[1:] == (0, 0) and version(entry.removed_in) > version(ms_accum.__version__)


@pytest.mark.parametrize("key", sorted(key for key in TABLE if removed(key)))
def test_each_removed_entry_fails_with_the_table_s_line(key, capsys):
    """A name, module path, keyword or flag whose removal version has come is gone, and fails as Python would, with
    the table's line: what replaces it and the version that removed it. A removed module's names fail at the module
    (whose line lists them); ``import ms_accum.old_module`` is Python's own ModuleNotFoundError (no import hook)."""
    entry = TABLE[key]
    keyword, flag = KEYWORD.match(key), FLAG.match(key)
    if keyword:
        owner = _resolve(keyword.group(1))
        with pytest.raises(TypeError) as raised:
            owner(**{keyword.group(2): None})
        function = owner.__init__ if isinstance(owner, type) else owner
        assert str(raised.value).startswith(f"{function.__qualname__}() got an unexpected keyword argument "
                                            f"'{keyword.group(2)}': ")
        texts = [str(raised.value)]
    elif flag:
        from ms_accum import cli
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args([flag.group(1), flag.group(2), "1"])
        assert exited.value.code == 2
        texts = [capsys.readouterr().err.strip().splitlines()[-1]]
        assert texts[0].startswith(f"ms-accum {flag.group(1)}: error: argument {flag.group(2)}: ")
    else:  # `module.name` and `from module import name`, alike (tests/removed_names.py, for any Python)
        assert failure(key) is None
        return
    for text in texts:
        assert entry.use in text and f"removed in ms_accum {entry.removed_in}" in text, text


def test_a_removed_flag_is_refused_by_argparse_with_the_table_s_line(monkeypatch, capsys):
    """No flag has reached its removal yet (``--accumulate-steps`` goes in 2.0.0): one that has is refused, with or
    without a value, as argparse refuses an argument, exit status 2."""
    from ms_accum import cli
    monkeypatch.setitem(TABLE, "ms-accum verify --old-flag", deprecation.Deprecation("use --new-flag", "0.3.0",
                                                                                    "1.0.0"))
    for argv in (["--old-flag", "3"], ["--old-flag"], ["--batch-size", "2", "--old-flag=3"]):
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args(["verify", *argv])
        assert exited.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "ms-accum verify: error: argument --old-flag: removed in ms_accum 1.0.0; use --new-flag.")
    assert "--old-flag" not in cli.build_parser()._subparsers._group_actions[0].choices["verify"].format_help()


def test_removed_from_refuses_the_table_s_keywords_and_attributes(monkeypatch):
    """The decorator the removed keywords and attributes use, on a class and on a function; anything else fails as
    Python's own error does, and the signature is the callable's."""
    gone = deprecation.Deprecation("use 'accumulate_step'", "0.3.0", "1.0.0")
    for key in ("ms_accum.Example(steps=...)", "ms_accum.Example.steps", "ms_accum.example(steps=...)"):
        monkeypatch.setitem(TABLE, key, gone)

    @deprecation.removed_from("ms_accum.Example")
    class Example:
        def __init__(self, accumulate_step: int = 1) -> None:
            self.accumulate_step = accumulate_step

    @deprecation.removed_from("ms_accum.example")
    def example(accumulate_step: int = 1) -> int:
        return accumulate_step

    line = "removed in ms_accum 1.0.0; use 'accumulate_step'."
    assert Example(accumulate_step=4).accumulate_step == 4 and example(accumulate_step=4) == 4
    assert inspect.signature(Example).parameters.keys() == inspect.signature(example).parameters.keys() == {
        "accumulate_step"}
    with pytest.raises(TypeError, match=re.escape(f"Example.__init__() got an unexpected keyword argument 'steps': "
                                                  f"{line}")):
        Example(steps=4)
    with pytest.raises(TypeError, match=re.escape(f"example() got an unexpected keyword argument 'steps': {line}")):
        example(steps=4)
    with pytest.raises(AttributeError, match=re.escape(f"'Example' object has no attribute 'steps': {line}")):
        Example().steps  # noqa: B018
    with pytest.raises(AttributeError, match=r"^'Example' object has no attribute 'stepz'$"):
        Example().stepz  # noqa: B018
    assert not hasattr(Example(), "steps") and getattr(Example(), "steps", None) is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'other'$"):
        Example(other=1)
    with pytest.raises(KeyError, match="nothing removed from 'ms_accum.Nothing'"):
        deprecation.removed_from("ms_accum.Nothing")


def test_a_removed_name_says_what_replaces_it():
    """As an attribute and in a from-import, the same ImportError: Python turns an AttributeError from a module's
    `__getattr__` into its own "cannot import name", without the line; any other name is Python's own error."""
    with pytest.raises(ImportError, match=r"^'ms_accum\.LeNet5' was removed in ms_accum 1\.0\.0: import it from "
                                          r"'ms_accum\.demo'\.$"):
        ms_accum.LeNet5  # noqa: B018
    with pytest.raises(AttributeError, match="^module 'ms_accum' has no attribute 'nothing'$"):
        ms_accum.nothing  # noqa: B018
    with pytest.raises(ImportError, match=r"^'ms_accum\.LeNet5' was removed in ms_accum 1\.0\.0: import it from "
                                          r"'ms_accum\.demo'\.$"):
        from ms_accum import LeNet5  # noqa: F401
    with pytest.raises(ImportError, match="^cannot import name 'nothing' from 'ms_accum'"):  # Python's own
        from ms_accum import nothing  # noqa: F401
    assert not hasattr(ms_accum, "nothing")
    with pytest.raises(ImportError, match=r"'ms_accum\.executor' was removed in ms_accum 1\.0\.0: import "
                                          r"'ms_accum\.train'\. 'ms_accum\.executor\.windows_per_epoch' was removed in "
                                          r"ms_accum 1\.0\.0: use ms_accum\.train\.count_windows\("):
        ms_accum.executor.windows_per_epoch  # noqa: B018


def test_the_removed_names_check_runs_alone():
    """tests/removed_names.py, which checks every removed name on any Python (no pytest, no MindSpore needed), runs as
    the script its docstring says to run on the other Pythons of ``requires-python``."""
    import subprocess
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "removed_names.py")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert run.returncode == 0 and " 0 failed, 0 skipped" in run.stdout, run.stdout + run.stderr[-2000:]


def test_no_import_hook():
    assert not [finder for finder in sys.meta_path if type(finder).__module__.startswith("ms_accum")]


def test_only_the_table_warns_of_a_deprecation():
    """No module but `ms_accum.deprecation` uses `DeprecationWarning` in its code, so every deprecation warning has
    its text and its removal version from the table."""
    using = [f"{path.relative_to(ROOT)}:{node.lineno}"
             for path in PACKAGE.rglob("*.py") if path.name != "deprecation.py"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Name) and node.id in ("DeprecationWarning", "PendingDeprecationWarning")]
    assert not using, using


def test_every_deprecated_call_names_a_live_entry():
    """Every ``deprecated("...")`` in the package names an entry of the table that has not reached its removal."""
    keys = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("deprecated", "warn_deprecated") \
                    and node.args and isinstance(node.args[0], ast.Constant):
                keys.append(node.args[0].value)
    assert keys  # the executor's recompute keyword at least
    assert [key for key in keys if key not in TABLE or removed(key)] == []


def test_the_executor_keywords_warn_with_the_table_text_at_the_users_line():
    from mindspore import nn
    from ms_accum import GradientAccumulation
    from ms_accum.train.options import with_deprecated
    keywords = {keyword: None for keyword in deprecation.EXECUTOR_KEYWORDS}
    for keyword in keywords:
        assert deprecation.executor_key(keyword) in TABLE and not removed(deprecation.executor_key(keyword))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_deprecated({}, {"clip_norm": 1.0, "on_step": None}, ("window", "log"))
    assert [str(w.message) for w in caught] == [
        "'ms_accum.GradientAccumulation(clip_norm=...)' is deprecated since ms_accum 0.3.0 and will be removed in "
        "2.0.0; use window=WindowOptions(clip_norm=...).",
        "'ms_accum.GradientAccumulation.train_process(on_step=...)' is deprecated since ms_accum 0.3.0 and will be "
        "removed in 2.0.0; use log=LogOptions(on_step=...)."]
    network = nn.SequentialCell([nn.Dense(2, 2)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GradientAccumulation(network, nn.MSELoss(), nn.SGD(network.trainable_params()), clip_norm=1.0,
                             recompute=["0"])
    ours = [w for w in caught if w.category is DeprecationWarning]
    assert [str(w.message) for w in ours] == [deprecation.message(f"ms_accum.GradientAccumulation({k}=...)")
                                              for k in ("clip_norm", "recompute")]
    assert {w.filename for w in ours} == {__file__}  # the user's line


def test_an_entry_past_its_removal_is_refused():
    with pytest.raises(RuntimeError, match="outlived its removal"):
        deprecation.deprecated("ms_accum.LeNet5")

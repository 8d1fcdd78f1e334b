"""_mindspore, MindSpore's doorway: the releases ms_accum supports, refused outside them before anything is built.
This file runs on every MindSpore of CI's matrix."""
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

import mindspore as ms
from ms_accum import _mindspore

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
    assert str(declared) == str(SpecifierSet(_mindspore.SUPPORTED_RANGE))  # one range, in two files
    for version in [*_matrix(), ms.__version__]:
        assert version in declared and _mindspore.supported(version), version
    for version in ("2.7.2", "2.7.1.post1", "2.7.0", "2.11.0", "3.0.0", "1.10.1"):
        assert version not in declared and not _mindspore.supported(version), version


def test_pip_keeps_the_mindspore_it_finds():
    # pip keeps an installed MindSpore that satisfies ms_accum's requirement: the installed package's, as pip reads it
    requires = [r for r in importlib.metadata.requires("ms_accum") if r.startswith("mindspore")]
    assert requires and ms.__version__ in SpecifierSet(requires[0][len("mindspore"):].split(";")[0]), requires


def test_running_on_a_supported_release():
    assert _mindspore.supported(_mindspore.installed_version())
    assert _mindspore.installed_version() == ms.__version__


@pytest.mark.parametrize("version,release", [("2.7.1.post1", (2, 7)), ("2.10.0rc1", (2, 10)), ("2.9.0", (2, 9))])
def test_release_of_a_version_string(version, release):
    assert _mindspore.release(version) == release


def test_an_unreadable_version_is_refused():
    with pytest.raises(ImportError, match="cannot read the MindSpore version 'nightly'"):
        _mindspore.check_version("nightly")


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
    environ = {k: v for k, v in os.environ.items() if k != _mindspore.UNSUPPORTED_VARIABLE}
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

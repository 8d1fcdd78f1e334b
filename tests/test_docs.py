"""Every code block of README.md and docs/*.md runs, so the documentation stays true.

The blocks of one page run in order, in one temporary directory of the page's own, so a block may use what an earlier
block of its page wrote (a module, a checkpoint). By the fence's language:

- ``python``: written to ``block_<line>.py`` and run in a fresh process (`sys.executable`; graph mode parses source
  files, so never ``python -c``). A block whose first line is ``# file: NAME.py`` is a file that later blocks of its
  page use (a factory module, a script for msrun): it is written as NAME.py and not run on its own.
- ``bash``: run with ``bash -e -o pipefail``, except blocks whose commands are all ``make ...``: those create the
  virtualenv and run this suite, and CI itself runs them. An msrun command's ``--master_port=N`` is replaced by a free
  port, so that a run cannot collide with another job on the machine.
- ``text`` (output, layouts) and any other language: not run. Every fence must name its language.

Each process gets the test's environment with the virtualenv's bin first on PATH (msrun starts ``python`` from PATH)
and ``MS_ACCUM_MNIST`` pointing at a small synthetic MNIST (`make_synthetic_mnist`), so that the blocks that train on
MNIST run in seconds. The package is installed editable: no PYTHONPATH is needed.

Without running anything, the pages are also checked: every fence names its language, links between pages resolve,
no page shows a deprecated module path or name, and the README stays within 300 lines.
"""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple

import pytest

from ms_accum.demo.data import make_synthetic_mnist

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("python", "bash")
FENCE = re.compile(r"^(\s*)```(.*)$")
FILE_LINE = re.compile(r"^# file: ([\w.-]+\.py)\s*$")
PORT = re.compile(r"--master_port=\d+")
BLOCK_TIMEOUT = 300  # seconds; each block takes well under a minute (msrun about 30 s)
README_LINES = 300


class Block(NamedTuple):
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> List[Block]:
    """The fenced code blocks of `page`, in order."""
    found, opened, body = [], None, []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if opened is None:
            if match:
                opened, body = (number, match.group(2).strip(), len(match.group(1))), []
        elif match and not match.group(2).strip():
            found.append(Block(page, opened[0], opened[1], "\n".join(text[opened[2]:] for text in body) + "\n"))
            opened = None
        else:
            body.append(line)
    assert opened is None, f"{page.relative_to(ROOT)}:{opened[0]}: a code block is not closed"
    return found


def commands(block: Block) -> List[str]:
    return [line.strip() for line in block.code.splitlines() if line.strip() and not line.strip().startswith("#")]


def is_make(block: Block) -> bool:
    lines = commands(block)
    makes = [line for line in lines if line.split()[0] == "make"]
    assert not makes or len(makes) == len(lines), f"{block.where()}: a bash block mixes make with other commands"
    return bool(makes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    mnist = make_synthetic_mnist(tmp_path_factory.mktemp("mnist"), num_train=512, num_test=128)
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "MS_ACCUM_MNIST": mnist}


def run(block: Block, directory: Path, env: dict) -> None:
    if block.language == "python":
        named = FILE_LINE.match(block.code.splitlines()[0])
        path = directory / (named.group(1) if named else f"block_{block.line}.py")
        path.write_text(block.code, encoding="utf-8")
        if named:
            return
        command = [sys.executable, path.name]
    else:
        if is_make(block):
            return
        path = directory / f"block_{block.line}.sh"
        path.write_text(PORT.sub(lambda _: f"--master_port={free_port()}", block.code), encoding="utf-8")
        command = ["bash", "-e", "-o", "pipefail", path.name]
    try:
        out = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{block.where()}: the {block.language} block did not finish in {BLOCK_TIMEOUT} s:\n{block.code}\n"
                    f"{(err.stdout or b'')[-2000:]!r}")
    assert out.returncode == 0, (f"{block.where()}: the {block.language} block failed ({out.returncode}):\n"
                                 f"{block.code}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-5000:]}")


# make test runs the README's blocks, a newcomer's first path; make test-all every page's.
@pytest.mark.parametrize("page", [pytest.param(p, marks=() if p.name == "README.md" else pytest.mark.slow)
                                  for p in PAGES if any(b.language in RUN for b in blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_a_page_runs(page, env, tmp_path):
    for block in blocks(page):
        if block.language in RUN:
            run(block, tmp_path, env)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fence_names_its_language(page):
    # A block without a language would silently not run: output and layouts are fenced as text.
    unnamed = [b.where() for b in blocks(page) if not b.language]
    assert not unnamed, f"fences without a language (python, bash or text): {unnamed}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_use_no_deprecated_name(page):
    # Every deprecated or removed path is in ms_accum.deprecation's table; the pages show what replaces it.
    from ms_accum.deprecation import TABLE
    text = page.read_text(encoding="utf-8")
    old = sorted({path for path in re.findall(r"ms_accum(?:\.\w+)+", text) if path in TABLE})
    for block in blocks(page):
        if block.language == "python":
            for module, names in re.findall(r"from (ms_accum[\w.]*) import \(?([\w, \n]+)\)?", block.code):
                old += [f"{block.where()}: {module}.{n.strip()}" for n in names.split(",")
                        if f"{module}.{n.strip()}" in TABLE]
            old += [f"{block.where()}: .accumulate_steps"] * (".accumulate_steps" in block.code)
    assert not old, f"deprecated names (ms_accum/deprecation.py says what replaces them): {old}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_pages_resolve(page):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)", page.read_text(encoding="utf-8"))
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; the rest belongs in docs/ (at most {README_LINES})"

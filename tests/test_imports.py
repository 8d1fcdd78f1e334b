"""What a script imports is at the top: every code block of README.md and docs/*.md and every tutorial imports
ms_accum's names from ``ms_accum`` itself or from a layer's package (``ms_accum.core``, ``.graphs``, ``.train``,
``.tools``, ``.demo``, and the command's ``ms_accum.cli``), never from a module inside one, and only names that package
exports."""
import ast
import importlib

import pytest

from test_docs import PAGES, ROOT, blocks

PACKAGES = {"ms_accum", *(f"ms_accum.{layer}" for layer in ("core", "graphs", "train", "tools", "demo", "cli"))}
SCRIPTS = [(block.where(), block.code) for page in PAGES for block in blocks(page) if block.language == "python"]
SCRIPTS += [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
            for path in sorted((ROOT / "tutorials").glob("*.py"))]


def _exported(package: str, name: str) -> bool:
    module = importlib.import_module(package)
    return name in module.__all__ if hasattr(module, "__all__") else hasattr(module, name)


def bad_imports(code: str):
    """The imports of ms_accum in `code` that reach past the packages, or a name a package does not export."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names
                        if alias.name.split(".")[0] == "ms_accum" and alias.name not in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ms_accum":
            if node.module not in PACKAGES:
                yield f"from {node.module} import ..."
            else:
                yield from (f"from {node.module} import {alias.name}" for alias in node.names
                            if not _exported(node.module, alias.name))


@pytest.mark.parametrize("where,code", SCRIPTS, ids=[where for where, _ in SCRIPTS])
def test_scripts_import_from_the_top_or_a_layer_package(where, code):
    bad = list(bad_imports(code))
    assert not bad, f"{where} imports past ms_accum's packages (export the name from its layer or the top): {bad}"


def test_the_check_finds_a_deep_import():
    code = ("import ms_accum.train.options\nfrom ms_accum.train.options import QUIET\n"
            "from ms_accum import runtime, Checkpoints\nfrom ms_accum.train import QUIET\n"
            "def f():\n    from ms_accum.core.dropout import DropoutStreams\n")
    assert sorted(bad_imports(code)) == sorted([
        "ms_accum.train.options", "from ms_accum.train.options import ...", "from ms_accum import runtime",
        "from ms_accum.core.dropout import ..."])

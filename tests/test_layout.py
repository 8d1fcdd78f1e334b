"""The package's layers: each module imports only its own layer and those below, with no circle inside a layer; every
choice is written once; the public names load from the top and from each layer's package."""
import ast
import importlib
import pathlib
import re
import sys

import pytest

import ms_accum

PACKAGE = pathlib.Path(ms_accum.__file__).parent
# Bottom to top. The base modules load no MindSpore when imported (`_mindspore`, the door to its internals, imports it
# inside its functions) and import nothing of ms_accum but each other.
LAYERS = ["base", "core", "graphs", "train", "tools", "demo", "env", "cli"]
BASE = {"_choices", "_validation", "_exports", "_mindspore", "deprecation", "runtime", "__init__"}


def _module(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def _layer(module: str) -> str:
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in BASE:
        return "base"
    return parts[0]


def _imports(path: pathlib.Path):
    """Every ms_accum module that `path` imports, at its top or inside a function."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names]
            found.update(name if (PACKAGE.parent / (name.replace(".", "/") + ".py")).exists() else target
                         for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "ms_accum"}


MODULES = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_downwards(module):
    own = LAYERS.index(_layer(module))
    for target in _imports(MODULES[module]):
        if target == "ms_accum":  # the package itself: its __init__ imports only the base
            continue
        assert LAYERS.index(_layer(target)) <= own, f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"


@pytest.mark.parametrize("module", ["_choices", "_exports", "_validation", "runtime"])
def test_the_base_names_no_upper_layers_public_name(module):
    """The base's code (its docstrings aside) names nothing an upper layer exports: an upper layer's wording lives
    there (the messages' `Term`s), not here. `deprecation` and `__init__` name them by design; `_mindspore`'s
    fallbacks name the feature that falls back."""
    upper = set().union(*(importlib.import_module(f"ms_accum.{layer}").__all__ for layer in LAYERS[1:]))
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node)}
    said = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            said += [(word, node.lineno) for word in re.findall(r"\w+", node.value) if word in upper]
        elif isinstance(node, (ast.Name, ast.Attribute, ast.ClassDef, ast.FunctionDef)):
            word = getattr(node, "id", None) or getattr(node, "attr", None) or node.name
            said += [(word, node.lineno)] * (word in upper)
    assert not said, said


def test_no_import_circle():
    graph = {module: {t for t in _imports(path) if t in MODULES and t != module}
             for module, path in MODULES.items() if not module.endswith("__init__") and module != "ms_accum"}
    done, stack = set(), []

    def visit(module):
        if module in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(module):] + [module]))
        if module in done:
            return
        stack.append(module)
        for target in graph.get(module, ()):
            visit(target)
        stack.pop()
        done.add(module)

    for module in graph:
        visit(module)


def test_choices_written_once():
    """Each enumeration of `_choices` is spelled out there and nowhere else in the package."""
    from ms_accum import _choices
    enumerations = {value for name, value in vars(_choices).items() if name.isupper() and isinstance(value, tuple)}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_choices.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                values = tuple(e.value for e in node.elts)
                assert not any(set(values) == set(e) for e in enumerations), \
                    f"{path.relative_to(PACKAGE)}:{node.lineno} repeats {values}"


def test_public_names_import_from_the_top_and_the_layers():
    """Every name of the top's and each layer package's `__all__` loads; importing them all loads no MindSpore until a
    name is used (the top's docstring says why); ``dir()`` shows the public names and nothing else."""
    import subprocess
    code = ("import sys, ms_accum, ms_accum.core, ms_accum.graphs, ms_accum.train, ms_accum.tools, ms_accum.demo\n"
            "assert 'mindspore' not in sys.modules, 'importing the packages loaded MindSpore'\n"
            "m = ms_accum\n"
            "for package in (m, m.core, m.graphs, m.train, m.tools, m.demo):\n"
            "    assert sorted(dir(package)) == sorted(package.__all__ + ['__version__'] * (package is m))\n"
            "    for name in package.__all__:\n"
            "        assert getattr(package, name) is not None, (package.__name__, name)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_top_is_the_layers_names():
    """A top-level name is its layer's object, not a copy; the inner Cells are not at the top."""
    import ms_accum.graphs
    import ms_accum.train
    assert ms_accum.Checkpoints is ms_accum.train.Checkpoints is importlib.import_module(
        "ms_accum.train.options").Checkpoints
    assert ms_accum.TrainForwardBackward is ms_accum.graphs.TrainForwardBackward
    assert not {"TrainAccumulationCell", "TrainWindowCell", "TrainCachedWindowCell", "AccumulationBuffer",
                "LossOnly"} & set(ms_accum.__all__)


def test_k_has_one_name_and_a_plan_of_0_2_still_loads():
    from ms_accum import Plan, StepRecord
    from ms_accum.train import Trial
    record = StepRecord(1, 1, 0.5, 4, 32, accumulate_step=4)
    assert record.accumulate_step == 4 and not hasattr(record, "accumulate_steps")  # 0.2's name, gone in 1.0.0
    old = {"model": "lenet5", "global_batch": 16, "ranks": 1, "batch_size": 4, "accumulate_steps": 4,
           "structure": "fused", "reduction": "mean", "predicted_peak_mib": 10.0, "memory_mib": 20.0,
           "budget_mib": 20.0, "intercept_mib": 1.0, "slope_mib": 2.0, "device": "CPU",
           "trials": [{"batch_size": 4, "accumulate_steps": 4, "structure": "fused", "peak_mib": 9.0}]}
    plan = Plan.from_dict(old)  # a plan file written by ms_accum 0.2: data, still read
    assert plan.accumulate_step == 4 and plan.trials == [Trial(4, 4, "fused", 9.0)]
    assert "accumulate_step" in plan.to_dict() and "accumulate_steps" not in plan.to_dict()


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PACKAGE.parent), node


def test_no_function_takes_its_callers_name():
    """Errors are named at the public door the user called (`ms_accum._validation.door`), so no inner function is
    told who called it."""
    takes = [f"{path}:{node.lineno} {node.name}" for path, node in _functions()
             if any(arg.arg in ("cls_name", "caller") for arg in node.args.args + node.args.kwonlyargs)]
    assert not takes, takes


def test_the_executor_moves_the_keywords_of_0_3_into_its_options():
    """The keywords of 0.3 still work until 2.0.0 and warn (`ms_accum.deprecation`); a keyword of the other door is
    Python's own TypeError."""
    import warnings
    from ms_accum.train.options import with_deprecated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = with_deprecated({}, {"clip_norm": 2.0, "verbose": False}, ("window", "log"))
    assert options["window"].clip_norm == 2.0 and options["log"].verbose is False
    assert [w.category for w in caught] == [DeprecationWarning] * 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip_norm'"):
        with_deprecated({}, {"clip_norm": 2.0}, ("log",))

"""The package's layers: each module imports only its own layer and those below, with no circle inside a layer; every
choice is written once; the public surface is what the docs show."""
import ast
import importlib
import pathlib
import sys

import pytest

import ms_accum

PACKAGE = pathlib.Path(ms_accum.__file__).parent
# Bottom to top. The base modules import no MindSpore and nothing of ms_accum but each other.
LAYERS = ["base", "core", "graphs", "train", "tools", "demo", "cli"]
BASE = {"_choices", "_validation", "_compat", "runtime", "__init__"}


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


def test_public_names_import_from_the_top():
    for name in ms_accum.__all__:
        assert getattr(ms_accum, name) is not None
    assert len(ms_accum.__all__) <= 25


def test_moved_names_still_work_with_a_warning():
    with pytest.warns(DeprecationWarning, match="'ms_accum.LeNet5' is deprecated .* 'ms_accum.demo.models'"):
        lenet = ms_accum.LeNet5
    assert lenet is importlib.import_module("ms_accum.demo.models").LeNet5
    sys.modules.pop("ms_accum.schedule", None)  # so the alias is found afresh
    with pytest.warns(DeprecationWarning, match="'ms_accum.schedule' is deprecated .* 'ms_accum.train.schedule'"):
        old = importlib.import_module("ms_accum.schedule")
    assert old is importlib.import_module("ms_accum.train.schedule")


def test_k_has_one_name_and_the_old_one_warns():
    from ms_accum import Plan, StepRecord
    from ms_accum.train.plan import Trial
    record = StepRecord(1, 1, 0.5, 4, 32, accumulate_step=4)
    with pytest.warns(DeprecationWarning, match="'accumulate_steps' is deprecated; use 'accumulate_step'."):
        assert record.accumulate_steps == 4
    old = {"model": "lenet5", "global_batch": 16, "ranks": 1, "batch_size": 4, "accumulate_steps": 4,
           "structure": "fused", "reduction": "mean", "predicted_peak_mib": 10.0, "memory_mib": 20.0,
           "budget_mib": 20.0, "intercept_mib": 1.0, "slope_mib": 2.0, "device": "CPU",
           "trials": [{"batch_size": 4, "accumulate_steps": 4, "structure": "fused", "peak_mib": 9.0}]}
    plan = Plan.from_dict(old)  # a plan file written by ms_accum 0.2
    assert plan.accumulate_step == 4 and plan.trials == [Trial(4, 4, "fused", 9.0)]
    assert "accumulate_step" in plan.to_dict() and "accumulate_steps" not in plan.to_dict()


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PACKAGE.parent), node


def test_no_function_is_longer_than_a_screen():
    """Every function, its docstring included, fits in 60 lines: a reader holds it in mind."""
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node in _functions() if node.end_lineno - node.lineno + 1 > 60]
    assert not long, long


def test_no_function_takes_its_callers_name():
    """Errors are named at the public door the user called (`ms_accum._validation.door`), so no inner function is
    told who called it."""
    takes = [f"{path}:{node.lineno} {node.name}" for path, node in _functions()
             if any(arg.arg in ("cls_name", "caller") for arg in node.args.args + node.args.kwonlyargs)]
    assert not takes, takes


def test_the_executor_takes_what_a_reader_holds():
    """The constructor and `train_process` take at most 8 arguments each; the keywords of 0.3 still work, warn, and
    are listed here: deleting one is a decision, not an accident."""
    import inspect
    import warnings
    from ms_accum import GradientAccumulation
    from ms_accum.train.options import DEPRECATED_KEYWORDS
    for function in (GradientAccumulation.__init__, GradientAccumulation.train_process):
        named = [p for p in inspect.signature(function).parameters.values()
                 if p.name != "self" and p.kind != p.VAR_KEYWORD]
        assert len(named) <= 8, (function.__name__, [p.name for p in named])
    assert sorted(DEPRECATED_KEYWORDS) == sorted([
        "clip_norm", "reduction", "buffer_dtype", "policy", "loss_scaler", "stop_on_nonfinite", "statistics",
        "noise_scale", "skip_outliers", "outlier_warmup", "ckpt_dir", "ckpt_name", "save_every", "keep_last",
        "metadata", "resume", "log_every", "verbose", "on_step"])
    from ms_accum.train.options import with_deprecated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = with_deprecated({}, {"clip_norm": 2.0, "verbose": False}, ("window", "log"))
    assert options["window"].clip_norm == 2.0 and options["log"].verbose is False
    assert [w.category for w in caught] == [DeprecationWarning] * 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip_norm'"):
        with_deprecated({}, {"clip_norm": 2.0}, ("log",))

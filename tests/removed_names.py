"""The deprecation table's removed names fail with its line, as ``module.name`` and as ``from module import name``,
on whatever Python runs this: no pytest, no MindSpore (a name under a module that needs MindSpore is left out where
it is missing). tests/test_deprecation.py checks each entry with `failure`; on another Python of pyproject.toml's
``requires-python``, from the checkout: ``PYTHONPATH=. python3.9 tests/removed_names.py``."""
import functools
import importlib
import re
import sys
from typing import Optional

from ms_accum.deprecation import TABLE, removed

NAME = re.compile(r"^ms_accum(\.\w+)+$")


def importable(path: str):
    """The longest importable module of the dotted `path`, and the names after it."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:end])), parts[end:]
        except ModuleNotFoundError as err:
            if not f"{path}.".startswith(f"{err.name}."):  # another module missing (MindSpore), not `path`
                raise
    raise ModuleNotFoundError(path)


def failure(key: str) -> Optional[str]:
    """What is wrong with the removed name `key` (``ms_accum.x.Name``), or None. A name of a module: both ways of asking
    for it raise an ImportError that says what replaces it and the version that removed it (a removed module's names
    fail at the module, whose line lists them). An attribute of a class's instances: Python's AttributeError, the line
    after it."""
    entry = TABLE[key]
    module, names = importable(key)
    try:
        owner = getattr(module, names[0])
    except ModuleNotFoundError:  # a module it needs is missing (numpy, MindSpore)
        raise
    except (ImportError, AttributeError):  # removed from `module`: how is checked below
        owner = None
    if isinstance(owner, type):
        asks = {f"{owner.__name__}().{names[1]}": lambda: getattr(object.__new__(owner), names[1])}
        expected = AttributeError
    else:
        asks = {f"{module.__name__}.{'.'.join(names)}": lambda: functools.reduce(getattr, names, module)}
        if len(names) == 1:
            asks[f"from {module.__name__} import {names[0]}"] = lambda: exec(  # noqa: S102
                f"from {module.__name__} import {names[0]}", {})
        expected = ImportError
    for ask, run in asks.items():
        try:
            run()
        except expected as err:
            if entry.use not in str(err) or f"removed in ms_accum {entry.removed_in}" not in str(err):
                return f"{ask} raised {expected.__name__} without the table's line: {err}"
        except Exception as err:  # pylint: disable=broad-except
            return f"{ask} raised {type(err).__name__}, not {expected.__name__}: {err}"
        else:
            return f"{ask} raised nothing"
    return None


def main() -> int:
    import ms_accum
    failed, skipped, checked = [], [], 0
    for key in sorted(key for key in TABLE if removed(key) and NAME.match(key)):
        try:
            said = failure(key)
        except ModuleNotFoundError as err:
            skipped.append(f"{key} ({err.name} missing)")
            continue
        checked += 1
        if said:
            failed.append(said)
    # A name the table does not have is Python's own error, either way.
    if hasattr(ms_accum, "nothing"):
        failed.append("hasattr(ms_accum, 'nothing') is True")
    try:
        from ms_accum import nothing  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    except ImportError as err:
        if not str(err).startswith("cannot import name 'nothing' from 'ms_accum'"):
            failed.append(f"from ms_accum import nothing: {err}")
    print(f"Python {sys.version.split()[0]}: {checked} checked, {len(failed)} failed, {len(skipped)} skipped"
          + "".join(f"\n  failed: {line}" for line in failed) + "".join(f"\n  skipped: {line}" for line in skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

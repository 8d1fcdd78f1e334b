"""A package's public names, loaded on first use (PEP 562): importing a package of ms_accum imports no MindSpore, so
that importing ms_accum first can still cap oneDNN's CPU ISA (`ms_accum.runtime`), and a module loads only when a name
of it is used."""
import importlib
import sys
from typing import Callable, Dict, List, Tuple

from .deprecation import no_attribute


def lazy(package: str, exports: Dict[str, str]) -> Tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of `package`, whose public names `exports` maps each to the module, relative
    to `package`, that defines or exports it (``".options"``)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):  # noqa: N807
        if name not in exports:
            raise no_attribute(package, name)
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> List[str]:  # noqa: N807
        return list(exports) + [name for name in ("__version__",) if name in namespace]

    return __getattr__, __dir__

"""What a problem report needs to know of this machine and this process, gathered without building, training or
joining anything: ``ms-accum env`` prints it, ``--json`` as one JSON object; ``python -m ms_accum.env [--json]`` too.

- the versions of ms_accum, MindSpore, Python and numpy; the platform, and the CPU's vector ISA (its AVX2 and AVX-512
  flags in /proc/cpuinfo);
- oneDNN: its ISA cap (`ms_accum.runtime`), who set it and in which variables, the bundled library MindSpore loaded
  (which read them) and the ISA its kernels run;
- the C++ compiler ms_accum's kernels are built with (`ms_accum.core.native`) and its version; the kernel cache's
  directory and its builds, each recorded whole or not, and which one is this machine's build of the dropout kernel;
- the device MindSpore runs on, and what msrun told this process of its rank (its environment; no cluster is joined).

A fact that cannot be had says why instead: a report is wanted most where something is broken.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
from typing import Any, Dict, Optional

from . import __version__, runtime
from ._mindspore import ONEDNN_ISA_VARIABLES, installed_version, onednn
from .core import dropout, native

# What msrun exports to the processes it starts (measured with MindSpore 2.10: train/distributed.py).
MSRUN_VARIABLES = ("MS_ROLE", "MS_WORKER_NUM", "MS_NODE_ID", "RANK_ID", "RANK_SIZE", "DEVICE_ID", "MS_SCHED_HOST",
                   "MS_SCHED_PORT")


__all__ = ["facts", "main"]


def facts() -> Dict[str, Any]:
    """
    What this machine and process are, for a problem report.

    Returns:
        dict, of plain values (JSON's): ``ms_accum``, ``mindspore``, ``python``, ``numpy``, ``platform``, ``cpu``,
        ``onednn``, ``compiler``, ``kernel_cache``, ``device`` and ``msrun``.
    """
    import mindspore as ms  # after ms_accum (imported above), so oneDNN loads capped, as in any run of ms_accum
    return {
        "ms_accum": __version__,
        "mindspore": installed_version(),
        "python": platform.python_version(),
        "numpy": importlib.metadata.version("numpy"),
        "platform": platform.platform(),
        "cpu": {"machine": platform.machine(),
                "isa": sorted(flag for flag in runtime.cpu_flags() if flag == "avx2" or flag.startswith("avx512"))},
        "onednn": _onednn(),
        "compiler": _compiler(),
        "kernel_cache": _kernel_cache(),
        "device": ms.get_context("device_target"),
        "msrun": {name: os.environ[name] for name in MSRUN_VARIABLES if name in os.environ},
    }


def _onednn() -> Dict[str, Any]:
    cap, set_by = runtime.isa_cap()
    library = onednn()
    return {"cap": cap, "set_by": set_by, "variables": [name for name in ONEDNN_ISA_VARIABLES if name in os.environ],
            "library": None if library is None else library._name,  # ctypes' documented name of the file it opened
            "isa": runtime.cpu_kernel_isa()}


def _compiler() -> Dict[str, Any]:
    try:
        path = native.compiler(dropout.KERNEL)
        return {"path": path, "version": native.compiler_identity(path)}
    except native.KernelBuildError as err:
        return {"error": str(err)}


def _kernel_cache() -> Dict[str, Any]:
    """The cache's directory, and each build in it: recorded whole (its record matches its bytes) or not, and whether
    it is the build this machine's dropout kernel would load (whose key needs the compiler)."""
    directory = native.cache_dir()
    try:
        current: Optional[str] = native.locate(dropout.KERNEL, dropout.ENTRIES)[0].name
    except native.KernelBuildError:
        current = None
    builds = {path.name: {"recorded": _recorded(path), "this_machine": path.name == current}
              for path in sorted(directory.glob("*.so"))}
    return {"directory": str(directory), "set_by": native.CACHE_ENV if os.environ.get(native.CACHE_ENV) else None,
            "builds": builds}


def _recorded(library_path) -> bool:
    """Whether the build is the one its record describes, for the key the record holds."""
    try:
        key = json.loads(native.record_path(library_path).read_text())["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return native.recorded(library_path, key)


def text(found: Dict[str, Any], indent: str = "") -> str:
    """`found` (`facts`) as lines of ``name: value``, nested under their section."""
    lines = []
    for name, value in found.items():
        if isinstance(value, dict) and value:
            lines += [f"{indent}{name}:", text(value, indent + "  ")]
            continue
        if isinstance(value, list):
            value = " ".join(value)
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        lines.append(f"{indent}{name}: {value or 'none'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m ms_accum.env [--json]``: prints `facts`, as `text` or as one JSON object."""
    parser = argparse.ArgumentParser(prog="python -m ms_accum.env", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print them as one JSON object")
    found = facts()
    print(json.dumps(found) if parser.parse_args(argv).json else text(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

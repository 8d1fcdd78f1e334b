"""MindSpore's doorway: the releases ms_accum supports, and every private or undocumented name of MindSpore it relies on.

A MindSpore release may move or drop any name that is not in its documented API without a word. ms_accum reaches each
such name here and nowhere else, so that a release that moves one breaks this module, which says so (a clear error
naming the feature, or a fallback said once), never a run that trains wrong. Each entry says why it is needed and
since which release it is known to hold; `tests/test_mindspore.py` checks every one on each MindSpore of CI's matrix
(docs/mindspore.md, versions).

The version check reads the installed distribution's metadata, not the module: importing ms_accum first imports no
MindSpore (`ms_accum.runtime` must cap oneDNN before MindSpore loads).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import warnings
from typing import Optional, Tuple

# The releases CI tests, [first, end): pyproject.toml's range. 2.7 trains wrong in graph mode (docs/mindspore.md,
# versions), so it is refused, not served.
SUPPORTED = ((2, 8), (2, 11))
SUPPORTED_RANGE = ">=2.8,<2.11"
# Lets a maintainer try a release outside the range (a warning instead of the ImportError).
UNSUPPORTED_VARIABLE = "MS_ACCUM_ALLOW_UNSUPPORTED_MINDSPORE"


def installed_version() -> Optional[str]:
    """The MindSpore release of this process: the loaded module's, else the installed distribution's; None when there
    is none."""
    module = sys.modules.get("mindspore")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    try:
        return importlib.metadata.version("mindspore")
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> Tuple[int, int]:
    """The (major, minor) of a version string such as ``"2.7.1.post1"`` or ``"2.10.0rc1"``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ImportError(f"ms_accum cannot read the MindSpore version '{version}'.")
    return int(found.group(1)), int(found.group(2))


def supported(version: str) -> bool:
    """Whether `version` is in the range CI tests."""
    return SUPPORTED[0] <= release(version) < SUPPORTED[1]


def check_version(version: Optional[str]) -> None:
    """
    Refuses a MindSpore outside the supported range, before anything is built.

    Args:
        version (str, optional): The MindSpore release found; None (none installed) passes: importing it fails anyway.

    Raises:
        ImportError: If `version` is outside the range and ``MS_ACCUM_ALLOW_UNSUPPORTED_MINDSPORE`` is not ``1`` (with
            it, a `UserWarning`).
    """
    if version is None or supported(version):
        return
    text = (f"ms_accum supports MindSpore {SUPPORTED_RANGE}, but found MindSpore {version}. Install a supported "
            f"release (pip install 'mindspore{SUPPORTED_RANGE}'); docs/mindspore.md, versions, says what breaks on "
            f"others.")
    if os.environ.get(UNSUPPORTED_VARIABLE) == "1":
        warnings.warn(f"{text} {UNSUPPORTED_VARIABLE}=1: going on untested.", UserWarning, stacklevel=3)
        return
    raise ImportError(f"{text} To try it anyway, set {UNSUPPORTED_VARIABLE}=1.")


# oneDNN, which MindSpore bundles for its CPU kernels (mindspore/lib): libdnnl.so.2 (oneDNN 2.x) in MindSpore 2.8,
# libdnnl.so.3 (oneDNN 3.x) in 2.9 and 2.10. Asked for the ISA its kernels run (`ms_accum.runtime`): the slow AVX-512
# convolutions (docs/mindspore.md, oneDNN's AVX-512 convolutions).
ONEDNN_LIBRARIES = ("libdnnl.so.3", "libdnnl.so.2")
# The variable that caps oneDNN's ISA, read when the library loads: ONEDNN_MAX_CPU_ISA in oneDNN 3.x, only the older
# DNNL_MAX_CPU_ISA in the oneDNN 2.2 of MindSpore 2.8 (measured: the first alone left 2.8 on AVX-512).
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def onednn() -> Optional["ctypes.CDLL"]:
    """The oneDNN library this process loaded (the one MindSpore loaded: found in the process's mappings, or by its
    known names, never loading a second copy); None where it is not loaded or cannot be opened."""
    import ctypes
    candidates = list(ONEDNN_LIBRARIES)
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:  # Linux: the file MindSpore loaded, whatever its name
            candidates[:0] = sorted({line.split()[-1] for line in maps if "/libdnnl.so" in line})
    except OSError:
        pass
    for candidate in candidates:
        try:
            library = ctypes.CDLL(candidate, mode=os.RTLD_NOLOAD)
            library.dnnl_get_effective_cpu_isa  # noqa: B018  (a library without it is not oneDNN)
        except (OSError, AttributeError):
            continue
        return library
    return None

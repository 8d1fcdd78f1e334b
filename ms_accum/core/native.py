"""C++ kernels of ms_accum's own, built once per machine and loaded by MindSpore's `ops.Custom` (``func_type="aot"``).

MindSpore can compile an aot kernel's source itself, but into ``./custom_kernel_meta`` of whatever directory the
process runs in; ms_accum builds its kernels into a cache of its own instead, once per source (the file name carries
the source's hash), written under a temporary name and renamed, so that several processes (msrun's ranks) starting
together each see a whole library or build their own.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

KERNELS = Path(__file__).with_name("kernels")
CACHE_ENV = "MS_ACCUM_CACHE"  # where built kernels go; default: $XDG_CACHE_HOME/ms_accum or ~/.cache/ms_accum


class KernelBuildError(RuntimeError):
    """A kernel's source could not be compiled here (no C++ compiler, or it failed)."""


def cache_dir() -> Path:
    """Where built kernels are kept: `MS_ACCUM_CACHE`, else ``$XDG_CACHE_HOME/ms_accum``, else ``~/.cache/ms_accum``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ms_accum"


@functools.lru_cache(maxsize=None)
def library(name: str, appended: str = "") -> str:
    """The shared library built from ``kernels/{name}.cc`` followed by the source `appended` (generated code), built
    now if this machine has none of this source.

    Raises:
        KernelBuildError: If no C++ compiler is found (`CXX`, else ``g++``) or it fails.
    """
    source = (KERNELS / f"{name}.cc").read_text() + appended
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{digest}.so"
    if target.is_file():
        return str(target)
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise KernelBuildError(f"no C++ compiler found to build ms_accum's {name} kernel (set CXX, or install g++).")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    with tempfile.TemporaryDirectory() as work:
        written = Path(work) / f"{name}.cc"
        written.write_text(source)
        # No -march: the cache may be shared by machines of other CPUs (a home directory on a network disk).
        done = subprocess.run([compiler, "-std=c++17", "-O3", "-shared", "-fPIC", "-o", temporary, str(written)],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        os.remove(temporary)
        raise KernelBuildError(f"building ms_accum's {name} kernel failed: {done.stderr.strip()[-500:]}")
    os.replace(temporary, target)
    return str(target)

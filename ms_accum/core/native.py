"""C++ kernels of ms_accum's own, built once per machine into a cache and loaded by MindSpore's `ops.Custom`
(``func_type="aot"``).

MindSpore can compile an aot kernel's source itself, but into ``./custom_kernel_meta`` of whatever directory the
process runs in; ms_accum builds its kernels into a cache of its own instead (`cache_dir`). A library, once loaded, is
part of the process: a truncated file kills it with SIGBUS, with nothing printed. So the cache hands out no file it has
not checked:

- The library's name carries a key over what makes a build usable here (`build_key`): the source, the compiler's
  flags, the machine's architecture, the compiler, the C library and the MindSpore release. A cache shared by machines
  of other kinds (a home directory on a network disk) holds a build for each.
- Beside each library, a record (``{library}.json``) holds the key's parts and the library's size and SHA-256. It is
  written after the library, once a child process has loaded the library and found the entry points its caller needs
  (`load_failure`). A library whose record is missing, of another key, or of other bytes is built again.
- A recorded library is loaded by a child process again before `library` returns it: a crash there ends the child.
- Every file is written under a temporary name and renamed into place, so a process reads a whole library and a whole
  record or none; builds of one key are byte-identical (the source goes through the compiler's standard input, so no
  temporary path lands in the library). Processes that find a build missing at once (msrun's ranks) build it once:
  the others wait on its lock (`_lock`). Each child process and each wait ends after `timeout` seconds.
- Where the cache cannot be written, the library is built into a directory of the process's own, removed at exit, and
  that is said once: the kernel, and so the masks, are the same; only the build is repeated by each process.

Every failure ends in `KernelBuildError`, never in an `OSError` or a signal: the caller falls back (core/dropout.py:
the network keeps MindSpore's dropout, said once).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import hashlib
import json
import math
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from .._mindspore import installed_version
from .._validation import MessageError

KERNELS = Path(__file__).with_name("kernels")
CACHE_ENV = "MS_ACCUM_CACHE"  # where built kernels go; default: $XDG_CACHE_HOME/ms_accum or ~/.cache/ms_accum
# No -march: the cache may be shared by machines of other CPUs (a home directory on a network disk).
FLAGS = ("-std=c++17", "-O3", "-shared", "-fPIC")
RECORD_SUFFIX = ".json"
LOCK_SUFFIX = ".lock"
# Seconds for each child process of a build and for a wait on another process's build: the dropout kernel builds in
# about 3 s, so only a compiler that hangs (a network disk gone, a wrapper waiting on a licence) takes this long.
TIMEOUT = 300
TIMEOUT_ENV = "MS_ACCUM_BUILD_TIMEOUT"  # seconds, instead of TIMEOUT
_DIGEST_CHARS = 16  # of the key's SHA-256, in the library's name

# What the child process runs: plain ctypes, which `python -c` serves (only MindSpore's graph mode needs a source file).
_LOAD = ("import ctypes, sys\n"
         "library = ctypes.CDLL(sys.argv[1])\n"
         "missing = [name for name in sys.argv[2:] if not hasattr(library, name)]\n"
         "sys.exit('it lacks ' + ', '.join(missing) if missing else 0)\n")


class KernelBuildError(MessageError, RuntimeError):
    """A kernel cannot be built or loaded here: no C++ compiler, the compiler failed or hung, or the library it built
    does not load."""


def cache_dir() -> Path:
    """Where built kernels are kept: `MS_ACCUM_CACHE`, else ``$XDG_CACHE_HOME/ms_accum``, else ``~/.cache/ms_accum``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ms_accum"


def timeout() -> float:
    """
    The seconds each child process of a build, and each wait for another process's build, may take: `TIMEOUT_ENV`,
    else `TIMEOUT`.

    Raises:
        KernelBuildError: If `TIMEOUT_ENV` holds something else than a positive number.
    """
    text = os.environ.get(TIMEOUT_ENV, "")
    with contextlib.suppress(ValueError):
        seconds = float(text or TIMEOUT)
        if 0 < seconds < math.inf:
            return seconds
    raise KernelBuildError("the environment variable '{variable}' must be a positive number of seconds, but got "
                           "'{text}'.", variable=TIMEOUT_ENV, text=text)


def compiler(name: str) -> str:
    """
    The C++ compiler's path: `CXX`, else ``g++``, as found on ``PATH``.

    Args:
        name (str): The kernel it is wanted for, named in the error.

    Raises:
        KernelBuildError: If there is none.
    """
    found = shutil.which(os.environ.get("CXX", "g++"))
    if found is None:
        raise KernelBuildError("no C++ compiler found to build ms_accum's {name} kernel (set CXX, or install g++).",
                               name=name)
    return found


@functools.lru_cache(maxsize=None)
def compiler_identity(path: str) -> str:
    """
    The first line of ``{path} --version`` (``g++ (Debian 12.2.0-14) 12.2.0``), asked once per process: which
    compiler, and so which C++ runtime, a build needs.

    Raises:
        KernelBuildError: If the compiler does not run or does not say.
    """
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout(), check=False)
    except (OSError, subprocess.SubprocessError) as err:
        raise KernelBuildError("the C++ compiler {path} does not run: {err}.", path=path, err=err) from err
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise KernelBuildError("the C++ compiler {path} does not say its version ('{path} --version' exited with "
                               "{code}).", path=path, code=done.returncode)
    return lines[0].strip()


@functools.lru_cache(maxsize=None)
def c_library() -> str:
    """The C library the process runs on, as ``glibc 2.36``; ``unknown`` where Python cannot tell (musl, ...)."""
    return " ".join(part for part in platform.libc_ver() if part) or "unknown"


def build_key(source: str, compiler_path: str) -> Dict[str, str]:
    """
    The parts of a build's key: what must be the same for a library built elsewhere to be usable here.

    Args:
        source (str): The whole source compiled.
        compiler_path (str): The compiler that builds it (`compiler`).

    Returns:
        dict, the source's SHA-256, the compiler's flags, the machine's architecture (`platform.machine`), the
        compiler (`compiler_identity`), the C library (`c_library`) and the MindSpore release, whose aot convention
        calls the library (``none`` without MindSpore).

    Raises:
        KernelBuildError: If the compiler does not say its version.
    """
    return {
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "flags": " ".join(FLAGS),
        "machine": platform.machine(),
        "compiler": compiler_identity(compiler_path),
        "libc": c_library(),
        "mindspore": installed_version() or "none",
    }


def key_digest(parts: Dict[str, str]) -> str:
    """The hex digest of a key's parts that names its library."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:_DIGEST_CHARS]


def locate(name: str, appended: str = "") -> Tuple[Path, Dict[str, str]]:
    """
    Where the cache keeps the build of ``kernels/{name}.cc`` followed by `appended` for this machine, and its key's
    parts.

    Raises:
        KernelBuildError: If there is no C++ compiler, or it does not say its version.
    """
    _, _, parts, target = _keyed(name, appended)
    return target, parts


def _keyed(name: str, appended: str) -> Tuple[str, str, Dict[str, str], Path]:
    """The source, the compiler, the key's parts and the library's path in the cache."""
    source = (KERNELS / f"{name}.cc").read_text() + appended
    compiler_path = compiler(name)
    parts = build_key(source, compiler_path)
    return source, compiler_path, parts, cache_dir() / f"{name}-{key_digest(parts)}.so"


def record_path(library_path: Path) -> Path:
    """The record beside a library."""
    return library_path.with_name(library_path.name + RECORD_SUFFIX)


def _contents(path: Path) -> Tuple[str, int]:
    data = path.read_bytes()  # a kernel library is small: hashing it whole costs about a millisecond
    return hashlib.sha256(data).hexdigest(), len(data)


def record(library_path: Path, parts: Dict[str, str]) -> None:
    """
    Writes the record of `library_path`: the key's `parts`, and the file's SHA-256 and size, under a temporary name
    renamed into place.

    Raises:
        OSError: If it cannot be written.
    """
    sha256, size = _contents(library_path)
    with _replacing(record_path(library_path)) as (fd, _), os.fdopen(fd, "w") as file:
        json.dump({"key": parts, "sha256": sha256, "size": size}, file, indent=1, sort_keys=True)


def recorded(library_path: Path, parts: Dict[str, str]) -> bool:
    """Whether `library_path` is the build its record describes, for the key `parts`: a file written otherwise (cut
    short, another file renamed in, another machine's) is not."""
    try:
        entry = json.loads(record_path(library_path).read_text())
        if not isinstance(entry, dict) or entry.get("key") != parts or entry.get("size") != library_path.stat().st_size:
            return False
        return entry.get("sha256") == _contents(library_path)[0]
    except (OSError, ValueError):
        return False


def _serves(target: Path, parts: Dict[str, str], symbols: Tuple[str, ...]) -> bool:
    """Whether the cache's build at `target` serves: its record proves the bytes are those a child loaded once, and a
    child loads them again (one interpreter start, which also covers what the key cannot see: a record copied in
    beside another library, a C++ runtime gone)."""
    return recorded(target, parts) and load_failure(target, symbols) is None


def load_failure(path: Path, symbols: Tuple[str, ...]) -> Optional[str]:
    """Why the library at `path` would not serve this process, found by loading it in a child process (one interpreter
    start without ``site``, no MindSpore): a file that kills the process that loads it kills the child. None when it
    loads and exports `symbols`."""
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _LOAD, str(path), *symbols], capture_output=True,
                              text=True, timeout=timeout(), check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"no child process could load it ({err})"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        try:
            return f"loading it killed a process with {signal.Signals(-done.returncode).name}"
        except ValueError:
            return f"loading it killed a process with signal {-done.returncode}"
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"loading it exited with {done.returncode}"


def _temporary(target: Path) -> Tuple[int, str]:
    """A new file beside `target`, open for writing, under a name no other process takes; made as a plain file is
    (the umask decides who may read it: a cache may be shared), not private as `tempfile.mkstemp` makes it."""
    while True:
        path = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        with contextlib.suppress(FileExistsError):
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(path)


@contextlib.contextmanager
def _replacing(target: Path) -> Iterator[Tuple[int, str]]:
    """A new file beside `target` (`_temporary`: its descriptor and path) renamed to `target` once the block ends;
    removed if the block raises."""
    fd, temporary = _temporary(target)
    try:
        yield fd, temporary
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


@functools.lru_cache(maxsize=None)
def _own_directory() -> Path:
    """A directory of this process's own for kernels the cache cannot take, removed at exit (a loaded library stays
    mapped)."""
    path = Path(tempfile.mkdtemp(prefix="ms_accum-kernels-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _compile(name: str, compiler_path: str, source: str, output: str) -> None:
    seconds = timeout()
    try:
        # A session of its own, so that a compiler that hangs ends with the programs it started (cc1plus, as).
        with subprocess.Popen([compiler_path, *FLAGS, "-x", "c++", "-o", output, "-"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as run:
            try:
                errors = run.communicate(source, timeout=seconds)[1]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile; leaving the block reaps it
                    os.killpg(run.pid, signal.SIGKILL)
                raise KernelBuildError("building ms_accum's {name} kernel failed: {compiler} did not end within "
                                       "{seconds:g} s (set {variable} to wait longer).", name=name,
                                       compiler=compiler_path, seconds=seconds, variable=TIMEOUT_ENV) from None
    except OSError as err:
        raise KernelBuildError("building ms_accum's {name} kernel failed: {compiler} does not run ({err}).", name=name,
                               compiler=compiler_path, err=err) from err
    if run.returncode != 0:
        raise KernelBuildError("building ms_accum's {name} kernel failed: {errors}", name=name,
                               errors=errors.strip()[-500:])


@contextlib.contextmanager
def _lock(target: Path, name: str) -> Iterator[None]:
    """
    Holds the lock of `target`'s build (`LOCK_SUFFIX` beside it, `fcntl.flock`), waiting for another process that
    holds it. The system releases it when the process ends, killed or not, so no lock outlives its builder; the empty
    file stays (a process that removed it could lock a file a waiting process no longer sees). On a file system
    without locks (some network disks) it holds none: each process then builds, and still reads whole files.

    Raises:
        KernelBuildError: If another process holds it for more than `timeout` seconds.
        OSError: If the lock file cannot be created (the cache cannot be written).
    """
    fd = os.open(target.with_name(target.name + LOCK_SUFFIX), os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        seconds = timeout()
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise KernelBuildError("another process has been building ms_accum's {name} kernel into {cache} "
                                           "for more than {seconds:g} s (set {variable} to wait longer).", name=name,
                                           cache=target.parent, seconds=seconds, variable=TIMEOUT_ENV) from None
                time.sleep(0.1)
            except OSError:  # no locks here
                break
        yield
    finally:
        os.close(fd)  # which releases the lock


def _build(name: str, source: str, compiler_path: str, target: Path, symbols: Tuple[str, ...]) -> None:
    """Compiles into a temporary name beside `target`, loads it in a child, and renames it to `target`.

    Raises:
        KernelBuildError: If the compiler fails or what it built does not load.
        OSError: If `target`'s directory cannot be written.
    """
    with _replacing(target) as (fd, temporary):
        os.close(fd)
        _compile(name, compiler_path, source, temporary)
        failure = load_failure(Path(temporary), symbols)
        if failure is not None:
            raise KernelBuildError("ms_accum's {name} kernel, built just now by {compiler}, does not load: {failure}.",
                                   name=name, compiler=compiler_path, failure=failure)


@functools.lru_cache(maxsize=None)
def library(name: str, appended: str = "", symbols: Tuple[str, ...] = ()) -> str:
    """
    The path of a checked shared library built from ``kernels/{name}.cc`` followed by the source `appended` (generated
    code): the cache's build for this machine when its record matches it and a child process loads it, else built now
    (and recorded). Where the cache cannot be written, the build is this process's own, and a warning says so once.

    Args:
        name (str): The kernel, ``kernels/{name}.cc``.
        appended (str): Source appended to the file. Default: ``""``.
        symbols (tuple[str]): The names the caller will look up in the library: one that lacks them is built again.
            Default: ``()``.

    Returns:
        str, the library's path; loading it cannot crash the process, short of another program writing it meanwhile.

    Raises:
        KernelBuildError: If no C++ compiler is found (`CXX`, else ``g++``), it fails or hangs, what it builds does
            not load, or neither the cache nor a temporary directory can be written.
    """
    source, compiler_path, parts, target = _keyed(name, appended)
    if _serves(target, parts, symbols):
        return str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _lock(target, name):
            if not _serves(target, parts, symbols):  # else another process built it while this one waited
                _build(name, source, compiler_path, target, symbols)
                record(target, parts)
        return str(target)
    except OSError as err:
        unwritable = err
    try:
        own = _own_directory() / target.name
        _build(name, source, compiler_path, own, symbols)
    except OSError as err:
        raise KernelBuildError("ms_accum cannot write its kernel cache {cache} ({unwritable}) nor a temporary "
                               "directory ({err}) to build its {name} kernel in.", cache=target.parent,
                               unwritable=unwritable, err=err, name=name) from err
    warnings.warn(f"ms_accum cannot write its kernel cache {target.parent} ({unwritable}): its {name} kernel was "
                  f"built for this process alone, and each process builds it again (set {CACHE_ENV} to a writable "
                  f"directory).", UserWarning, stacklevel=2)
    return str(own)


def load(path: str) -> ctypes.CDLL:
    """
    The library at `path` (from `library`), opened with ctypes in this process; MindSpore's `ops.Custom` opening the
    same path gets the same library.

    Raises:
        KernelBuildError: If it does not load (it was removed or replaced since `library` checked it).
    """
    try:
        return ctypes.CDLL(path)
    except OSError as err:
        raise KernelBuildError("ms_accum's kernel library {path} does not load: {err}.", path=path, err=err) from err

"""The kernel cache (`ms_accum.core.native`): a library is named by a key over what makes a build usable (source,
flags, machine, compiler, C library, MindSpore), recorded once a child process has loaded it, and loaded again by a
child before it is handed out; a file that is cut short, not a library, another library, of another key or of other
bytes is built again; an unwritable cache builds for the process alone and says so once; no compiler, one that hangs,
or one whose library does not load, is a `KernelBuildError` (which core/dropout.py turns into MindSpore's dropout,
said once); processes that find the cache empty at once build once. Nothing here loads a library into the test's
process. The network-level cases, in fresh processes, are in test_dropout.py.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import pytest

from conftest import raises_exactly
from ms_accum.core import native

ROOT = Path(__file__).resolve().parents[1]
NAME = "seeded_dropout"
APPENDED = "MS_ACCUM_ENTRY(0)\n"  # one entry point: a build of seconds, not of the 1,024 the dropout module appends
SYMBOLS = ("ms_accum_slot_set", "SeededDropout0")
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of the test's own, and `library`'s per-process answers forgotten before and after."""
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    native.library.cache_clear()
    yield tmp_path / "cache"
    native.library.cache_clear()


def build() -> Path:
    return Path(native.library(NAME, APPENDED, SYMBOLS))


def assert_checked(path: Path, parts: dict) -> None:
    """`path` is a whole build of `parts`: its record matches its bytes, and a child process loads it."""
    assert native.recorded(path, parts)
    assert native.load_failure(path, SYMBOLS) is None


def files(path: Path) -> list:
    """The names a whole build at `path` leaves in the cache: the library, its record and its lock, no temporary."""
    return [path.name, path.name + native.RECORD_SUFFIX, path.name + native.LOCK_SUFFIX]


def counting_compiler(directory: Path, delay: float = 0) -> Callable[[], int]:
    """Writes `directory`/cxx, the C++ compiler behind a script that logs each build (not a ``--version``) and waits
    `delay` seconds before it; returns how many builds the log holds."""
    log, script = directory / "builds.log", directory / "cxx"
    script.write_text(f'#!/bin/sh\n[ "$1" = --version ] || {{ echo build >> "{log}"; sleep {delay}; }}\n'
                      f'exec "{native.compiler(NAME)}" "$@"\n')
    script.chmod(0o755)
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


def other_library(directory: Path) -> Path:
    """A valid shared library of another kernel: it loads, but exports none of the dropout kernel's names."""
    path = directory / "other.so"
    subprocess.run([native.compiler(NAME), *native.FLAGS, "-x", "c++", "-o", str(path), "-"],
                   input='extern "C" int ms_accum_other() { return 0; }\n', text=True, check=True)
    return path


def test_a_build_is_keyed_recorded_and_served_again(cache):
    path = build()
    target, parts = native.locate(NAME, APPENDED)
    assert path == target and path.parent == cache and path.name == f"{NAME}-{native.key_digest(parts)}.so"
    entry = json.loads(native.record_path(path).read_text())
    assert entry["key"] == parts and entry["size"] == path.stat().st_size
    assert set(parts) == {"source", "flags", "machine", "compiler", "libc", "mindspore"}
    assert_checked(path, parts)
    inode = path.stat().st_ino
    native.library.cache_clear()  # another process
    assert build() == path and path.stat().st_ino == inode  # not built again
    assert sorted(p.name for p in cache.iterdir()) == files(path)


def test_two_builds_of_one_key_are_byte_identical(cache, tmp_path, monkeypatch):
    """What makes builds of processes that cannot lock (a file system without locks) harmless: whichever library and
    record land last agree. The record removed, the library is built again: the compiler ran twice."""
    builds = counting_compiler(tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "cxx"))
    first = build().read_bytes()
    native.library.cache_clear()
    os.remove(native.record_path(build()))
    native.library.cache_clear()
    assert build().read_bytes() == first and builds() == 2


def truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])


def text(path: Path) -> None:
    path.write_text("not a library\n")


def another(path: Path) -> None:
    shutil.copyfile(other_library(path.parent.parent), path)


DAMAGE = {"truncated": truncated, "text": text, "another library": another}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("with_record", [False, True], ids=["no record", "a record of its bytes"])
def test_a_bad_file_at_the_name_is_built_again(cache, damage, with_record):
    """A file cut short kills the process that loads it (SIGBUS), a text file is an OSError, another library lacks
    the names: each is built again. Without a record the file is not even loaded; with a record that matches its
    bytes (a library renamed in with its record), the child process's load finds it out."""
    path, parts = native.locate(NAME, APPENDED)
    build()
    DAMAGE[damage](path)
    os.remove(native.record_path(path))
    if with_record:
        native.record(path, parts)
        assert native.recorded(path, parts)
        failure = native.load_failure(path, SYMBOLS)
        assert failure is not None
        if damage == "truncated":
            assert "SIGBUS" in failure or "too short" in failure, failure
        if damage == "another library":
            assert failure == "it lacks ms_accum_slot_set, SeededDropout0"
    native.library.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rebuild is no news: the kernel is the same
        assert build() == path
    assert_checked(path, parts)


@pytest.mark.parametrize("field,value", [("key", {"machine": "aarch64"}), ("sha256", "0" * 64), ("size", 1)])
def test_a_record_of_another_build_is_built_again(cache, field, value):
    path, parts = native.locate(NAME, APPENDED)
    build()
    record = native.record_path(path)
    entry = json.loads(record.read_text())
    entry[field] = {**entry["key"], **value} if field == "key" else value
    record.write_text(json.dumps(entry))
    assert not native.recorded(path, parts)
    native.library.cache_clear()
    assert build() == path
    assert_checked(path, parts)


def test_a_half_written_record_is_no_record(cache):
    path, parts = native.locate(NAME, APPENDED)
    build()
    record = native.record_path(path)
    record.write_text(record.read_text()[:20])
    assert not native.recorded(path, parts)


def test_an_unwritable_cache_builds_for_the_process_and_says_so_once(tmp_path, monkeypatch):
    """Cache under a regular file, so that even root cannot create it (chmod does not stop root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(native.CACHE_ENV, str(blocker / "cache"))
    native.library.cache_clear()
    try:
        with pytest.warns(UserWarning) as caught:
            path = build()
            assert build() == path  # once per process
        messages = [str(w.message) for w in caught]
        assert len(messages) == 1 and "cannot write its kernel cache" in messages[0], messages
        assert "each process builds it again" in messages[0]
        assert not str(path).startswith(str(tmp_path))
        assert native.load_failure(path, SYMBOLS) is None
    finally:
        native.library.cache_clear()


def test_a_cache_that_cannot_be_written_still_serves_its_builds(cache, monkeypatch):
    """A cache filled once and then made read-only (shared by an administrator) serves its builds without a word; a
    bad file in it is replaced by a build of the process's own, said once. Every file the cache writes starts in
    `_temporary`, which refuses here (root writes through a directory's mode bits)."""
    path = build()
    allowed = native._temporary  # pylint: disable=protected-access

    def refused(target):
        if target.parent == cache:
            raise PermissionError(13, "Permission denied", str(target))
        return allowed(target)

    monkeypatch.setattr(native, "_temporary", refused)
    native.library.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build() == path
    truncated(path)
    native.library.cache_clear()
    with pytest.warns(UserWarning, match=r"cannot write its kernel cache .*\[Errno 13\] Permission denied"):
        own = build()
    assert own.parent != cache and native.load_failure(own, SYMBOLS) is None


def test_without_a_compiler_it_is_a_kernel_build_error(cache, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(native.KernelBuildError, match=r"no C\+\+ compiler found to build ms_accum's seeded_dropout "
                                                      r"kernel \(set CXX, or install g\+\+\)\."):
        build()
    monkeypatch.setenv("CXX", "false")  # a program that says no version
    with pytest.raises(native.KernelBuildError, match="does not say its version"):
        build()


def test_a_compiler_whose_library_does_not_load_leaves_the_cache_empty(cache, tmp_path, monkeypatch):
    """A compiler that writes something that is not a library (another target's, a broken toolchain): the child's
    load finds it out, nothing enters the cache, and the caller gets a `KernelBuildError`."""
    fake = tmp_path / "fake-cxx"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "fake c++ 1.0"; exit 0; }\n'
                    'while [ $# -gt 0 ]; do [ "$1" = -o ] && echo junk > "$2"; shift; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(native.KernelBuildError, match="built just now by .*fake-cxx, does not load: .*"):
        build()
    assert [p.suffix for p in cache.iterdir()] == [native.LOCK_SUFFIX]  # no library, no temporary


def test_a_compiler_that_hangs_is_ended_with_its_children_and_is_a_kernel_build_error(cache, tmp_path, monkeypatch):
    """A compiler that never ends (here a script whose child sleeps, as g++'s cc1plus would hang) is killed after
    `TIMEOUT_ENV`'s seconds, with the programs it started; nothing enters the cache."""
    fake, child = tmp_path / "hung-cxx", tmp_path / "child.pid"
    fake.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "hung c++ 1.0"; exit 0; }}\n'
                    f'sleep 600 &\necho $! > "{child}"\nwait\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv(native.TIMEOUT_ENV, "1.5")
    start = time.monotonic()
    with raises_exactly(native.KernelBuildError, f"building ms_accum's {NAME} kernel failed: {fake} did not "
                                 f"end within 1.5 s (set {native.TIMEOUT_ENV} to wait longer)."):
        build()
    assert time.monotonic() - start < 30
    status = Path(f"/proc/{child.read_text().strip()}/stat")
    assert not status.exists() or status.read_text().rpartition(")")[2].split()[0] == "Z"  # ended (a zombie at most)
    assert [p.suffix for p in cache.iterdir()] == [native.LOCK_SUFFIX]


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_a_timeout_variable_that_is_no_positive_number_is_a_kernel_build_error(cache, monkeypatch, value):
    monkeypatch.setenv(native.TIMEOUT_ENV, value)
    with raises_exactly(native.KernelBuildError, f"the environment variable '{native.TIMEOUT_ENV}' must be "
                                 f"a positive number of seconds, but got '{value}'."):
        build()


def test_the_key_changes_with_each_part(monkeypatch):
    compiler = native.compiler(NAME)
    source = (native.KERNELS / f"{NAME}.cc").read_text() + APPENDED
    parts = native.build_key(source, compiler)
    assert parts["compiler"] == native.compiler_identity(compiler)
    assert parts["compiler"] == subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                               check=True).stdout.splitlines()[0]
    assert native.build_key(source, compiler) == parts  # the same machine: the same key
    digests = {native.key_digest(parts)}
    changes = [
        lambda: monkeypatch.setattr(native.platform, "machine", lambda: "aarch64"),
        lambda: monkeypatch.setattr(native, "compiler_identity", lambda path: "clang version 18.1.0"),
        lambda: monkeypatch.setattr(native, "c_library", lambda: "musl 1.2.4"),
        lambda: monkeypatch.setattr(native, "installed_version", lambda: "0.0.1-another"),
        lambda: monkeypatch.setattr(native, "FLAGS", (*native.FLAGS, "-march=native")),
    ]
    for change in changes:
        with monkeypatch.context():
            change()
            digests.add(native.key_digest(native.build_key(source, compiler)))
    digests.add(native.key_digest(native.build_key(source + "\n", compiler)))
    assert len(digests) == 1 + len(changes) + 1


def test_processes_that_find_the_cache_empty_at_once_build_it_once(cache, tmp_path, monkeypatch):
    """Two processes find the cache empty and build together (as msrun's ranks do): the compiler runs once (the second
    waits on the build's lock, then serves the first's build), each gets the path, and what is left is one library
    with its record and its lock. Each process, once it has imported ms_accum, waits for a line on its standard input,
    and the compiler takes 2 s more, so the two builds would overlap without the lock."""
    builds = counting_compiler(tmp_path, delay=2)
    monkeypatch.setenv("CXX", str(tmp_path / "cxx"))
    code = ("import sys\nfrom ms_accum.core import native\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "print(native.library(sys.argv[1], sys.argv[2], tuple(sys.argv[3:])))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-c", code, NAME, APPENDED, *SYMBOLS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    assert [run.stdout.readline() for run in runs] == ["ready\n"] * 2
    for run in runs:
        run.stdin.write("go\n")
        run.stdin.flush()
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
    path, parts = native.locate(NAME, APPENDED)
    assert [out.strip() for out, _ in outputs] == [str(path)] * 2
    assert builds() == 1
    assert_checked(path, parts)
    assert sorted(p.name for p in cache.iterdir()) == files(path)


def test_the_tests_build_into_a_cache_of_their_session(monkeypatch):
    """conftest.py gives every test process, and every process a test starts, a kernel cache of the session's own:
    no test builds into the user's (``~/.cache/ms_accum``)."""
    session = native.cache_dir()
    monkeypatch.delenv(native.CACHE_ENV)
    assert session != native.cache_dir()

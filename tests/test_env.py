"""`ms-accum env` and ``python -m ms_accum.env`` (`ms_accum.env`): what a problem report needs, each fact checked
against what this interpreter finds by other means (importlib.metadata, platform, /proc/cpuinfo, the compiler's own
``--version``, the cache's files), in fresh processes as a user runs them: the command with ``--json``, the module
under a cap, a cache and msrun variables of the test's choosing, and the text form."""
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import mindspore as ms

from ms_accum.core import dropout, native

MSRUN = {"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "2", "MS_NODE_ID": "1", "RANK_ID": "1", "RANK_SIZE": "2",
         "DEVICE_ID": "1", "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "8118"}
ONEDNN = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def run(*command: str, **env) -> str:
    """`command` in a fresh Python with this process's environment changed by `env` (None removes a variable), and
    neither oneDNN's variables (which this process's ms_accum set) nor msrun's unless `env` gives them."""
    changed = {name: value for name, value in os.environ.items() if name not in ONEDNN + tuple(MSRUN)}
    changed.update(env)
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300,
                          env={name: value for name, value in changed.items() if value is not None})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def cpu_isa() -> list:
    """The CPU's AVX2 and AVX-512 flags, read here from /proc/cpuinfo."""
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    return sorted(flag for flag in flags.partition(":")[2].split() if flag == "avx2" or flag.startswith("avx512"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A kernel cache holding this machine's build of the dropout kernel and a damaged build of another key."""
    directory = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(native.CACHE_ENV, str(directory))
        native.library.cache_clear()
        built = Path(native.library(dropout.KERNEL, dropout.ENTRIES, dropout.SYMBOLS))
    native.library.cache_clear()
    damaged = directory / f"{dropout.KERNEL}-{'0' * 16}.so"
    damaged.write_bytes(built.read_bytes()[:1000])
    shutil.copyfile(native.record_path(built), native.record_path(damaged))
    return directory, built.name, damaged.name


def test_ms_accum_env_json_says_what_this_interpreter_knows():
    facts = json.loads(run("-m", "ms_accum.cli", "env", "--json"))
    assert facts["ms_accum"] == importlib.metadata.version("ms_accum")
    assert facts["mindspore"] == importlib.metadata.version("mindspore") == ms.__version__
    assert facts["numpy"] == importlib.metadata.version("numpy")
    assert (facts["python"], facts["platform"]) == (platform.python_version(), platform.platform())
    assert facts["cpu"] == {"machine": platform.machine(), "isa": cpu_isa()}
    avx512 = "avx512f" in cpu_isa()  # ms_accum caps oneDNN there, and only there (`runtime`)
    assert facts["onednn"]["cap"] == ("AVX2" if avx512 else None)
    assert facts["onednn"]["set_by"] == ("ms_accum" if avx512 else None)
    assert facts["onednn"]["variables"] == (list(ONEDNN) if avx512 else [])
    if platform.machine() == "x86_64":  # where MindSpore bundles oneDNN
        assert Path(facts["onednn"]["library"]).name.startswith("libdnnl.so")
        assert facts["onednn"]["isa"] == "avx2" if avx512 else facts["onednn"]["isa"].startswith("avx2")
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    assert facts["compiler"] == {"path": compiler, "version": version.splitlines()[0].strip()}
    assert facts["kernel_cache"]["directory"] == os.environ[native.CACHE_ENV]  # the session's (conftest.py)
    assert facts["kernel_cache"]["set_by"] == native.CACHE_ENV
    assert facts["device"] == "CPU"
    assert facts["msrun"] == {}


def test_python_m_ms_accum_env_says_the_user_s_cap_the_cache_s_builds_and_the_ranks(cache):
    """A cap the user set reaches oneDNN (SSE4.1: the ISA oneDNN reports), each build of the cache is said whole or
    not and this machine's is named, and msrun's variables are the ranks; without a compiler, its error is said."""
    directory, built, damaged = cache
    facts = json.loads(run("-m", "ms_accum.env", "--json", ONEDNN_MAX_CPU_ISA="SSE41", CXX="/nonexistent",
                           **{native.CACHE_ENV: str(directory)}, **MSRUN))
    assert {name: facts["onednn"][name] for name in ("cap", "set_by", "variables")} == {
        "cap": "SSE41", "set_by": "the user", "variables": list(ONEDNN)}  # under both of oneDNN's names
    if platform.machine() == "x86_64":
        assert facts["onednn"]["isa"] == "sse41"
    assert facts["compiler"] == {"error": "no C++ compiler found to build ms_accum's seeded_dropout kernel (set CXX, "
                                          "or install g++)."}
    assert facts["kernel_cache"] == {"directory": str(directory), "set_by": native.CACHE_ENV, "builds": {
        built: {"recorded": True, "this_machine": False},  # no compiler: which key is this machine's is not known
        damaged: {"recorded": False, "this_machine": False}}}
    assert facts["msrun"] == MSRUN
    with_compiler = json.loads(run("-m", "ms_accum.env", "--json", **{native.CACHE_ENV: str(directory)}))
    assert with_compiler["kernel_cache"]["builds"] == {built: {"recorded": True, "this_machine": True},
                                                       damaged: {"recorded": False, "this_machine": False}}


def test_the_text_form_says_the_same_facts_a_line_each(cache):
    directory, built, damaged = cache
    lines = run("-m", "ms_accum.env", **{native.CACHE_ENV: str(directory)}).splitlines()
    assert lines[:4] == [f"ms_accum: {importlib.metadata.version('ms_accum')}", f"mindspore: {ms.__version__}",
                         f"python: {platform.python_version()}", f"numpy: {importlib.metadata.version('numpy')}"]
    assert f"  isa: {' '.join(cpu_isa()) or 'none'}" in lines
    start = lines.index("  builds:")
    said = {built: ["      recorded: yes", "      this_machine: yes"], damaged: ["      recorded: no",
                                                                              "      this_machine: no"]}
    assert lines[start + 1:start + 7] == [line for name in sorted(said) for line in [f"    {name}:", *said[name]]]
    assert lines[-2:] == ["device: CPU", "msrun: none"]


@pytest.mark.slow  # make test-all: one msrun launch of two workers
@pytest.mark.distributed
def test_under_msrun_each_worker_says_its_rank(tmp_path):
    """msrun's variables as msrun sets them, in each worker's log; no cluster is joined (the command ends at once)."""
    from test_distributed import log_lines, msrun
    command = os.path.join(os.path.dirname(sys.executable), "ms-accum")
    code, output = msrun(str(tmp_path), command, "env", "--json")
    assert code == 0, output[-3000:]
    for rank in (0, 1):
        facts = json.loads(next(line for line in log_lines(str(tmp_path), rank) if line.startswith("{")))
        assert {name: facts["msrun"].get(name) for name in ("MS_ROLE", "MS_WORKER_NUM", "RANK_ID", "RANK_SIZE")} == {
            "MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "2", "RANK_ID": str(rank), "RANK_SIZE": "2"}

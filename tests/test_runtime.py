"""runtime: the oneDNN ISA cap only on AVX-512 CPUs, never over the user's choice, always before MindSpore loads."""
import os
import subprocess
import sys

import pytest

from ms_accum import runtime


@pytest.mark.parametrize("flags,user,expected", [
    ({"avx2", "avx512f"}, None, "AVX2"),      # Sapphire Rapids class: the 30-70x slower convolution is avoided
    ({"avx2"}, None, None),                   # AVX2-only: the cap would change nothing, so nothing is set
    ({"avx2", "avx512f"}, "AVX512_CORE", "AVX512_CORE"),  # the user's setting wins
])
def test_isa_cap(monkeypatch, flags, user, expected):
    monkeypatch.setattr(runtime, "_cpu_flags", lambda: flags)
    if user is None:
        monkeypatch.delenv(runtime.ISA_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(runtime.ISA_VARIABLE, user)
    assert runtime.prefer_fast_cpu_kernels() == expected
    assert os.environ.get(runtime.ISA_VARIABLE) == expected


def test_cli_and_runtime_import_without_loading_mindspore():
    # oneDNN reads the variable when MindSpore's libraries load, so the CLI must be importable before that.
    code = "import sys, ms_accum.cli, ms_accum.runtime; print('mindspore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_unknown_device():
    with pytest.raises(ValueError, match="For 'set_device', the argument 'device' must be one of \\['CPU', 'GPU', "
                                         "'Ascend'\\], but got 'TPU'"):
        runtime.set_device("TPU")


def test_lazy_package_exports():
    import ms_accum
    assert ms_accum.Accumulator.__name__ == "Accumulator"
    assert set(ms_accum.__all__) <= set(dir(ms_accum))
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        ms_accum.Nope  # noqa: B018

"""runtime: the oneDNN ISA cap only on AVX-512 CPUs, never over the user's choice, always before MindSpore loads; the
suite runs with it; a process that loaded MindSpore first is warned once, and only where it matters."""
import os
import subprocess
import sys
import textwrap

import pytest

from ms_accum import runtime
from ms_accum._mindspore import ONEDNN_ISA_VARIABLES
from conftest import raises_exactly

AVX512 = "avx512f" in runtime.cpu_flags()
AVX2, AVX512_CORE_BF16 = 0x7, 0xe7  # oneDNN's dnnl_cpu_isa_t codes


@pytest.mark.parametrize("flags,user,expected", [
    ({"avx2", "avx512f"}, None, "AVX2"),      # Sapphire Rapids or EPYC Genoa class: the slow convolutions are avoided
    ({"avx2"}, None, None),                   # AVX2-only: the cap would change nothing, so nothing is set
    ({"avx2", "avx512f"}, "AVX512_CORE", "AVX512_CORE"),  # the user's setting wins
])
def test_isa_cap(monkeypatch, flags, user, expected):
    monkeypatch.setattr(runtime, "cpu_flags", lambda: flags)
    monkeypatch.setattr(runtime, "_state", {**runtime._state, "set_here": False})  # a process that set nothing yet
    for variable in ONEDNN_ISA_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    if user is not None:
        monkeypatch.setenv(runtime.ISA_VARIABLE, user)
    assert runtime.prefer_fast_cpu_kernels() == expected
    assert os.environ.get(runtime.ISA_VARIABLE) == expected
    # oneDNN 2.x (MindSpore 2.8) reads only the older name: the cap, or the user's choice, is set under both
    assert os.environ.get("DNNL_MAX_CPU_ISA") == expected


def test_the_suite_runs_with_the_setting_the_cli_uses():
    # conftest imports ms_accum before mindspore, as the CLI does; oneDNN itself says which kernels it runs.
    isa = runtime.cpu_kernel_isa()
    assert isa is not None, "MindSpore's oneDNN could not be asked"
    if runtime.ISA_VARIABLE in os.environ and os.environ[runtime.ISA_VARIABLE] != "AVX2" and not AVX512:
        pytest.skip(f"{runtime.ISA_VARIABLE} is set to {os.environ[runtime.ISA_VARIABLE]} by the caller")
    assert isa.startswith("avx2"), isa  # capped on AVX-512 CPUs, the CPU's own best on AVX2-only ones
    if AVX512:
        assert os.environ[runtime.ISA_VARIABLE] == "AVX2"


@pytest.mark.parametrize("code,name", [
    (0x7, "avx2"), (0xe7, "avx512_core_bf16"), (0x407, "avx2_vnni"),  # oneDNN 2.x's avx2_vnni
    (0x1ef, "avx512_core_fp16"),  # a 2-core Xeon with AVX512-FP16 (oneDNN 3.10's code)
    (0x3fef, "avx512_core_amx_fp16 (0x3fef)"),  # a newer ISA than the table: what it at least is
    (0x0, "0x0"),
])
def test_isa_names_by_their_bits(code, name):
    assert runtime.isa_name(code) == name
    assert runtime.slow_cpu_kernels("CPU", code, set(), False, False) is name.startswith("avx512")


@pytest.mark.parametrize("device,code,flags,user_set,in_time,slow", [
    ("CPU", AVX512_CORE_BF16, {"avx512f"}, False, False, True),    # mindspore imported first: the slow kernels
    ("CPU", AVX2, {"avx512f"}, False, True, False),                # capped in time
    ("CPU", AVX2, {"avx2"}, False, False, False),                  # an AVX2-only CPU
    ("CPU", AVX512_CORE_BF16, {"avx512f"}, True, False, False),    # the user chose the ISA
    ("GPU", AVX512_CORE_BF16, {"avx512f"}, False, False, False),   # kernels run on the GPU
    ("Ascend", AVX512_CORE_BF16, {"avx512f"}, False, False, False),
    ("CPU", None, {"avx512f"}, False, False, True),                # oneDNN not askable: what ms_accum knows
    ("CPU", None, {"avx512f"}, False, True, False),
    ("CPU", None, {"avx2"}, False, False, False),
])
def test_when_the_slow_kernels_are_reported(device, code, flags, user_set, in_time, slow):
    assert runtime.slow_cpu_kernels(device, code, flags, user_set, in_time) is slow


SCRIPT = """
import warnings
warnings.simplefilter("always")
{first}
from mindspore import nn
from ms_accum import Accumulator, GradientAccumulation, runtime
from ms_accum.graphs import TrainAccumulationCell
net = nn.Dense(3, 2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    TrainAccumulationCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params()), 2)
    Accumulator(nn.SGD(net.trainable_params()), 2)
    GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params()))
ours = [str(w.message) for w in caught if "oneDNN" in str(w.message)]
print("WARNINGS", len(ours))
print("ISA", runtime.cpu_kernel_isa())
for message in ours:
    print("MESSAGE", message)
"""


def run_script(tmp_path, first: str, **env) -> dict:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT.format(first=first)))
    environ = {k: v for k, v in os.environ.items() if k not in ONEDNN_ISA_VARIABLES}
    environ.update(env)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=environ)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0] in
             ("WARNINGS", "ISA", "MESSAGE")]
    return {"warnings": int(dict(lines)["WARNINGS"]), "isa": dict(lines)["ISA"],
            "messages": [text for key, text in lines if key == "MESSAGE"]}


def test_mindspore_imported_first_is_warned_once_on_avx512_cpus(tmp_path):
    result = run_script(tmp_path, "import mindspore")
    if not AVX512:  # nothing to say on an AVX2-only CPU
        assert result == {"warnings": 0, "isa": result["isa"], "messages": []}
        return
    assert result["isa"].startswith("avx512") and result["warnings"] == 1  # three objects built, one warning
    message = result["messages"][0]
    assert "several times slower" in message
    assert "import ms_accum before mindspore" in message and "ONEDNN_MAX_CPU_ISA=AVX2" in message


def test_no_warning_when_ms_accum_came_first_or_the_user_chose(tmp_path):
    first = run_script(tmp_path, "import ms_accum\nimport mindspore")
    assert first["warnings"] == 0 and first["isa"].startswith("avx2")
    # MindSpore first: too late for ms_accum to give the user's choice to MindSpore 2.8's oneDNN under its older name
    chosen = run_script(tmp_path, "import mindspore", ONEDNN_MAX_CPU_ISA="AVX512_CORE", DNNL_MAX_CPU_ISA="AVX512_CORE")
    assert chosen["warnings"] == 0
    # ms_accum first: the user's choice under oneDNN 3.x's name reaches every supported MindSpore's oneDNN
    given = run_script(tmp_path, "import ms_accum\nimport mindspore", ONEDNN_MAX_CPU_ISA="AVX512_CORE")
    assert given["warnings"] == 0
    if AVX512:
        assert chosen["isa"] == given["isa"] == "avx512_core"  # the user's choice is in effect, and respected


def test_cli_and_runtime_import_without_loading_mindspore():
    # oneDNN reads the variable when MindSpore's libraries load, so the CLI must be importable before that.
    code = "import sys, ms_accum.cli, ms_accum.runtime; print('mindspore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_unknown_device():
    with raises_exactly(ValueError, "For 'set_device', the argument 'device' must be one of ['CPU', 'GPU', 'Ascend'], "
                                    "but got 'TPU'."):
        runtime.set_device("TPU")


def test_lazy_package_exports():
    # Each public name loads, on first use, the object its module defines (the package imports no MindSpore itself:
    # test_cli_and_runtime_import_without_loading_mindspore).
    import importlib
    import ms_accum
    for name, module in ms_accum._EXPORTS.items():
        assert getattr(ms_accum, name) is getattr(importlib.import_module(module, "ms_accum"), name)
    with raises_exactly(AttributeError, "module 'ms_accum' has no attribute 'Nope'"):
        ms_accum.Nope  # noqa: B018

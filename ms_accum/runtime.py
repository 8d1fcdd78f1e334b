"""Process setup that must happen before MindSpore loads: the CPU kernel ISA, and the device.

Importing `ms_accum` (any of its modules) before `mindspore` caps oneDNN at AVX2 on AVX-512 CPUs, unless the user set
``ONEDNN_MAX_CPU_ISA`` (docs/mindspore.md, oneDNN's AVX-512 convolutions). This module imports no
MindSpore itself. A process that loaded MindSpore first runs the uncapped kernels; the Cells, the `Accumulator` and the
executor then warn once (`check_cpu_kernels`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from typing import Optional, Tuple

from . import _mindspore
from ._choices import DEVICES
from ._validation import check_value_in, door

ISA_VARIABLE = _mindspore.ONEDNN_ISA_VARIABLES[0]  # the name oneDNN 3.x reads, which users set
# oneDNN's dnnl_cpu_isa_t codes are bit sets, each ISA's bits holding those of the ISAs below it; some values moved
# between oneDNN 2.x (MindSpore 2.8) and 3.x (2.9, 2.10), hence two codes for some names. A code is named by the
# largest ISA whose bits it holds (`isa_name`), so a CPU newer than this table still reads as what it at least is.
_ISA_CODES = {"sse41": (0x1,), "avx": (0x3,), "avx2": (0x7,), "avx2_vnni": (0xf, 0x407), "avx2_vnni_2": (0x1f,),
              "avx512_core": (0x27,), "avx512_core_vnni": (0x67,), "avx512_core_bf16": (0xe7,),
              "avx512_core_fp16": (0x1ef,), "avx512_core_amx": (0xfef, 0x3e7), "avx512_core_amx_fp16": (0x1fef,)}
_AVX512_BIT = 0x20  # avx512_core's own bit, in both oneDNN 2.x and 3.x: every AVX-512 ISA holds it
# What this process did: whether ms_accum set the variable (else the user did), whether it did so before MindSpore
# loaded (in time), and whether it has warned.
_state = {"set_here": False, "capped_before_load": False, "warned": False}


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The CPU's flags (``avx2``, ``avx512f``, ...) as /proc/cpuinfo lists them; empty where it cannot be read."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def prefer_fast_cpu_kernels() -> Optional[str]:
    """
    Caps oneDNN at AVX2 on AVX-512 CPUs, unless the user set `ONEDNN_MAX_CPU_ISA` already.

    oneDNN 3.10 inside MindSpore 2.10 runs AVX-512 convolutions on such CPUs that are many times slower than its AVX2
    ones (docs/mindspore.md, oneDNN's AVX-512 convolutions); on AVX2-only CPUs the cap changes nothing, so it is left
    unset there. oneDNN reads the variable once, when MindSpore's libraries load: importing `ms_accum` first calls this.
    The oneDNN of MindSpore 2.8 reads the variable under its older name, which is set too
    (`ms_accum._mindspore.ONEDNN_ISA_VARIABLES`): every supported MindSpore then runs the same kernels.

    Returns:
        str, the value in effect (the user's, or ``"AVX2"``), or None when nothing was set.
    """
    chosen = _user_choice()
    if chosen is not None:
        for variable in _mindspore.ONEDNN_ISA_VARIABLES:  # the user's choice under every oneDNN's name
            os.environ.setdefault(variable, chosen)
        return chosen
    if "avx512f" in cpu_flags():
        for variable in _mindspore.ONEDNN_ISA_VARIABLES:
            os.environ[variable] = "AVX2"
        _state["set_here"] = True
        _state["capped_before_load"] = "mindspore" not in sys.modules
        return "AVX2"
    return None


def _user_choice() -> Optional[str]:
    """The ISA cap the user set, under either of oneDNN's names; None when ms_accum set it or nobody did."""
    if _state["set_here"]:
        return None
    return next((os.environ[v] for v in _mindspore.ONEDNN_ISA_VARIABLES if v in os.environ), None)


def isa_cap() -> Tuple[Optional[str], Optional[str]]:
    """oneDNN's ISA cap in this process and who set it: (the value, ``"the user"``), (``"AVX2"``, ``"ms_accum"``) on an
    AVX-512 CPU (`prefer_fast_cpu_kernels`), or (None, None)."""
    chosen = _user_choice()
    if chosen is not None:
        return chosen, "the user"
    return (os.environ.get(ISA_VARIABLE), "ms_accum") if _state["set_here"] else (None, None)


def cpu_kernel_isa() -> Optional[str]:
    """
    The instruction set that MindSpore's oneDNN runs its CPU kernels with, as oneDNN reports it.

    Returns:
        str, e.g. ``"avx2"`` or ``"avx512_core_bf16"`` (`isa_name`); None when MindSpore (so its oneDNN) is not loaded
        yet, or its oneDNN cannot be asked.
    """
    code = _isa_code()
    return None if code is None else isa_name(code)


def isa_name(code: int) -> str:
    """The name of oneDNN's ISA `code`: its own, else the largest known ISA whose bits it holds, with the code
    (``"avx512_core_fp16 (0x1ff)"``); ``hex(code)`` when it holds none."""
    exact = [name for name, codes in _ISA_CODES.items() if code in codes]
    if exact:
        return exact[0]
    held = [(bin(c).count("1"), name) for name, codes in _ISA_CODES.items() for c in codes if c & ~code == 0]
    return f"{max(held)[1]} ({hex(code)})" if held else hex(code)


def _isa_code() -> Optional[int]:
    if "mindspore" not in sys.modules:  # nothing loaded yet: asking now would fix the answer too early (cached)
        return None
    library = _mindspore.onednn()
    if library is None:
        return None
    return library.dnnl_get_effective_cpu_isa()  # a dnnl_cpu_isa_t: ctypes' default result type, a C int


def slow_cpu_kernels(device: str, isa_code: Optional[int], cpu_flags: set, user_set: bool,
                     capped_before_load: bool) -> bool:
    """Whether MindSpore runs the slow AVX-512 kernels that the user did not choose (the decision behind
    `check_cpu_kernels`, without the process's state)."""
    if device != "CPU" or user_set:
        return False
    if isa_code is not None:
        return bool(isa_code & _AVX512_BIT)
    return "avx512f" in cpu_flags and not capped_before_load  # oneDNN could not be asked: what ms_accum knows


def check_cpu_kernels() -> bool:
    """
    Warns, once per process, when MindSpore's CPU kernels run uncapped on an AVX-512 CPU because MindSpore was loaded
    before `ms_accum` (and the user did not choose the ISA). Called when a Cell, the `Accumulator` or the executor is
    built. Nothing is said on AVX2-only CPUs, on GPU or Ascend, or when the user set ``ONEDNN_MAX_CPU_ISA``.

    Returns:
        bool, whether the slow kernels are in use.
    """
    if _state["warned"]:  # said once; the kernels of a process do not change once MindSpore has loaded them
        return True
    import mindspore as ms
    user_set = _user_choice() is not None
    slow = slow_cpu_kernels(ms.get_context("device_target"), _isa_code(), cpu_flags(), user_set,
                            _state["capped_before_load"])
    if slow:
        _state["warned"] = True
        warnings.warn(f"MindSpore's oneDNN runs AVX-512 kernels on this CPU ({cpu_kernel_isa()}), "
                      f"whose convolutions in MindSpore are several times slower than its AVX2 ones "
                      f"(docs/mindspore.md, oneDNN's AVX-512 convolutions): mindspore was imported before ms_accum, "
                      f"too late for ms_accum to cap them. Fix: import ms_accum before mindspore, or set "
                      f"{ISA_VARIABLE}=AVX2 before starting Python.", RuntimeWarning, stacklevel=3)
    return slow


@door("set_device")
def set_device(device: str = "CPU", graph_mode: bool = True) -> None:
    """
    Selects the device with `mindspore.set_device` and the execution mode.

    Args:
        device (str): ``"CPU"``, ``"GPU"`` or ``"Ascend"``. Default: ``"CPU"``.
        graph_mode (bool): GRAPH_MODE (default) or PYNATIVE_MODE.

    Raises:
        ValueError: If `device` is unknown.
    """
    check_value_in(device, "device", DEVICES)
    import mindspore as ms
    # MindSpore refuses set_device once kernels have run, even to the same device: skip it when nothing changes
    # (a second call in one process, e.g. a script that trains and then evaluates).
    if ms.get_context("device_target") != device:
        ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE if graph_mode else ms.PYNATIVE_MODE)


if "mindspore" not in sys.modules:  # importing ms_accum first is the fix the warning gives
    prefer_fast_cpu_kernels()

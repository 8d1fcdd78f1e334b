"""Process setup that must happen before MindSpore loads: the CPU kernel ISA, and the device.

Importing `ms_accum` (any of its modules) before `mindspore` caps oneDNN at AVX2 on AVX-512 CPUs, unless the user set
``ONEDNN_MAX_CPU_ISA`` (docs/mindspore.md, oneDNN's AVX-512 convolutions). This module imports no
MindSpore itself. A process that loaded MindSpore first runs the uncapped kernels; the Cells, the `Accumulator` and the
executor then warn once (`check_cpu_kernels`).
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import warnings
from typing import Optional

from ._choices import DEVICES
from ._validation import check_value_in, door

ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
# dnnl_cpu_isa_t values of oneDNN 3.x (dnnl_types.h): each ISA's bits include those of the ISAs below it.
_ISA_NAMES = {0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xf: "avx2_vnni", 0x1f: "avx2_vnni_2", 0x27: "avx512_core",
              0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16", 0x1e7: "avx10_1_512", 0xfe7: "avx512_core_amx",
              0x1fe7: "avx512_core_amx_fp16", 0x3fe7: "avx10_2_512_amx_2"}
_AVX512_BIT = 0x20
_DNNL_LIBRARY = "libdnnl.so.3"  # the oneDNN that MindSpore 2.10 ships in mindspore/lib
# What this process did: whether ms_accum set the variable (else the user did), whether it did so before MindSpore
# loaded (in time), and whether it has warned.
_state = {"set_here": False, "capped_before_load": False, "warned": False}


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def prefer_fast_cpu_kernels() -> Optional[str]:
    """
    Caps oneDNN at AVX2 on AVX-512 CPUs, unless the user set `ONEDNN_MAX_CPU_ISA` already.

    oneDNN 3.10 inside MindSpore 2.10 runs AVX-512 convolutions on such CPUs that are many times slower than its AVX2
    ones (docs/mindspore.md, oneDNN's AVX-512 convolutions); on AVX2-only CPUs the cap changes nothing, so it is left
    unset there. oneDNN reads the variable once, when MindSpore's libraries load: importing `ms_accum` first calls this.

    Returns:
        str, the value in effect (the user's, or ``"AVX2"``), or None when nothing was set.
    """
    if ISA_VARIABLE in os.environ:
        return os.environ[ISA_VARIABLE]
    if "avx512f" in _cpu_flags():
        os.environ[ISA_VARIABLE] = "AVX2"
        _state["set_here"] = True
        _state["capped_before_load"] = "mindspore" not in sys.modules
        return "AVX2"
    return None


def cpu_kernel_isa() -> Optional[str]:
    """
    The instruction set that MindSpore's oneDNN runs its CPU kernels with, as oneDNN reports it.

    Returns:
        str, e.g. ``"avx2"`` or ``"avx512_core_bf16"``; None when MindSpore (so its oneDNN) is not loaded yet, or its
        oneDNN cannot be asked.
    """
    code = _isa_code()
    return None if code is None else _ISA_NAMES.get(code, hex(code))


def _isa_code() -> Optional[int]:
    if "mindspore" not in sys.modules:
        return None
    try:  # RTLD_NOLOAD: the library MindSpore loaded, never a second copy
        library = ctypes.CDLL(_DNNL_LIBRARY, mode=os.RTLD_NOLOAD)
        ask = library.dnnl_get_effective_cpu_isa
    except (OSError, AttributeError):
        return None
    ask.restype = ctypes.c_int
    return int(ask())


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
    user_set = ISA_VARIABLE in os.environ and not _state["set_here"]
    slow = slow_cpu_kernels(ms.get_context("device_target"), _isa_code(), _cpu_flags(), user_set,
                            _state["capped_before_load"])
    if slow:
        _state["warned"] = True
        warnings.warn(f"MindSpore's oneDNN runs AVX-512 kernels on this CPU ({cpu_kernel_isa()}), "
                      f"whose convolutions in MindSpore 2.10 are several times slower than its AVX2 ones "
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

"""Process setup that must happen before MindSpore loads: the CPU kernel ISA, and the device.

Import this module before `mindspore` (the CLI and the tutorials do). It does not import MindSpore itself.
"""
from __future__ import annotations

import os
from typing import Optional

DEVICES = ("CPU", "GPU", "Ascend")
ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def prefer_fast_cpu_kernels() -> Optional[str]:
    """
    Caps oneDNN at AVX2 on AVX-512 CPUs, unless the user set `ONEDNN_MAX_CPU_ISA` already.

    On AVX-512 machines oneDNN 3.10 inside MindSpore 2.10 picks a convolution kernel 30-70x slower than its
    AVX2 path (LeNet5 b32 train step 63 ms -> 6.6 ms on Sapphire Rapids). On AVX2-only CPUs the cap changes
    nothing (measured on an AMD EPYC: 8.2-9.5 ms per step either way), so it is left unset there. oneDNN reads
    the variable once, when MindSpore's libraries load: call this first.

    Returns:
        str, the value in effect (the user's, or ``"AVX2"``), or None when nothing was set.
    """
    if ISA_VARIABLE in os.environ:
        return os.environ[ISA_VARIABLE]
    if "avx512f" in _cpu_flags():
        os.environ[ISA_VARIABLE] = "AVX2"
        return "AVX2"
    return None


def set_device(device: str = "CPU", graph_mode: bool = True) -> None:
    """
    Selects the device with `mindspore.set_device` and the execution mode.

    Args:
        device (str): ``"CPU"``, ``"GPU"`` or ``"Ascend"``. Default: ``"CPU"``.
        graph_mode (bool): GRAPH_MODE (default) or PYNATIVE_MODE.

    Raises:
        ValueError: If `device` is unknown.
    """
    from ._validation import check_value_in
    check_value_in(device, "device", DEVICES, "set_device")
    import mindspore as ms
    # MindSpore refuses set_device once kernels have run, even to the same device: skip it when nothing changes
    # (a second call in one process, e.g. a script that trains and then evaluates).
    if ms.get_context("device_target") != device:
        ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE if graph_mode else ms.PYNATIVE_MODE)

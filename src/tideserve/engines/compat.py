"""Refuse to start a replica whose engine target the device cannot run.

An engine built for one CPU ISA or CUDA compute capability must not be loaded elsewhere
(an sm_86 engine fails on sm_89): the check runs before the model loads and raises
EngineMismatchError naming both sides, so the runtime can mark the pool unschedulable
instead of restarting it in a loop.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

from tideserve.errors import EngineMismatchError
from tideserve.nvml import cuda_archs
from tideserve.spec.models import Target

_ISA_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class DeviceInfo:
    """What this machine offers: its CPU ISA and flags (``/proc/cpuinfo``), and the compute
    capabilities of its GPUs (``sm90``)."""

    cpu_isa: str
    cuda_archs: tuple[str, ...] = field(default_factory=tuple)
    cpu_flags: frozenset[str] = field(default_factory=frozenset)


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def probe_device() -> DeviceInfo:
    """This machine: CPU ISA (``platform.machine()``), CPU flags, and the CUDA compute
    capability of each GPU (through NVML; none without a driver)."""
    machine = platform.machine().lower()
    return DeviceInfo(cpu_isa=_ISA_ALIASES.get(machine, machine), cuda_archs=cuda_archs(), cpu_flags=_cpu_flags())


def check_target(target: Target, device: DeviceInfo) -> None:
    """Raise EngineMismatchError if an engine for ``target`` cannot run on ``device``."""
    if target.device == "cpu":
        if target.arch != device.cpu_isa:
            raise EngineMismatchError(
                f"engine target {target.name} is built for CPU ISA {target.arch}, but this machine is {device.cpu_isa}; "
                f"use target cpu-{device.cpu_isa}-{target.compute_type}"
            )
        return
    if not device.cuda_archs:
        raise EngineMismatchError(f"engine target {target.name} needs a CUDA GPU ({target.arch}); this machine has none")
    if target.arch not in device.cuda_archs:
        raise EngineMismatchError(
            f"engine target {target.name} is built for {target.arch}, but this machine's GPUs are "
            f"{', '.join(device.cuda_archs)}; build an engine for cuda-{device.cuda_archs[0]}-{target.compute_type}"
        )

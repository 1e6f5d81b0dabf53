"""The NVML adapter (package nvidia-ml-py, module ``pynvml``): the only importer of it.

``load()`` returns the initialised module, or None without a GPU, driver or library, so
callers treat "no GPU" uniformly.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from collections.abc import Callable

log = logging.getLogger("tideserve.nvml")


def load() -> ModuleType | None:
    """The initialised ``pynvml`` module, or None. Without nvidia-ml-py (the ``gpu`` extra) on a
    machine with an NVIDIA driver (``/dev/nvidiactl`` exists) it logs a warning naming the extra,
    since its GPUs then go unseen."""
    try:
        import pynvml
    except ModuleNotFoundError:
        if os.path.exists("/dev/nvidiactl"):
            log.warning("this machine has an NVIDIA driver but nvidia-ml-py is not installed, so its GPUs are "
                        "not seen; install the 'gpu' extra: pip install 'tideserve[gpu]'")
        return None
    try:
        pynvml.nvmlInit()
        return pynvml
    except Exception as exc:
        log.debug("NVML unavailable: %s", exc)
        return None


def _per_gpu(nvml: ModuleType | None, read: Callable[[ModuleType, object], str], what: str) -> tuple[str, ...]:
    """``read(nvml, handle)`` for each visible GPU; empty without GPUs or when NVML fails."""
    nv = nvml if nvml is not None else load()
    if nv is None:
        return ()
    try:
        return tuple(read(nv, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount()))
    except Exception as exc:
        log.warning("reading GPU %s failed: %s", what, exc)
        return ()


def cuda_archs(nvml: ModuleType | None = None) -> tuple[str, ...]:
    """Compute capability of each visible GPU as ``smXY`` (e.g. ``sm90`` for an H100/H200);
    empty without GPUs."""
    def arch(nv: ModuleType, handle: object) -> str:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
        return f"sm{major}{minor}"

    return _per_gpu(nvml, arch, "compute capabilities")


def gpu_names(nvml: ModuleType | None = None) -> tuple[str, ...]:
    """Each visible GPU's product name (e.g. ``NVIDIA H200``); empty without GPUs."""
    def name(nv: ModuleType, handle: object) -> str:
        n = nv.nvmlDeviceGetName(handle)
        return n.decode() if isinstance(n, bytes) else str(n)

    return _per_gpu(nvml, name, "names")

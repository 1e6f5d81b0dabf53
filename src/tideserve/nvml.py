"""The NVML adapter (package nvidia-ml-py, module ``pynvml``): the only importer of it.

``load()`` returns the initialised module, or None without a GPU, driver or library, so
callers treat "no GPU" uniformly.
"""

from __future__ import annotations

import logging
from types import ModuleType

log = logging.getLogger("tideserve.nvml")


def load() -> ModuleType | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception as exc:  # noqa: BLE001 - no driver, no library, no GPU: all mean "none"
        log.debug("NVML unavailable: %s", exc)
        return None


def cuda_archs(nvml: ModuleType | None = None) -> tuple[str, ...]:
    """Compute capability of each visible GPU as ``smXY`` (e.g. ``sm90`` for an H100/H200);
    empty without GPUs."""
    nv = nvml if nvml is not None else load()
    if nv is None:
        return ()
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(nv.nvmlDeviceGetHandleByIndex(i))
            out.append(f"sm{major}{minor}")
        return tuple(out)
    except Exception as exc:  # noqa: BLE001
        log.warning("reading GPU compute capabilities failed: %s", exc)
        return ()


def gpu_names(nvml: ModuleType | None = None) -> tuple[str, ...]:
    """Each visible GPU's product name (e.g. ``NVIDIA H200``); empty without GPUs."""
    nv = nvml if nvml is not None else load()
    if nv is None:
        return ()
    try:
        names = []
        for i in range(nv.nvmlDeviceGetCount()):
            name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return tuple(names)
    except Exception as exc:  # noqa: BLE001
        log.warning("reading GPU names failed: %s", exc)
        return ()

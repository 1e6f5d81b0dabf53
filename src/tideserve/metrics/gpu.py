"""GPU metrics through NVML (nvidia-ml-py), with Triton's names, for the worker's /metrics.

- ``nv_gpu_utilization`` (0.0-1.0), ``nv_gpu_memory_total_bytes``, ``nv_gpu_memory_used_bytes``,
  ``nv_gpu_power_usage`` (W), ``nv_gpu_power_limit`` (W), labelled ``gpu_uuid``
  (Triton metrics doc, "GPU Metrics").

Without a GPU or driver (NVML fails to initialise) the series are absent, not zero, so a
dashboard shows "no data" rather than an idle GPU. NVML comes through ``tideserve.nvml``.
"""

from __future__ import annotations

import logging
from types import ModuleType

from tideserve.nvml import load

log = logging.getLogger("tideserve.metrics.gpu")

_HELP = {
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
}


class GpuMetrics:
    """Reads every GPU NVML sees. ``nvml``: a module with pynvml's API (tests pass a fake)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = None
        self._handles: list = []
        try:
            if nvml is None:
                nvml = load()
                if nvml is None:
                    return
            else:
                nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            self._nvml = nvml
        except Exception as exc:
            log.debug("no GPU metrics: %s", exc)

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def render(self) -> str:
        """Prometheus text for every GPU; empty without GPUs or when a read fails."""
        if not self.available:
            return ""
        nv = self._nvml
        assert nv is not None  # self.available
        values: dict[str, list[tuple[str, float]]] = {k: [] for k in _HELP}
        try:
            for h in self._handles:
                uuid = nv.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                values["nv_gpu_utilization"].append((uuid, nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0))
                values["nv_gpu_memory_total_bytes"].append((uuid, float(mem.total)))
                values["nv_gpu_memory_used_bytes"].append((uuid, float(mem.used)))
                values["nv_gpu_power_usage"].append((uuid, nv.nvmlDeviceGetPowerUsage(h) / 1000.0))
                values["nv_gpu_power_limit"].append((uuid, nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0))
        except Exception as exc:
            log.warning("reading GPU metrics failed: %s", exc)
            return ""
        lines = []
        for name, (kind, help_) in _HELP.items():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{gpu_uuid="{uuid}"}} {v!r}' for uuid, v in values[name]]
        return "\n".join(lines) + "\n"

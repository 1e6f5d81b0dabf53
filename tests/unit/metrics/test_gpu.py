from types import SimpleNamespace

from tideserve.metrics.gpu import GpuMetrics
from tideserve.metrics.parse import sample_value


class FakeNvml:
    """The part of pynvml's API GpuMetrics uses: two GPUs."""

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=[37, 100][h])

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=141 * 2**30, used=[2**30, 2**31][h])

    def nvmlDeviceGetPowerUsage(self, h):
        return [123_456, 700_000][h]  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000


def test_triton_gpu_metrics_from_nvml():
    text = GpuMetrics(FakeNvml()).render()
    assert sample_value(text, "nv_gpu_utilization", {"gpu_uuid": "GPU-0"}) == 0.37
    assert sample_value(text, "nv_gpu_utilization", {"gpu_uuid": "GPU-1"}) == 1.0
    assert sample_value(text, "nv_gpu_memory_total_bytes", {"gpu_uuid": "GPU-0"}) == 141 * 2**30
    assert sample_value(text, "nv_gpu_memory_used_bytes", {"gpu_uuid": "GPU-1"}) == 2**31
    assert sample_value(text, "nv_gpu_power_usage", {"gpu_uuid": "GPU-0"}) == 123.456
    assert sample_value(text, "nv_gpu_power_limit", {"gpu_uuid": "GPU-1"}) == 700.0


class NoDriver(FakeNvml):
    def nvmlInit(self):
        raise OSError("NVML Shared Library Not Found")


def test_absent_not_zero_without_a_gpu():
    g = GpuMetrics(NoDriver())
    assert not g.available and g.render() == ""


def test_a_failed_read_leaves_the_series_out():
    class Flaky(FakeNvml):
        def nvmlDeviceGetPowerUsage(self, h):
            raise RuntimeError("GPU is lost")

    assert GpuMetrics(Flaky()).render() == ""


def test_cuda_compute_capabilities_from_nvml():
    from tideserve.nvml import cuda_archs

    class WithCC(FakeNvml):
        def nvmlDeviceGetCudaComputeCapability(self, h):
            return [(9, 0), (8, 6)][h]

    assert cuda_archs(WithCC()) == ("sm90", "sm86")
    assert cuda_archs(None) == () or all(a.startswith("sm") for a in cuda_archs(None))

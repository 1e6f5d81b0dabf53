import pytest

from tideserve.engines import DeviceInfo, check_target, probe_device
from tideserve.errors import EngineMismatchError
from tideserve.spec import Target


def test_matching_cpu_target_passes():
    check_target(Target.parse("cpu-x86_64-int8"), DeviceInfo("x86_64"))


def test_other_isa_is_refused_naming_both():
    with pytest.raises(EngineMismatchError, match="built for CPU ISA aarch64, but this machine is x86_64"):
        check_target(Target.parse("cpu-aarch64-int8"), DeviceInfo("x86_64"))


def test_cuda_target_without_gpu():
    with pytest.raises(EngineMismatchError, match="needs a CUDA GPU \\(sm90\\); this machine has none"):
        check_target(Target.parse("cuda-sm90-bf16"), DeviceInfo("x86_64"))


def test_cuda_target_for_another_architecture():
    with pytest.raises(EngineMismatchError, match="built for sm86, but this machine's GPUs are sm89"):
        check_target(Target.parse("cuda-sm86-fp16"), DeviceInfo("x86_64", ("sm89",)))
    check_target(Target.parse("cuda-sm89-fp16"), DeviceInfo("x86_64", ("sm89",)))


def test_probe_reports_this_machine():
    import platform

    d = probe_device()
    assert d.cpu_isa in ("x86_64", "aarch64", platform.machine().lower()) and d.cuda_archs == ()

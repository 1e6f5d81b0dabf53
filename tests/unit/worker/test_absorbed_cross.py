"""The cross-attention over one FP8 copy of the encoder's output with the projections absorbed
(``torch_whisper.cuda_kernels``), checked on the CPU through ``absorbed_attend_reference``, the
kernel's PyTorch model (its two FP8 roundings included): the cache fill, the model's step against
PyTorch's attention over unquantized keys and values, and the real tiny.en's text. The CUDA
kernel itself is the GPU's to check against that reference (``bench/absorbed_mma.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import audio
from tideserve.spec.models import Decoding, Target
from tideserve.worker.backends.base import WindowTask
from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend
from tideserve.worker.backends.torch_whisper.cuda_kernels import E4M3_MAX, absorbed_attend, quantize_positions_into
from tideserve.worker.backends.torch_whisper.model import KVCache, Whisper, WhisperDims


def test_the_fill_writes_each_position_with_its_own_scale_into_the_rows_asked() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 10, 64) * torch.tensor([1.0, 5.0, 0.01])[:, None, None]
    e8 = torch.zeros(5, 10, 64, dtype=torch.float8_e4m3fn)
    scale = torch.full((5, 10), -1.0)
    quantize_positions_into(x, e8, scale, rows=torch.tensor([4, 0, 2]))
    for row, k in ((4, 0), (0, 1), (2, 2)):
        assert torch.allclose(scale[row], x[k].abs().amax(dim=1) / E4M3_MAX)
        back = e8[row].float() * scale[row][:, None]
        # E4M3 keeps 3 bits of mantissa: within 1/16 of the value, or 2^-9 of the scale among subnormals
        assert ((back - x[k]).abs() <= x[k].abs() / 16 + scale[row][:, None] * 2 ** -9 * E4M3_MAX / 448).all()
    assert (scale[[1, 3]] == -1.0).all() and (e8[[1, 3]].float() == 0).all()  # rows not asked: untouched
    with pytest.raises(ValueError, match="does not fit"):
        quantize_positions_into(x[:, :, :32], e8, scale)


def test_the_step_over_the_absorbed_cache_matches_attention_over_the_keys_and_values() -> None:
    torch.manual_seed(0)
    dims = WhisperDims(d_model=128, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=256,
                       decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=256, vocab_size=300)
    model = Whisper(dims).eval()
    for p in model.parameters():  # a trained model's biases are not zero: the value bias must reach the output
        torch.nn.init.normal_(p, std=0.3 if p.dim() == 1 else p.shape[-1] ** -0.5)
    encoded = torch.randn(3, dims.max_source_positions, dims.d_model)
    plain = KVCache(dims, 4, torch.float32, torch.device("cpu"))
    absorbed = KVCache(dims, 4, torch.float32, torch.device("cpu"), cross_fp8=True, cross_absorbed=True)
    assert absorbed.cross_k == [] and absorbed.cross_e is not None and absorbed.cross_e.shape == (4, 1500, 128)
    rows = torch.tensor([2, 0, 1])
    with torch.no_grad():
        model.fill_cross(plain, encoded)
        model.fill_cross(absorbed, encoded[[1, 2, 0]], rows=rows)  # the same windows through the rows path
        tokens, positions = torch.tensor([5, 17, 250]), torch.tensor([0, 0, 0])
        want = model.step(plain, tokens, positions)
        got = model.step(absorbed, tokens, positions)
    cos = torch.nn.functional.cosine_similarity(got, want, dim=1)
    assert (cos > 0.999).all(), cos  # FP8 E, queries and probabilities: close, not equal
    assert (got - want).abs().max() > 0  # the roundings are there
    with pytest.raises(ValueError, match="needs cross_fp8"):
        KVCache(dims, 2, torch.float32, torch.device("cpu"), cross_absorbed=True)


def test_tiny_en_writes_the_same_text_over_the_absorbed_cache(tiny_en_hf_dir: Path) -> None:
    clips = audio.load_en_clips()
    texts = {}
    for absorbed in (False, True):
        b = TorchWhisperBackend(tiny_en_hf_dir, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1),
                                cross_fp8=absorbed, cross_absorbed=absorbed, attention="sdpa")
        got, _ = b.transcribe_batch([WindowTask(samples=c.samples, timestamps=True) for c in clips])
        texts[absorbed] = [[(s.start_s, s.end_s, s.text) for s in r.segments] for r in got]
    assert texts[True] == texts[False]
    assert len(clips) >= 3 and all(texts[True])


def test_inputs_that_do_not_fit_together_are_refused() -> None:
    qa = torch.randn(2, 4, 128)
    e8 = torch.zeros(3, 50, 128, dtype=torch.float8_e4m3fn)
    good = torch.ones(3, 50)
    assert absorbed_attend(qa, e8, good, 32).shape == (2, 4, 128)  # the CPU runs the reference
    wide = torch.ones(3, 54)
    for bad_e8, bad_scale in ((e8, wide[:, :50]),                 # scale rows 54 apart, not 50
                              (e8, good.to(torch.bfloat16)),       # scale not float32
                              (e8[:1], good[:1]),                  # fewer cache rows than queries
                              (e8[:, :, :64], good),               # another width
                              (e8.float(), good)):                 # E not FP8
        with pytest.raises(ValueError, match="absorbed_attend"):
            absorbed_attend(qa, bad_e8, bad_scale, 32)


def _nvrtc_compile(monkeypatch: pytest.MonkeyPatch):
    """PyTorch's NVRTC compile (``torch.cuda._utils._nvrtc_compile``: CUDA C to a CUBIN, no GPU
    needed once an architecture is named), with CUDA_HOME pointed at the NVRTC wheel where it is
    unset. The Makefile installs PyPI's torch, whose CUDA build brings that wheel
    (``nvidia/cu13``), so its absence is a broken install, not a reason to skip."""
    import os

    import torch.cuda._utils as utils

    if not os.environ.get("CUDA_HOME"):
        import nvidia  # the namespace package of NVIDIA's wheels, beside torch's CUDA build
        import torch.utils.cpp_extension as ext

        roots = [Path(p) / sub for p in nvidia.__path__ for sub in ("cu13", "cuda_nvrtc") if (Path(p) / sub / "include").is_dir()]
        assert roots, f"no NVRTC wheel under {list(nvidia.__path__)} and no CUDA_HOME: reinstall torch as the Makefile does"
        monkeypatch.setenv("CUDA_HOME", str(roots[0]))
        monkeypatch.setattr(ext, "CUDA_HOME", str(roots[0]))
    return utils._nvrtc_compile


@pytest.mark.parametrize("d,hp", [(1280, 24), (384, 8), (1024, 16), (512, 8), (768, 16)])
def test_both_kernels_compile_for_their_gpus_at_whisper_widths(monkeypatch: pytest.MonkeyPatch, d: int, hp: int) -> None:
    """Every build the GPU code picks compiles (NVRTC, then ptxas inside it): the mma.sync kernel
    for sm_89 and sm_90, the warp-group kernel for sm_90a. A syntax or PTX error in either would
    otherwise first show on a GPU machine."""
    from tideserve.worker.backends.torch_whisper.cuda_kernels import kernel_source

    nvrtc_compile = _nvrtc_compile(monkeypatch)
    for defines, arch, name in (("", "89", "absorbed_mma"), ("", "90", "absorbed_mma"), ("WGMMA", None, "absorbed_wgmma"),
                                ("WGMMA,WG_PROMOTE", None, "absorbed_wgmma"), ("WGMMA,WG_SW128", None, "absorbed_wgmma"),
                                ("WGMMA,WG_TMA", None, "absorbed_wgmma"), ("WGMMA,WG_TMA,WG_LOADS_ONLY", None, "absorbed_wgmma")):
        src, kernel, want_arch = kernel_source(d, hp, defines)
        assert kernel == name
        assert want_arch == ("90a" if "WGMMA" in defines else None)
        cubin, lowered = nvrtc_compile(src, kernel, compute_capability=arch or want_arch, nvcc_options=["--std=c++17"])
        assert lowered == kernel and len(cubin) > 10_000


def test_every_served_build_fits_a_hopper_block_at_whisper_widths() -> None:
    """Each served build's shared memory at large-v3's width and 24 padded heads fits the 227 KB
    (232,448 bytes) an H100 or H200 block may have; the swizzled builds add 1 KB to align E's
    stages and the tensor-copy build two mbarriers, and ``WG_TMA`` brings the swizzle with it."""
    from tideserve.worker.backends.torch_whisper import cuda_kernels as ck

    assert ck.smem_bytes_wg(1280, 24) == 209_984
    assert ck.smem_bytes_wg(1280, 24, "WGMMA,WG_SW128") == 209_984 + 1024
    assert ck.smem_bytes_wg(1280, 24, "WGMMA,WG_TMA") == 209_984 + 1024 + 16
    assert ck.smem_bytes_wg(576, 16, "WGMMA,WG_SW128") - ck.smem_bytes_wg(576, 16) == 2 * 64 * 64 + 1024  # 4.5 columns -> 5
    for d, hp in ((384, 8), (512, 8), (768, 16), (1024, 16), (1280, 24)):
        for build in ck.SERVED_BUILDS:
            if build:
                assert ck.smem_bytes_wg(d, hp, build) <= 232_448, (d, build)
    assert "#define WG_SW128" in ck.kernel_source(1280, 24, "WGMMA,WG_TMA")[0]


def test_the_tensor_copy_build_encodes_one_map_a_cache_and_passes_it_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default build on sm_90 (``WGMMA,WG_TMA``) on a recording stand-in for the CUDA driver:
    the tensor map of ``e8 [N, T, D]`` has dims (D, T, N), byte strides (D, T x D), boxes of 128
    bytes x 64 positions x 1 row, the 128-byte swizzle and zero fill, sits 64-byte aligned, is
    encoded once per tensor and shape, and goes to ``cuLaunchKernel`` as the last of 12
    parameters with the build's shared memory; a driver error is raised with its message."""
    import ctypes

    import torch.cuda._utils as cu
    from tideserve.worker.backends.torch_whisper import cuda_kernels as ck

    encodes: list[tuple] = []
    launches: list[tuple] = []

    class Driver:
        refuse = False

        def cuTensorMapEncodeTiled(self, *a: object) -> int:
            encodes.append(a)
            return 1 if self.refuse else 0

        def cuLaunchKernel(self, *a: object) -> int:
            params = a[9]  # read while the launch's parameters are alive, as the driver copies them
            launches.append((*a, ctypes.c_int.from_address(params[6]).value, ctypes.c_double.from_address(params[10]).value))
            return 0

        def cuGetErrorString(self, code: int, out: object) -> int:
            ctypes.cast(out, ctypes.POINTER(ctypes.c_char_p))[0] = b"invalid argument"
            return 0

    driver = Driver()
    monkeypatch.setattr(cu, "_get_gpu_runtime_library", lambda: driver)
    monkeypatch.setattr(ck, "_maps", {})
    e8 = torch.zeros(3, 130, 576, dtype=torch.uint8)
    addr = ck.tensor_map(e8)
    assert addr % 64 == 0 and ck.tensor_map(e8) == addr and len(encodes) == 1
    a = encodes[0]
    assert len(a) == 12 and a[1:3] == (0, 3) and a[3].value == e8.data_ptr()
    assert (list(a[4]), list(a[5]), list(a[6]), list(a[7])) == ([576, 130, 3], [576, 130 * 576], [128, 64, 1], [1, 1, 1])
    assert a[8:] == (0, 3, 3, 0)  # no interleave, CU_TENSOR_MAP_SWIZZLE_128B, L2 256B promotion, zero fill
    ck.tensor_map(e8[:2])  # another shape at the same address: a map of its own
    assert len(encodes) == 2

    class Kernel:
        func = ctypes.c_void_p(1234)

    monkeypatch.setattr(ck, "_compiled", lambda d, hp, defines="": (Kernel(), ck.smem_bytes_wg(d, hp, defines)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"_as_parameter_": ctypes.c_void_p(99)})())
    args = [e8, e8, e8, e8, e8, 20, 130, 1, 7, 8, 0.125]
    ck._launch(576, 24, (3, 1), args, "WGMMA,WG_TMA")
    f, gx, gy, gz, bx, by, bz, smem, stream, params, extra, t_param, scale_param = launches[0]
    assert (f.value, gx, gy, gz, bx, by, bz, smem, stream.value, extra) == (1234, 3, 1, 1, 256, 1, 1,
                                                                           ck.smem_bytes_wg(576, 24, "WGMMA,WG_TMA"), 99, None)
    assert len(params) == 12 and params[11] == addr
    assert (t_param, scale_param) == (130, 0.125)
    driver.refuse = True
    with pytest.raises(RuntimeError, match="invalid argument"):
        ck.tensor_map(torch.zeros(1, 64, 128, dtype=torch.uint8))


def test_the_served_build_is_chosen_by_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TIDESERVE_ABSORBED_BUILD`` picks the kernel the served path runs, read once per device;
    unset, the warp-group kernel with tensor copies on sm_90 and the mma.sync kernel elsewhere; a value that is not
    a served build is refused with the values it takes."""
    from tideserve.worker.backends.torch_whisper import cuda_kernels as ck

    capability = {0: (9, 0), 1: (8, 9), 2: (12, 0)}  # H100, L40S, RTX 5090: only sm_90 has the warp-group products
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev: capability[dev])
    for value, dev, want in ((None, 0, "WGMMA,WG_TMA"), (None, 1, ""), ("", 2, ""), ("mma", 0, ""), (" WGMMA ", 0, "WGMMA"),
                             ("WGMMA,WG_PROMOTE", 0, "WGMMA,WG_PROMOTE")):
        monkeypatch.setattr(ck, "_default_builds", {})
        if value is None:
            monkeypatch.delenv(ck.BUILD_ENV, raising=False)
        else:
            monkeypatch.setenv(ck.BUILD_ENV, value)
        assert ck.default_build(dev) == want, (value, dev)
    monkeypatch.setenv(ck.BUILD_ENV, "mma")
    assert ck.default_build(0) == "WGMMA,WG_PROMOTE"  # read once: a later change does not move a running device
    monkeypatch.setattr(ck, "_default_builds", {})
    for bad in ("WG_SKIP_SCORES", "wgmma", "SKIP_OUTPUT"):  # diagnostics' output is meaningless; names are exact
        monkeypatch.setenv(ck.BUILD_ENV, bad)
        with pytest.raises(ValueError, match=r"TIDESERVE_ABSORBED_BUILD=.*one of mma, WGMMA, WGMMA,WG_PROMOTE, WGMMA,WG_SW128, "
                                             r"WGMMA,WG_TMA \(or leave it unset\)"):
            ck.default_build(1)


def test_the_gpu_check_names_where_a_build_is_wrong() -> None:
    """``bench/absorbed_mma.py`` localises a wrong build (rows, heads, groups of 32 columns) so that
    one device call says which part of the kernel to read; a NaN counts as wrong."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from absorbed_mma import where_wrong

    ref = torch.randn(2, 20, 1280, generator=torch.Generator().manual_seed(0))
    u = ref.clone()
    u[1, 8:16, 640:] += 10.0  # the second warp group's half, heads 8-15, row 1
    u[0, 3, 5] = float("nan")
    assert where_wrong(u, ref) == "rows [0..1] of 2, heads [3, 8..15] of 20, col groups [0, 20..39] of 40, 10.0% of values"
    assert where_wrong(ref.clone(), ref).startswith("rows [] of 2, heads [] of 20, col groups [] of 40, 0.0%")

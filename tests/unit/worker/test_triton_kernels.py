"""The decoder step's Triton kernels (``torch_whisper.triton_kernels``), checked on the CPU
through Triton's interpreter (``TRITON_INTERPRET=1``, which must be set before Triton compiles
the kernels, so each check runs in a child process): the cross-attention kernel equals
attention over the dequantized FP8 keys and values, quantizing keeps every value within E4M3's
rounding, the self-attention kernel writes the cache and equals attention over each row's own
length, and the real tiny.en model writes the same text on the shipped clips with both kernels
(FP8 cross-attention) as with PyTorch's in float32. Their speed is the GPU's to measure
(bench/gpu_step_parts.py --fp8)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from child import child_json
from tideserve.worker.backends.torch_whisper.model import KVCache, WhisperDims

pytest.importorskip("triton")


def interpreted(script: str, timeout_s: float = 240) -> dict:
    """Run ``script`` in a child Python with Triton's interpreter on; it prints one JSON object last."""
    return child_json(["-c", textwrap.dedent(script)], {"TRITON_INTERPRET": "1", "PYTHONPATH": str(
        Path(__file__).resolve().parents[3] / "src")}, timeout_s)


def test_the_kernel_equals_attention_over_the_dequantized_keys_and_values() -> None:
    r = interpreted("""
        import json, torch
        import torch.nn.functional as F
        from tideserve.worker.backends.torch_whisper import triton_kernels as fa
        torch.manual_seed(0)
        k, v = torch.randn(5, 2, 1500, 64), torch.randn(5, 2, 1500, 64) * 4   # a cache of 5 rows, 3 used
        q = torch.randn(3, 2, 64) * 3
        k8, ks = fa.quantize(k)
        v8, vs = fa.quantize(v)
        kd, vd = (k8.float() * ks[:, :, None, None])[:3], (v8.float() * vs[:, :, None, None])[:3]
        ref = F.scaled_dot_product_attention(q[:, :, None], kd, vd)[:, :, 0]
        full = F.scaled_dot_product_attention(q[:, :, None], k[:3], v[:3])[:, :, 0]
        err = {s: (fa.attend(q, k8, v8, ks, vs, split=s) - ref).abs().max().item() for s in (1, 3)}
        # 64 parts of 24 positions in blocks of 16: partial blocks, and a last part with none
        err["64"] = (fa.attend(q, k8, v8, ks, vs, split=64, block_t=16) - ref).abs().max().item()
        refused = []
        for bad in (dict(k_scale=ks[:, 0]), dict(k_scale=ks.t().contiguous().t()), dict(split=0), dict(block_t=100)):
            kw = dict(k_scale=ks, v_scale=vs) | bad
            try:
                fa.attend(q, k8, v8, kw.pop("k_scale"), kw.pop("v_scale"), **kw)
            except ValueError:
                refused.append(True)
        # the fill kernel itself (on the CPU quantize_into rounds with PyTorch) against quantize:
        # the interpreter rounds some values wrongly (to half the power of two that PyTorch rounds up
        # to, down among the subnormals, ties away from even: its known faults; the GPU session
        # checks all bytes), so each value must be PyTorch's, within one E4M3 step of it, or half
        # its power of two, and most must be equal
        xs = torch.randn(3, 1500, 128) * torch.tensor([1.0, 7.0, 0.01])[:, None, None]
        xv = xs.view(3, 1500, 2, 64).transpose(1, 2)
        w8, ws = fa.quantize(xv)
        dst, sc = torch.zeros(5, 2, 1500, 64, dtype=torch.float8_e4m3fn), torch.ones(5, 2)
        rows = torch.tensor([4, 0, 2])
        fa._quantize_into_kernel[(6,)](xv, dst, sc, rows, 2, 1500, *xv.stride()[:3], *dst.stride()[:3], sc.stride(0),
                                       D=64, BLOCK_T=64, HAS_ROWS=True)
        got8, want8 = dst[rows].float(), w8.float()
        step = torch.ldexp(torch.ones(()), torch.frexp(want8.abs().clamp(min=2 ** -6))[1] - 4)  # E4M3: 3 bits
        fill = {"scales": torch.allclose(sc[rows], ws, rtol=1e-6), "untouched": bool((dst[[1, 3]].float() == 0).all()),
                "far": int((((got8 - want8).abs() > step) & (got8 != want8 / 2)).sum()),
                "equal": (got8 == want8).float().mean().item()}
        # E4M3 rounds to nearest: within 2^-4 of a value in its normal range (3 mantissa bits), and
        # within half its smallest step, 2^-10 of the scale, below 2^-6 of it (subnormals)
        s4 = ks[:, :, None, None]
        bound = torch.maximum(k.abs() * 2 ** -4, s4 * 2 ** -10) * (1 + 1e-5)
        rel = ((k8.float() * s4 - k).abs() / bound).max().item()
        # self_attend: this step's k, v written at each row's position, attention over 0..position
        kc, vc = torch.randn(5, 2, 448, 64), torch.randn(5, 2, 448, 64)
        qkv = torch.randn(3, 3 * 128)  # one fused projection's output: strided q, k, v views
        sq, sk, sv = (x.view(3, 2, 64) for x in qkv.split(128, dim=-1))
        kc2, vc2 = kc.clone(), vc.clone()
        pos = torch.tensor([0, 5, 447])  # the first and the last position of the 448-token cache
        got = fa.self_attend(sq, sk, sv, kc2, vc2, pos, block_t=32)  # several blocks: the rescaling between them
        self_err, writes = 0.0, True
        for b, p in enumerate(pos.tolist()):
            kr, vr = kc[b].clone(), vc[b].clone()
            kr[:, p], vr[:, p] = sk[b], sv[b]
            want = F.scaled_dot_product_attention(sq[b][:, None], kr[:, : p + 1], vr[:, : p + 1])[:, 0]
            self_err = max(self_err, (got[b] - want).abs().max().item())
            writes &= torch.equal(kc2[b], kr) and torch.equal(vc2[b], vr)
        writes &= torch.equal(kc2[3:], kc[3:]) and torch.equal(vc2[3:], vc[3:])
        print(json.dumps({"err": err, "vs_full": (ref - full).abs().max().item(), "scale": ks[0, 0].item(),
                          "amax": k[0, 0].abs().max().item(), "rel": rel, "ref_max": ref.abs().max().item(),
                          "self_err": self_err, "self_writes": writes, "refused": len(refused), "fill": fill}))
    """)
    assert max(r["err"].values()) < 1e-5  # the kernel: float32 inside, the same sums (split 1, 3, 64)
    assert r["refused"] == 4  # 1-D scales, column-major scales, split 0, a block of 100 positions
    assert r["fill"]["scales"] and r["fill"]["untouched"] and r["fill"]["far"] == 0 and r["fill"]["equal"] > 0.95
    assert r["scale"] == pytest.approx(r["amax"] / 448, rel=1e-6)
    assert 0.5 < r["rel"] <= 1.0  # every value within the bound, some near it
    assert 0 < r["vs_full"] < 0.05 * r["ref_max"]  # what FP8 costs on random data, small but not zero
    assert r["self_err"] < 1e-5 and r["self_writes"]  # rows 0, 5 and 447 deep; rows 3-4 untouched


def test_tiny_en_writes_the_same_text_with_fp8_cross_attention(tiny_en_hf_dir: Path) -> None:
    r = interpreted(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        import audio
        from tideserve.spec.models import Decoding, Target
        from tideserve.worker.backends.base import WindowTask
        from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend
        clips = [c for c in audio.load_en_clips() if c.name == "quick_brown_fox"]  # the interpreter is slow: one clip
        texts = {{}}
        for fp8 in (False, True):  # PyTorch's kernels, and FP8 cross-attention with the Triton self-attention
            b = TorchWhisperBackend({str(tiny_en_hf_dir)!r}, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1),
                                    cross_fp8=fp8, attention="triton" if fp8 else "sdpa")
            got, _ = b.transcribe_batch([WindowTask(samples=c.samples, timestamps=True) for c in clips])
            texts[str(fp8)] = [[(s.start_s, s.end_s, s.text) for s in r.segments] for r in got]
            texts["scale_dtype"] = str(b.decoder.cache.cross_k_scale[0].dtype) if fp8 else None
            texts["cache_dtype_" + str(fp8)] = str(b.decoder.cache.cross_k[0].dtype)
        print(json.dumps(texts))
    """)
    assert r["True"] == r["False"]
    assert [seg[2] for segs in r["True"] for seg in segs] == ["The quick brown fox jumps over the lazy dog."]
    assert r["cache_dtype_True"] == "torch.float8_e4m3fn" and r["cache_dtype_False"] == "torch.float32"


def test_fp8_on_the_cpu_without_the_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"need a CUDA device.*leave cross_fp8 off on the CPU"):
        KVCache(WhisperDims.tiny(), 2, torch.float32, torch.device("cpu"), cross_fp8=True)


def test_the_compiled_step_runs_the_triton_kernels_as_custom_operators() -> None:
    # The decoder's compiled step (GreedyDecoder(compile_step=True)) with FP8 keys and values and the
    # Triton self-attention: traced through by torch.compile, the self-attention kernel failed to
    # build on an H100 (a float64 scale); as custom operators (triton_kernels.self_attend_op /
    # attend_op) the compiled step equals the eager one, step by step: the tokens, log-probabilities
    # and no-speech probabilities, and the self-attention cache it writes.
    r = interpreted(f"""
        import json, sys, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_torch_backend import DIMS, SPECIAL, make_model
        from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder
        m = make_model("cpu")
        m.attention = "triton"
        m.fuse_qkv()
        from torch._dynamo.utils import counters
        ours = GreedyDecoder(m, SPECIAL, max_batch=4, compile_step=True, cross_fp8=True)
        theirs = GreedyDecoder(m, SPECIAL, max_batch=4, cross_fp8=True)
        calls, compiled_step = [], ours._compiled
        ours._compiled = lambda *a: (calls.append(1), compiled_step(*a))
        torch.manual_seed(2)
        encoded = torch.randn(3, 1500, DIMS.d_model)
        prompts = [[SPECIAL.sot], [SPECIAL.sot, SPECIAL.no_timestamps], [SPECIAL.sot]]
        worst = {{"hist": 0.0, "sum_logprob": 0.0, "no_speech": 0.0, "cache": 0.0}}
        for d in (ours, theirs):
            d.admit(encoded, prompts, [True, False, True], max_new_tokens=20)
        for _ in range(6):
            for d in (ours, theirs):
                d.run(1)
            for name in ("hist", "sum_logprob", "no_speech"):
                a, b = getattr(ours, name)[:3].float(), getattr(theirs, name)[:3].float()
                worst[name] = max(worst[name], (a - b).abs().max().item())
            worst["cache"] = max(worst["cache"], max((a[:3] - b[:3]).abs().max().item() for a, b in
                zip((*ours.cache.self_k, *ours.cache.self_v), (*theirs.cache.self_k, *theirs.cache.self_v))))
        print(json.dumps({{**worst, "compiled_calls": len(calls), "logprob": ours.sum_logprob[:3].tolist(),
                          "graph_breaks": sum(counters["graph_break"].values())}}))
    """)
    assert r["compiled_calls"] == 6 and all(x < 0 for x in r["logprob"])  # 6 compiled steps that sampled tokens
    assert r["hist"] == 0 and r["sum_logprob"] < 1e-4 and r["no_speech"] < 1e-5 and r["cache"] < 1e-5
    assert r["graph_breaks"] == 0  # the operators are traced, not stepped around

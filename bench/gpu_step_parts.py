"""Where a decoder step's time goes at large-v3 size on the GPU: the whole step and its parts,
each captured in a CUDA graph and replayed, in one run.

Random weights (timing only), bf16, the torch backend's own model (``Whisper.step``) and decoder
(``GreedyDecoder._step``: the step plus the token rules). For each batch size: the decoder step
(model + rules), the model step alone with each attention implementation, and per part summed
over the 32 layers: self-attention block, cross-attention projections, cross-attention itself
(each SDPA backend PyTorch offers here, and two matrix products), the MLP, and the logits. The
cross-attention row also prints the bandwidth it reaches: it reads each row's keys and values
(``2 x 1500 x d_model`` values per layer) once per step. Then the encoder and ``fill_cross`` per
window.

Run on the GPU machine:  python3 bench/gpu_step_parts.py --json $OUT/step_parts.json
(``--fp8``: also the cross-attention over FP8 keys and values, ``triton_kernels``.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder
from tideserve.worker.backends.torch_whisper.model import KVCache, Whisper, WhisperDims, _attend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_whisper import special_for


def graph_ms(fn: Callable[[], object], replays: int = 30) -> float:
    """Milliseconds per call of ``fn`` captured in a CUDA graph (median of ``replays``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def eager_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def measure_batch(model: Whisper, b: int, span: int) -> dict:
    """One batch size's row: milliseconds per step and per part (see the module docstring)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    dims, dev, dtype = model.dims, torch.device("cuda"), torch.bfloat16
    layers = model.decoder.blocks()
    n_layers, d, heads = dims.decoder_layers, dims.d_model, dims.decoder_attention_heads
    hd, t_src = d // heads, dims.max_source_positions
    row: dict = {"batch": b}
    cache = KVCache(dims, b, dtype, dev)
    for i in range(n_layers):
        cache.cross_k[i].normal_()
        cache.cross_v[i].normal_()
    tok = torch.randint(0, 50000, (b,), device=dev)
    pos = torch.full((b,), 60, device=dev)
    for impl in ("sdpa", "matmul"):
        model.attention = impl
        row[f"model_step_{impl}_ms"] = graph_ms(lambda: model.step(cache, tok, pos, span))
    model.attention = "sdpa"
    dec = GreedyDecoder(model, special_for(dims.vocab_size), max_batch=b)
    dec.done[:b] = False
    dec.pos[:b] = 60
    row["decoder_step_ms"] = graph_ms(lambda: dec._step(b, span))
    x = torch.randn(b, 1, d, device=dev, dtype=dtype)
    q = torch.randn(b, heads, 1, hd, device=dev, dtype=dtype)
    kv_bytes = 2 * b * t_src * d * 2 * n_layers
    for name, backend in backends.items():
        try:
            with sdpa_kernel([backend]):
                ms = graph_ms(lambda: [F.scaled_dot_product_attention(q, cache.cross_k[i], cache.cross_v[i])
                                       for i in range(n_layers)])
            row[f"cross_attend_{name}_ms"] = ms
            row[f"cross_attend_{name}_TBps"] = kv_bytes / ms / 1e9
        except RuntimeError as exc:
            row[f"cross_attend_{name}_ms"] = f"unavailable: {str(exc).splitlines()[0][:120]}"
    ms = graph_ms(lambda: [_attend(q, cache.cross_k[i], cache.cross_v[i], None, "matmul") for i in range(n_layers)])
    row["cross_attend_matmul_ms"], row["cross_attend_matmul_TBps"] = ms, kv_bytes / ms / 1e9
    ms = graph_ms(lambda: [_attend(q, cache.cross_k[i], cache.cross_v[i], None, "sdpa") for i in range(n_layers)])
    row["cross_attend_default_ms"], row["cross_attend_default_TBps"] = ms, kv_bytes / ms / 1e9
    row["kv_bytes_per_step_GB"] = kv_bytes / 1e9

    def cross_proj() -> None:
        for layer in layers:
            c = layer.encoder_attn
            c.out_proj(c.q_proj(layer.encoder_attn_layer_norm(x)))

    def mlp() -> None:
        for layer in layers:
            layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))

    visible = (torch.arange(span, device=dev)[None, :] <= pos[:, None])[:, None, None, :]

    def self_block() -> None:
        for i, layer in enumerate(layers):
            s = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            qq, k, v = s.split(s.q_proj(h)), s.split(s.k_proj(h)), s.split(s.v_proj(h))
            index = pos.view(b, 1, 1, 1).expand(b, heads, 1, hd)
            ks, vs = cache.self_k[i][:b], cache.self_v[i][:b]
            ks.scatter_(2, index, k)
            vs.scatter_(2, index, v)
            s.out_proj(s.merge(_attend(qq, ks[:, :, :span], vs[:, :, :span], visible, "sdpa")))

    row["cross_proj_ms"] = graph_ms(cross_proj)
    row["mlp_ms"] = graph_ms(mlp)
    row["self_block_ms"] = graph_ms(self_block)
    w = model.decoder.embed_tokens.weight
    row["logits_ms"] = graph_ms(lambda: (x[:, 0, :] @ w.T).float())
    return row


def measure_encoder(model: Whisper, b: int) -> dict:
    """Encoder and ``fill_cross`` milliseconds per window at batch ``b`` (eager, as served)."""
    dims, dev, dtype = model.dims, torch.device("cuda"), torch.bfloat16
    feats = torch.randn(b, dims.num_mel_bins, 3000, device=dev, dtype=dtype)
    enc_ms = eager_ms(lambda: model.encode(feats))
    encoded = model.encode(feats)
    cache = KVCache(dims, b, dtype, dev)
    fill_ms = eager_ms(lambda: model.fill_cross(cache, encoded))
    return {"encoder_batch": b, "encoder_ms_per_window": enc_ms / b, "fill_cross_ms_per_window": fill_ms / b}


def measure_self_variants(model: Whisper, b: int, span: int) -> dict:
    """The self-attention block (32 layers) with each attention kernel, and with the three
    projections fused into one matrix product (milliseconds per step)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dims, dev, dtype = model.dims, torch.device("cuda"), torch.bfloat16
    layers = model.decoder.blocks()
    heads, hd = dims.decoder_attention_heads, dims.d_model // dims.decoder_attention_heads
    cache = KVCache(dims, b, dtype, dev)
    x = torch.randn(b, 1, dims.d_model, device=dev, dtype=dtype)
    pos = torch.full((b,), 60, device=dev)
    visible = (torch.arange(span, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
    fused = [torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight])
             for layer in layers]
    fused_bias = [torch.cat([layer.self_attn.q_proj.bias, torch.zeros_like(layer.self_attn.q_proj.bias),
                             layer.self_attn.v_proj.bias]) for layer in layers]

    def block(impl: str, fuse: bool) -> None:
        for i, layer in enumerate(layers):
            s = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            if fuse:
                q, k, v = (s.split(t) for t in F.linear(h, fused[i], fused_bias[i]).chunk(3, dim=-1))
            else:
                q, k, v = s.split(s.q_proj(h)), s.split(s.k_proj(h)), s.split(s.v_proj(h))
            index = pos.view(b, 1, 1, 1).expand(b, heads, 1, hd)
            ks, vs = cache.self_k[i][:b], cache.self_v[i][:b]
            ks.scatter_(2, index, k)
            vs.scatter_(2, index, v)
            s.out_proj(s.merge(_attend(q, ks[:, :, :span], vs[:, :, :span], visible, impl)))

    row: dict = {"batch": b, "variant": "self_block"}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    for name, backend in backends.items():
        try:
            with sdpa_kernel([backend]):
                row[f"sdpa_{name}_ms"] = graph_ms(lambda: block("sdpa", False))
        except RuntimeError as exc:
            row[f"sdpa_{name}_ms"] = f"unavailable: {str(exc).splitlines()[0][:100]}"
    for impl in ("sdpa", "matmul"):
        for fuse in (False, True):
            row[f"{impl}{'_fused' if fuse else ''}_ms"] = graph_ms(lambda impl=impl, fuse=fuse: block(impl, fuse))
    return row


def measure_fp8(model: Whisper, b: int, span: int) -> dict:
    """Cross-attention over FP8 keys and values (``triton_kernels.attend``, 32 layers) for each
    (parts, positions per block, warps) tried, with the bandwidth it reaches (counting the FP8
    bytes), and the model step and decoder step with an FP8 cache (milliseconds per step), with
    PyTorch's self-attention kernels and with ``triton_kernels.self_attend`` (the model step also
    with a bf16 cross cache: the self-attention kernel alone)."""
    from tideserve.worker.backends.torch_whisper import triton_kernels

    dims, dev, dtype = model.dims, torch.device("cuda"), torch.bfloat16
    n_layers, heads = dims.decoder_layers, dims.decoder_attention_heads
    hd, t_src = dims.d_model // heads, dims.max_source_positions
    cache = KVCache(dims, b, dtype, dev, cross_fp8=True)
    for i in range(n_layers):
        cache.cross_k[i], cache.cross_k_scale[i] = triton_kernels.quantize(torch.randn_like(cache.cross_k[i], dtype=dtype))
        cache.cross_v[i], cache.cross_v_scale[i] = triton_kernels.quantize(torch.randn_like(cache.cross_v[i], dtype=dtype))
    q = torch.randn(b, heads, hd, device=dev, dtype=dtype)
    kv_bytes = 2 * b * t_src * dims.d_model * n_layers
    row: dict = {"batch": b, "variant": "cross_fp8", "kv_bytes_per_step_GB": kv_bytes / 1e9}
    for split, block_t, warps in ((1, 64, 4), (1, 128, 4), (1, 128, 8), (2, 64, 4), (4, 64, 4), (4, 128, 4)):
        ms = graph_ms(lambda split=split, block_t=block_t, warps=warps: [
            triton_kernels.attend(q, cache.cross_k[i], cache.cross_v[i], cache.cross_k_scale[i], cache.cross_v_scale[i],
                                 split=split, block_t=block_t, num_warps=warps) for i in range(n_layers)])
        row[f"attend_s{split}_t{block_t}_w{warps}_ms"] = ms
        row[f"attend_s{split}_t{block_t}_w{warps}_TBps"] = kv_bytes / ms / 1e9
    tok = torch.randint(0, 50000, (b,), device=dev)
    pos = torch.full((b,), 60, device=dev)
    bf16 = KVCache(dims, b, dtype, dev)
    model.fuse_qkv()  # used by the triton path only
    for impl in ("sdpa", "triton"):  # the self-attention's kernels, with FP8 (and bf16) cross-attention
        model.attention = impl
        row[f"model_step_{impl}_ms"] = graph_ms(lambda: model.step(cache, tok, pos, span))
        row[f"model_step_{impl}_bf16_cross_ms"] = graph_ms(lambda: model.step(bf16, tok, pos, span))
        dec = GreedyDecoder(model, special_for(dims.vocab_size), max_batch=b, cross_fp8=True)
        dec.done[:b] = False
        dec.pos[:b] = 60
        row[f"decoder_step_{impl}_ms"] = graph_ms(lambda dec=dec: dec._step(b, span))
        del dec
    model.attention = "sdpa"
    encoded = torch.randn(b, t_src, dims.d_model, device=dev, dtype=dtype)
    row["fill_cross_ms_per_window"] = eager_ms(lambda: model.fill_cross(cache, encoded)) / b
    return row


def measure_encoder_compiled(model: Whisper, b: int) -> dict:
    """The encoder per window at batch ``b``: eager, one CUDA graph, and torch.compile'd
    (default mode), with the compilation's seconds."""
    import time

    feats = torch.randn(b, model.dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
    row: dict = {"encoder_batch": b, "eager_ms_per_window": eager_ms(lambda: model.encode(feats)) / b}
    row["graph_ms_per_window"] = graph_ms(lambda: model.encode(feats), replays=5) / b
    compiled = torch.compile(model.encoder)
    t0 = time.perf_counter()
    compiled(feats)
    torch.cuda.synchronize()
    row["compile_s"] = time.perf_counter() - t0
    row["compiled_ms_per_window"] = eager_ms(lambda: compiled(feats)) / b
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="64,128")
    ap.add_argument("--span", type=int, default=128)
    ap.add_argument("--variants", action="store_true", help="also time self-attention and encoder variants")
    ap.add_argument("--fp8", action="store_true", help="also time cross-attention over FP8 keys and values")
    ap.add_argument("--only-fp8", action="store_true", help="time only the FP8 rows (and the bf16 step beside them)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    dims = WhisperDims.large_v3()
    with torch.device("cuda"):
        model = Whisper(dims)
    model = model.to(torch.bfloat16).eval()
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "dims": "large-v3",
                 "span": a.span, "rows": []}
    with torch.inference_mode():
        if a.fp8 or a.only_fp8:
            for b in [int(x) for x in a.batch_sizes.split(",")]:
                r = measure_fp8(model, b, a.span)
                out["rows"].append(r)
                print(json.dumps(r), flush=True)
        for b in [] if a.only_fp8 else [int(x) for x in a.batch_sizes.split(",")]:
            row = measure_batch(model, b, a.span)
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
        for b in () if a.only_fp8 else (16, 32):
            r = measure_encoder(model, b)
            out["rows"].append(r)
            print(json.dumps(r), flush=True)
        if a.variants:
            for b in [int(x) for x in a.batch_sizes.split(",")]:
                r = measure_self_variants(model, b, a.span)
                out["rows"].append(r)
                print(json.dumps(r), flush=True)
            r = measure_encoder_compiled(model, 32)
            out["rows"].append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Throughput and latency of tideserve's torch Whisper backend against Hugging Face transformers
``generate`` on the same GPU, in one run.

For each model size (tiny and large-v3 shapes; RANDOM weights, seeded, shared by both sides so
both do the same arithmetic) and batch size (1, 8, 32, 64): the encoder plus a greedy decode of
exactly ``--tokens`` new tokens per row (end-of-text suppressed until then), timed end to end
with CUDA synchronisation, ``--repeats`` times after warm-up (our warm-up captures the CUDA
graphs). The baseline is ``WhisperForConditionalGeneration.generate`` with sdpa attention, the
same dtype and ``min_new_tokens = max_new_tokens = --tokens``. Log-mel features are random and
given to both sides; feature extraction (ours runs on the GPU) is timed separately.

RTFx = audio seconds / processing seconds, counting each input as a full 30 s window
(Whisper's fixed window). Prints one table and writes the numbers as JSON (``--json``).

Run on the GPU machine:  python bench/gpu_whisper.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder, SpecialTokens
from tideserve.worker.backends.torch_whisper.features import LogMel
from tideserve.worker.backends.torch_whisper.model import Whisper, WhisperDims

WINDOW_S = 30.0
SIZES = {"tiny": WhisperDims.tiny, "large-v3": WhisperDims.large_v3}


def special_for(vocab: int) -> SpecialTokens:
    """Whisper's special-token layout: English-only (51864) or multilingual (51865/51866)."""
    eot = 50256 if vocab == 51864 else 50257
    sot = eot + 1
    no_ts = 50362 if vocab == 51864 else (50363 if vocab == 51865 else 50364)
    return SpecialTokens(eot=eot, sot=sot, no_timestamps=no_ts, timestamp_begin=no_ts + 1, no_speech=no_ts - 1,
                         blank=220, suppress=())


def hf_model(dims: WhisperDims, special: SpecialTokens, dtype: torch.dtype, device: str):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(
        vocab_size=dims.vocab_size, num_mel_bins=dims.num_mel_bins, d_model=dims.d_model,
        encoder_layers=dims.encoder_layers, encoder_attention_heads=dims.encoder_attention_heads,
        encoder_ffn_dim=dims.encoder_ffn_dim, decoder_layers=dims.decoder_layers,
        decoder_attention_heads=dims.decoder_attention_heads, decoder_ffn_dim=dims.decoder_ffn_dim,
        max_source_positions=dims.max_source_positions, max_target_positions=dims.max_target_positions,
        decoder_start_token_id=special.sot, eos_token_id=special.eot, pad_token_id=special.eot,
        bos_token_id=special.eot, begin_suppress_tokens=None, suppress_tokens=None,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: a 1.5 B-parameter init on the CPU takes minutes
        model = WhisperForConditionalGeneration(cfg)
    model.config._attn_implementation = "sdpa"
    gc = model.generation_config
    gc.no_timestamps_token_id = special.no_timestamps
    gc.decoder_start_token_id = special.sot
    gc.forced_decoder_ids = None
    gc.begin_suppress_tokens = None
    gc.suppress_tokens = None
    gc.is_multilingual = False
    return model.to(device=device, dtype=dtype).eval()


def ours_from_hf(hf, dims: WhisperDims, dtype: torch.dtype, device: str) -> Whisper:
    state = {k: v for k, v in hf.state_dict().items() if k != "proj_out.weight"}
    with torch.device("meta"):
        model = Whisper(dims)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise SystemExit(f"weights do not map: missing {missing[:4]} unexpected {unexpected[:4]}")
    return model.to(device=device, dtype=dtype).eval()


def timed(fn, repeats: int, device: str) -> list[float]:
    out = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def bench_size(size: str, a: argparse.Namespace, dtype: torch.dtype, batch_sizes: list[int]) -> list[dict]:
    """One model size at every batch size. The models, decoders and the closures that time them
    are locals here, so they are all freed when this returns (main then empties the CUDA cache)."""
    rows = []
    dims = SIZES[size]()
    special = special_for(dims.vocab_size)
    hf = hf_model(dims, special, dtype, a.device)
    ours = ours_from_hf(hf, dims, dtype, a.device)
    if a.no_baseline:
        del hf
        hf = None
    decoder = GreedyDecoder(ours, special, max_batch=max(batch_sizes))
    compiled = (GreedyDecoder(ours, special, max_batch=max(batch_sizes), compile_step=True)
                if a.compile and size in a.compile_sizes.split(",") else None)
    logmel = LogMel(dims.num_mel_bins, torch.device(a.device))
    for bs in batch_sizes:
        g = torch.Generator(device="cpu").manual_seed(bs)
        feats = torch.randn(bs, dims.num_mel_bins, 3000, generator=g).to(a.device, dtype)
        prompts = [[special.sot, special.no_timestamps]] * bs
        produced: list[int] = []

        # Each closure binds this batch's values (default arguments): it runs only within this iteration.
        def run_ours(feats: torch.Tensor = feats, prompts: list[list[int]] = prompts, bs: int = bs,
                     produced: list[int] = produced) -> None:
            with torch.inference_mode():
                enc = ours.encode(feats)
                res = decoder.decode(enc, prompts, [False] * bs, max_new_tokens=a.tokens, min_new_tokens=a.tokens)
            produced[:] = [len(r.tokens) for r in res]

        timed(run_ours, 2, a.device)  # warm-up: CUDA graph capture per (batch, span) bucket
        ours_s = timed(run_ours, a.repeats, a.device)
        assert all(n == a.tokens for n in produced), f"ours produced {set(produced)} tokens, not {a.tokens}"
        audio = [np.random.default_rng(i).standard_normal(int(WINDOW_S * 16000)).astype(np.float32) * 0.1
                 for i in range(bs)]
        feat_s = timed(lambda audio=audio: logmel(audio), 3, a.device)
        row = {"size": size, "batch": bs, "ours_p50_s": pct(ours_s, 50), "ours_p99_s": pct(ours_s, 99),
               "ours_rtfx": bs * WINDOW_S / statistics.median(ours_s), "features_p50_s": pct(feat_s, 50)}
        if compiled is not None:
            def run_compiled(feats: torch.Tensor = feats, prompts: list[list[int]] = prompts, bs: int = bs,
                             produced: list[int] = produced) -> None:
                with torch.inference_mode():
                    enc = ours.encode(feats)
                    res = compiled.decode(enc, prompts, [False] * bs, max_new_tokens=a.tokens,
                                          min_new_tokens=a.tokens)
                produced[:] = [len(r.tokens) for r in res]

            t0 = time.perf_counter()
            timed(run_compiled, 2, a.device)
            row["compile_s"] = time.perf_counter() - t0
            comp_s = timed(run_compiled, a.repeats, a.device)
            assert all(n == a.tokens for n in produced)
            row.update({"compiled_p50_s": pct(comp_s, 50), "compiled_p99_s": pct(comp_s, 99),
                        "compiled_rtfx": bs * WINDOW_S / statistics.median(comp_s)})
        if hf is not None:
            ids = torch.tensor(prompts, device=a.device)
            shape: list[int] = []

            def run_hf(feats: torch.Tensor = feats, ids: torch.Tensor = ids, shape: list[int] = shape) -> None:
                with torch.inference_mode():
                    out = hf.generate(input_features=feats, decoder_input_ids=ids, min_new_tokens=a.tokens,
                                      max_new_tokens=a.tokens, do_sample=False, num_beams=1)
                seq = out if isinstance(out, torch.Tensor) else out["sequences"]
                shape[:] = list(seq.shape)

            timed(run_hf, 1, a.device)
            hf_s = timed(run_hf, a.hf_repeats, a.device)
            row.update({"hf_p50_s": pct(hf_s, 50), "hf_p99_s": pct(hf_s, 99),
                        "hf_rtfx": bs * WINDOW_S / statistics.median(hf_s), "hf_output_shape": shape})
            row["speedup"] = row["ours_rtfx"] / row["hf_rtfx"]
            if "compiled_rtfx" in row:
                row["compiled_speedup"] = row["compiled_rtfx"] / row["hf_rtfx"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,large-v3")
    ap.add_argument("--batch-sizes", default="1,8,32,64")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--hf-repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-baseline", action="store_true", help="skip Hugging Face generate")
    ap.add_argument("--compile", action="store_true", help="also time our decoder with torch.compile'd steps")
    ap.add_argument("--compile-sizes", default="tiny", help="sizes --compile applies to (compiling large-v3 takes "
                    "about 40 s per batch size and measured slower)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    batch_sizes = [int(b) for b in a.batch_sizes.split(",")]
    env = {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "dtype": a.dtype, "tokens": a.tokens, "weights": "random (seed 0)"}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        a.no_baseline = True
    print(json.dumps(env))
    rows = []
    for size in a.sizes.split(","):
        rows += bench_size(size, a, dtype, batch_sizes)
        if a.device == "cuda":
            torch.cuda.empty_cache()
    print()
    print(f"{'size':9} {'batch':>5} {'ours p50 s':>10} {'ours p99 s':>10} {'ours RTFx':>9} {'HF p50 s':>9} "
          f"{'HF p99 s':>9} {'HF RTFx':>8} {'ours/HF':>7}")
    for r in rows:
        hf_cols = (f"{r['hf_p50_s']:9.3f} {r['hf_p99_s']:9.3f} {r['hf_rtfx']:8.1f} {r['speedup']:7.2f}"
                   if "hf_rtfx" in r else f"{'-':>9} {'-':>9} {'-':>8} {'-':>7}")
        comp = (f"  compiled: p50 {r['compiled_p50_s']:.3f} s, RTFx {r['compiled_rtfx']:.1f}, "
                f"x{r.get('compiled_speedup', float('nan')):.2f} vs HF (compile {r['compile_s']:.0f} s)"
                if "compiled_rtfx" in r else "")
        print(f"{r['size']:9} {r['batch']:5d} {r['ours_p50_s']:10.3f} {r['ours_p99_s']:10.3f} {r['ours_rtfx']:9.1f} {hf_cols}{comp}")
    if a.json:
        a.json.write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

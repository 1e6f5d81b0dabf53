"""Can encoder passes run beside decoder steps on the GPU, and what would that give? One run,
CUDA events, the torch backend's own model, decoder and encoder (random weights of the real
shapes, bf16; timing only).

For each model size: ``decode`` runs ``--steps`` decoder steps of a full batch (``--batch`` rows,
none ending: ``min_new_tokens``), as the served step runs them (CUDA graphs; at large-v3 size FP8
cross keys and values, Triton attention, compiled step); ``encode`` runs ``--passes`` encoder
passes of ``--encode-rows`` windows (the served encoder: compiled at large-v3 size, CUDA graphs
at tiny size); ``serial`` runs one after the other on one stream; ``overlap`` queues the decoder
steps on one stream and the encoder passes on another, with the decoder's stream at high or
equal priority. ``gain`` = serial / overlap time: what the device gives if the engine encodes
the next windows while the running rows decode (1.0: nothing; 2.0: the encoder for free).

``--green N,...`` (2026-12-07 addition): the two streams took turns (gain 1.00 on an H100), most
likely because each side's kernels fill every SM. A CUDA green context (PyTorch's
``torch.cuda.green_contexts``, CUDA's SM partitioning, as NanoFlow (Zhu et al. 2024) overlaps
compute- and memory-bound operations on one device) confines one side to N SMs, so the other
always has the rest: ``enc<N>`` confines the encoder (the decoder may use any SM), ``dec<N>`` the
decoder. For each, the confined side alone, then both on two streams.

    python3 bench/gpu_overlap.py --json $OUT/overlap.json [--sizes large-v3,tiny] [--green 32,64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder
from tideserve.worker.backends.torch_whisper.model import CompiledEncoder, GraphedEncoder, Whisper, WhisperDims
from gpu_whisper import special_for


def timed(fn) -> float:
    """Seconds of ``fn`` (which queues work on any streams), from a full device sync to another."""
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    torch.cuda.synchronize()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1000.0


_KEEP: list = []  # the green contexts live as long as the process


def green_stream(num_sms: int) -> torch.cuda.Stream:
    """A stream whose kernels run on ``num_sms`` SMs of device 0 (a green context), or RuntimeError
    where this PyTorch or driver has none."""
    from torch.cuda import green_contexts as gc
    ctx = gc.GreenContext.create(num_sms=num_sms, device_id=0)
    if hasattr(ctx, "Stream"):
        stream = ctx.Stream()
    else:  # PyTorch 2.10: a stream made while the green context is current belongs to it
        ctx.set_context()
        stream = torch.cuda.Stream()
        ctx.pop_context()
    _KEEP.append(ctx)
    if not isinstance(stream, torch.cuda.Stream):  # a device-generic torch.Stream
        stream = torch.cuda.ExternalStream(stream.cuda_stream if hasattr(stream, "cuda_stream") else stream.stream_id)
    return stream


def measure(size: str, batch: int, steps: int, encode_rows: list[int], repeats: int,
            green: list[int] = ()) -> list[dict]:
    dims = WhisperDims.large_v3() if size == "large-v3" else WhisperDims.tiny()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Whisper(dims)
    model = model.to(torch.bfloat16).eval()
    large = size == "large-v3"
    if large:
        model.fuse_qkv()
        model.attention = "triton"
    special = special_for(dims.vocab_size)
    dec = GreedyDecoder(model, special, max_batch=batch, cross_fp8=large,
                        compile_step=large and GreedyDecoder.compiles_step_for(model, torch.device("cuda")))
    encode = CompiledEncoder(model, batch) if large else GraphedEncoder(model, batch)
    full = torch.randn(batch, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
    prompt = [special.sot, special.no_timestamps]
    results = []
    with torch.inference_mode():
        encoded = encode(full)

        def fresh() -> None:  # every timed decode starts from position 0, as a new batch would
            dec.release(list(dec.busy_slots))
            dec.admit(encoded, [prompt] * batch, [False] * batch, max_new_tokens=440, min_new_tokens=440)

        fresh()
        dec.run(4)  # captures the step's graph
        high = torch.cuda.Stream(priority=-1)
        low = torch.cuda.Stream(priority=0)
        same = torch.cuda.Stream(priority=0)

        def decode() -> None:
            dec.run(steps)

        for rows in encode_rows:
            passes = max(1, batch // rows)  # a full batch of new windows in all
            feats = torch.randn(rows, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
            for _ in range(2):
                encode(feats)

            def enc(feats: torch.Tensor = feats, passes: int = passes) -> None:
                for _ in range(passes):
                    encode(feats)

            def serial(enc=enc) -> None:
                decode()
                enc()

            def overlap(dec_stream: torch.cuda.Stream, enc=enc, enc_stream: torch.cuda.Stream = low) -> None:
                main = torch.cuda.current_stream()
                dec_stream.wait_stream(main)
                enc_stream.wait_stream(main)
                with torch.cuda.stream(enc_stream):
                    enc()
                with torch.cuda.stream(dec_stream):
                    decode()
                main.wait_stream(enc_stream)
                main.wait_stream(dec_stream)

            out: dict = {"size": size, "batch": batch, "steps": steps, "passes": passes, "encode_rows": rows}
            runs: dict[str, list[float]] = {"decode": [], "encode": [], "serial": [], "overlap_high": [],
                                            "overlap_equal": []}
            for _ in range(repeats):
                for name, fn in (("decode", decode), ("encode", enc), ("serial", serial),
                                 ("overlap_high", lambda: overlap(high)), ("overlap_equal", lambda: overlap(same))):
                    fresh()
                    runs[name].append(timed(fn))
            for k, v in runs.items():
                out[f"{k}_s"] = round(sorted(v)[len(v) // 2], 4)
            out["gain_high"] = round(out["serial_s"] / out["overlap_high_s"], 3)
            out["gain_equal"] = round(out["serial_s"] / out["overlap_equal_s"], 3)
            out["ms_per_step"] = round(1000 * out["decode_s"] / steps, 3)
            out["ms_per_window_encoded"] = round(1000 * out["encode_s"] / (passes * rows), 3)
            for n in green:
                for side in ("enc", "dec"):
                    try:
                        gs = green_stream(n)
                    except Exception as exc:  # reported in the results; the run goes on
                        out[f"{side}{n}_error"] = repr(exc)[:300]
                        continue
                    enc_s, dec_s = (gs, low) if side == "enc" else (low, gs)

                    def alone(fn, s=gs) -> None:
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            fn()
                        torch.cuda.current_stream().wait_stream(s)

                    confined = enc if side == "enc" else decode
                    t_alone, t_both = [], []
                    for _ in range(repeats):
                        fresh()
                        t_alone.append(timed(lambda c=confined: alone(c)))
                        fresh()
                        t_both.append(timed(lambda es=enc_s, ds=dec_s: overlap(ds, enc_stream=es)))
                    out[f"{side}{n}_alone_s"] = round(sorted(t_alone)[len(t_alone) // 2], 4)
                    out[f"{side}{n}_overlap_s"] = round(sorted(t_both)[len(t_both) // 2], 4)
                    out[f"{side}{n}_gain"] = round(out["serial_s"] / out[f"{side}{n}_overlap_s"], 3)
            out["device"] = torch.cuda.get_device_name(0)
            print(json.dumps(out), flush=True)
            results.append(out)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="large-v3,tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--encode-rows", default="64,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--green", default="", help="SM counts for the green-context runs, e.g. 32,64")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows_out = []
    for size in a.sizes.split(","):
        rows_out += measure(size, a.batch, a.steps, [int(x) for x in a.encode_rows.split(",")], a.repeats,
                            [int(x) for x in a.green.split(",") if x])
    if a.json:
        a.json.write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

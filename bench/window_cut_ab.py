"""A/B of where a long file is cut into windows (issue 13; a rule tried, not taken): today's cut
(``worker.windows.split_windows``: each window as long as it may be, cut in the longest pause of
its last 8 s, so the file's last window is whatever is left) against a *balanced* cut (each
window aimed at the rest's length over the windows it still needs, cut in the longest pause
within 4 s of that aim, never past 30 s), on bench/longform_rule_ab.py's eleven files, through
tideserve's own pipeline (``inproc.Tideserve``), per system. WER only: the two cuts take turns per
file and the outputs are deterministic, so the numbers do not depend on the host's noise.

    .venv/bin/python bench/window_cut_ab.py --systems fw-beam1,fw-beam5,torch-cpu

Prints one JSON line per file and system, and the totals.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

import accuracy as A  # noqa: E402
from longform_rule_ab import FILES  # noqa: E402

from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker import windows  # noqa: E402
from tideserve.worker.windows import WINDOW_S, Window, pause_middle, split_windows  # noqa: E402


def balanced_windows(samples: np.ndarray, sample_rate: int = 16_000, window_s: float = WINDOW_S,
                     search_s: float = 8.0) -> list[Window]:
    """The balanced cut (module doc): windows cover ``samples`` exactly, in order, each at most
    ``window_s``; as many windows as today's cut needs at least (ceil(length / window_s))."""
    limit = int(window_s * sample_rate)
    out: list[Window] = []
    start, n = 0, len(samples)
    while n - start > limit:
        aim = start + (n - start) // math.ceil((n - start) / limit)
        hi = min(start + limit, aim + int(search_s / 2 * sample_rate))
        lo = max(start + sample_rate, hi - int(search_s * sample_rate))
        cut = lo + pause_middle(samples[lo:hi], sample_rate)
        out.append(Window(samples[start:cut], start / sample_rate))
        start = cut
    out.append(Window(samples[start:], start / sample_rate))
    return out


SYSTEMS = {
    "fw-beam1": ("faster-whisper", "cpu-x86_64-int8", 1),
    "fw-beam5": ("faster-whisper", "cpu-x86_64-int8", 5),
    "torch-cpu": ("torch", "cpu-x86_64-fp32", 1),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="fw-beam1,fw-beam5,torch-cpu")
    ap.add_argument("--files", default=FILES, help="minutes:seed pairs, comma-separated")
    a = ap.parse_args()
    clips = A.audio.load_en_clips()
    files = [(float(p.split(":")[0]), int(p.split(":")[1])) for p in a.files.split(",")]
    totals: dict[str, dict[str, float]] = {}
    for name in a.systems.split(","):
        backend, target, beam = SYSTEMS[name]
        t = A.Tideserve(backend, target, Decoding(beam_size=beam, without_timestamps=False), 8)
        t(clips[0].samples)  # warm-up
        totals[name] = {"today": 0.0, "balanced": 0.0}
        for minutes, seed in files:
            samples, ref = A.long_file(clips, minutes, seed)
            row: dict = {"system": name, "minutes": minutes, "seed": seed}
            for side in ("today", "balanced") if seed % 2 else ("balanced", "today"):
                windows.split_windows = split_windows if side == "today" else balanced_windows  # window_cuts' cut
                segs = t(samples)
                w = A.audio.wer(ref, " ".join(x[2].strip() for x in segs))
                row[side] = round(w, 4)
                row[f"{side}_windows"] = len((split_windows if side == "today" else balanced_windows)(samples))
                totals[name][side] += w
            windows.split_windows = split_windows
            print(json.dumps(row), flush=True)
    print("total", json.dumps({k: {s: round(v, 4) for s, v in x.items()} for k, x in totals.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

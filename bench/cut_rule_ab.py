"""A/B of the window cut rule and the repetition guard on long files (issue 13), one run:
the rule before (cut at the quietest 100 ms frame, from commit 0dbcf11) and the rule now (the
longest quiet run), each with and without the repetition guard (whisper_text.loop_point), on
tideserve's own pipeline over faster-whisper (tiny.en int8, beam 5, timestamps, fallback off),
files from bench/accuracy.py's generator (1 and 5 minutes, several seeds).

    .venv/bin/python bench/cut_rule_ab.py     # prints one JSON line per file and the WER totals
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

import accuracy as A  # noqa: E402

import tideserve.worker.backends.whisper_text as wt  # noqa: E402
import tideserve.worker.windows as windows  # noqa: E402
from tideserve.spec.models import Decoding  # noqa: E402

BEFORE = "0dbcf11"


def rule_before():
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:src/tideserve/worker/windows.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "windows_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("windows_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["windows_before"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def main() -> int:
    before = rule_before()
    guard = wt.loop_point
    clips = A.audio.load_en_clips()
    t = A.Tideserve("faster-whisper", "cpu-x86_64-int8", Decoding(beam_size=5, without_timestamps=False), 8)
    now = windows.split_windows
    variants = {"before": (before.split_windows, None), "before+guard": (before.split_windows, guard),
                "now": (now, None), "now+guard": (now, guard)}
    total = dict.fromkeys(variants, 0.0)
    for minutes, seed in [(1, 13), (1, 21), (1, 22), (1, 23), (5, 14), (5, 24)]:
        samples, ref = A.long_file(clips, minutes, seed)
        row: dict = {"minutes": minutes, "seed": seed}
        for name, (cut, loop) in variants.items():
            windows.split_windows = cut  # the cut window_cuts makes
            wt.loop_point = loop or (lambda *a: None)
            w = A.audio.wer(ref, " ".join(x[2].strip() for x in t(samples)))
            row[name] = round(w, 4)
            total[name] += w
        print(json.dumps(row), flush=True)
    print("total", json.dumps({k: round(v, 4) for k, v in total.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

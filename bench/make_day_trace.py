"""Build a SYNTHETIC day-long trace (24 h) with peaks and troughs from the two Azure LLM traces.

Nothing of it was observed as a day: it is assembled. For each hour h = 0..23 the one-hour
Azure conversation trace (azure_llm_2023_conv.csv) is replayed shifted by h hours, each request
kept with probability p(h) = PEAK x (0.03 + 0.97 x d(h)), where d(h) = sin^2(pi (h - 6) / 16) for
6 <= h <= 22 and 0 otherwise (a night trough, a day peak around 14:00); at hours 10 and 16 the
one-hour Azure code trace (azure_llm_2023_code.csv, burstier) is overlaid as well, kept with
probability CODE. The seeded RNG makes it deterministic. Columns: arrival_s (s from the start)
and ContextTokens (the source request's, so the simulator's default duration rule still maps
longer prompts to longer audio).

Source: Azure LLM inference trace 2023 (CC-BY-4.0): Patel et al., "Splitwise: Efficient generative
LLM inference using phase splitting", ISCA 2024.

Run: ``python bench/make_day_trace.py TRACES_DIR`` (writes bench/traces/day_synthetic.csv).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
import sys
from pathlib import Path

PEAK = 0.08
CODE = 0.5
SEED = 14


def _load(path: Path) -> list[tuple[float, str]]:
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            t = dt.datetime.fromisoformat(row["TIMESTAMP"][:26])
            rows.append((t.timestamp(), row["ContextTokens"]))
    t0 = min(t for t, _ in rows)
    return sorted((t - t0, c) for t, c in rows)


def day_shape(h: int) -> float:
    return math.sin(math.pi * (h - 6) / 16) ** 2 if 6 <= h <= 22 else 0.0


def main(traces: Path) -> None:
    conv = _load(traces / "azure_llm_2023_conv.csv")
    code = _load(traces / "azure_llm_2023_code.csv")
    rng = random.Random(SEED)
    out = []
    for h in range(24):
        p = PEAK * (0.03 + 0.97 * day_shape(h))
        out += [(h * 3600 + t, c) for t, c in conv if t < 3600 and rng.random() < p]
        if h in (10, 16):
            out += [(h * 3600 + t, c) for t, c in code if t < 3600 and rng.random() < CODE]
    out.sort()
    dest = Path(__file__).parent / "traces" / "day_synthetic.csv"
    dest.parent.mkdir(exist_ok=True)
    with dest.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "ContextTokens"])
        w.writerows((f"{t:.3f}", c) for t, c in out)
    print(f"wrote {dest}: {len(out)} requests")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/make_day_trace.py TRACE_DIR  (the directory holding the Azure LLM inference "
                 "traces, from github.com/Azure/AzurePublicDataset)")
    main(Path(sys.argv[1]))

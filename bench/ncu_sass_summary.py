"""Summarises one kernel's SASS export from Nsight Compute (``ncu -i REPORT --page source --csv
--print-source sass > sass.csv``): warp-stall samples by reason, the instruction mix (opcodes,
executed warp instructions, optionally per unit of work), and the instructions with the most
stall samples.

    python3 bench/ncu_sass_summary.py sass.csv [--units 3072] [--top 20]

``--units``: divide the counts by this many units of work (for the absorbed cross-attention
kernel at 128 rows of 1500 positions, 128 x 24 = 3072 blocks of 64 positions)."""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path


def summarise(path: Path, units: int = 1, top: int = 20) -> str:
    """The summary as text. ValueError if the file is not such an export."""
    rows = list(csv.reader(path.open()))
    header = next((r for r in rows if "Address" in r and "Source" in r), None)
    if header is None:
        raise ValueError(f"{path}: no 'Address' and 'Source' header: export it with --page source --csv --print-source sass")
    data = rows[rows.index(header) + 1:]
    ix = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(r: list[str], col: str) -> int:
        v = r[ix[col]] if ix[col] < len(r) else ""
        return int(v) if v.isdigit() else 0

    lines = []
    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
    by_reason = collections.Counter({s[6:]: sum(num(r, s) for r in data) for s in stalls})
    lines.append(f"warp-stall samples: {total}")
    lines += [f"  {k:20s} {v:8d} {100 * v / max(total, 1):5.1f}%" for k, v in by_reason.most_common(12) if v]
    mix: collections.Counter[str] = collections.Counter()
    for r in data:
        op = r[ix["Source"]].strip()
        if op.startswith("@"):
            op = op.split(None, 1)[1]
        mix[op.split()[0].split(".")[0] if op else "?"] += num(r, "Instructions Executed")
    executed = sum(mix.values())
    lines.append(f"executed warp instructions: {executed} ({executed / units:.0f} a unit of {units})")
    lines += [f"  {k:10s} {v / units:10.0f} {100 * v / max(executed, 1):5.1f}%" for k, v in mix.most_common(16)]
    lines.append(f"the {top} instructions with the most stall samples:")
    for r in sorted(data, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[:top]:
        reasons = sorted(((s[6:], num(r, s)) for s in stalls if num(r, s)), key=lambda kv: -kv[1])[:3]
        lines.append(f"  {num(r, 'Warp Stall Sampling (All Samples)'):6d} {r[ix['Source']].strip()[:58]:58s} {reasons}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--units", type=int, default=1)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    print(summarise(args.csv, args.units, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

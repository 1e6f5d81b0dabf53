"""Summarise a py-spy raw profile (``--format raw --threads --subprocesses``): per process and
thread, the share of samples, and for one thread the inclusive share of chosen functions and the
top self frames.

    python bench/profile_summary.py served_profile.raw                       # processes/threads
    python bench/profile_summary.py served_profile.raw --match engine_main   # threads whose stacks hold it
"""

from __future__ import annotations

import argparse
import collections
import re


def parse(path: str):
    """Yield (process id, thread name, frames, count) per line of a py-spy raw file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            procs = [x for x in frames if x.startswith("process ")]
            pid = procs[-1].split(":", 1)[0].split()[1] if procs else "?"
            thread = next((x for x in frames if x.startswith("thread ")), "thread ?")
            body = [x for x in frames if not x.startswith(("process ", "thread "))]
            yield pid, thread, body, int(count)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--match", default="", help="a function name; summarise the threads whose stacks hold it")
    ap.add_argument("--functions", default="", help="comma list of function names to report inclusively")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    rows = list(parse(a.raw))
    total = collections.Counter()
    for pid, thread, _body, n in rows:
        total[(pid, thread)] += n
    if not a.match:
        for (pid, thread), n in total.most_common(40):
            print(f"{n:7d}  pid {pid}  {thread}")
        return 0
    keys = {(pid, thread) for pid, thread, body, _ in rows if any(a.match in f for f in body)}
    for key in sorted(keys):
        sel = [(body, n) for pid, thread, body, n in rows if (pid, thread) == key]
        all_n = sum(n for _, n in sel)
        print(f"== pid {key[0]} {key[1]}: {all_n} samples")
        inclusive = collections.Counter()
        selfs = collections.Counter()
        for body, n in sel:
            names = {re.sub(r" \(.*", "", f) for f in body}
            for name in names:
                inclusive[name] += n
            selfs[body[-1] if body else "(no Python frame)"] += n
        wanted = [f for f in a.functions.split(",") if f]
        for name in wanted:
            print(f"  {100 * inclusive[name] / all_n:5.1f}%  {name} (inclusive)")
        print("  -- top inclusive")
        for name, n in inclusive.most_common(a.top):
            print(f"  {100 * n / all_n:5.1f}%  {name}")
        print("  -- top self")
        for name, n in selfs.most_common(a.top):
            print(f"  {100 * n / all_n:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Request traces: load a CSV or JSONL file of arrivals, thin it, time-scale it, give each request
an audio duration.

Input formats:

- CSV with a header row. The arrival time is the first column named ``TIMESTAMP``, ``timestamp``,
  ``time`` or ``arrival_s`` (case-insensitive): either seconds (a number) or a date-time
  (``2023-11-16 18:15:46.6805900``, ISO 8601; fractions past microseconds are cut). Other columns
  are kept per request (e.g. ``ContextTokens``, ``GeneratedTokens`` of the Azure LLM inference
  trace 2023, CC-BY-4.0, Patel et al., "Splitwise: Efficient generative LLM inference using phase
  splitting", ISCA 2024).
- JSONL: one JSON object a line with the same keys.

Arrivals are sorted and made relative to the first one (t = 0). Then, in this order:
``max_trace_s`` keeps the arrivals of the first that many seconds of the original trace;
``time_scale`` multiplies every arrival time (2 replays at half the rate over twice the time);
``thin`` keeps each request independently with that probability (a seeded RNG).

Audio duration rules (``DurationRule.parse``; each gives seconds per request):

- ``quantile:COLUMN:MIN:MAX`` (default ``quantile:ContextTokens:1:30``): the request's quantile q
  of COLUMN over the whole loaded trace (mid-rank for ties: q = (#smaller + #equal / 2) / n) maps
  linearly onto [MIN, MAX]: d = MIN + q (MAX - MIN). Longer prompts become longer audio;
  deterministic, and a request keeps its duration whatever thinning follows.
- ``fixed:S``: every request S seconds.
- ``uniform:MIN:MAX``: uniform in [MIN, MAX] from the seeded RNG.
- ``column:NAME``: the value of column NAME, seconds.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping, Sequence

from tideserve.sim.errors import SimInputError

TIME_COLUMNS = ("timestamp", "time", "arrival_s")
#: Longest replay accepted (s, after ``time_scale``): the simulator steps every
#: ``autoscaling.interval_s`` for the whole span (about 16 s of CPU per simulated day with a
#: 1 s interval, measured on 2 cores), so a week is minutes and a year would never end.
MAX_REPLAY_S = 7 * 86_400.0
DEFAULT_DURATION_RULE = "quantile:ContextTokens:1:30"


@dataclass(frozen=True)
class TraceRequest:
    """One request of a replay: ``id`` (order in the replay), arrival time ``arrival_s`` (s from the
    replay's start) and ``audio_s``, the duration of its audio in seconds."""

    id: int
    arrival_s: float
    audio_s: float


@dataclass(frozen=True)
class DurationRule:
    """How a request gets its audio duration; see the module docstring for the rule names."""

    kind: str
    column: str = ""
    low_s: float = 0.0
    high_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> DurationRule:
        """Parse ``quantile:COL:MIN:MAX``, ``fixed:S``, ``uniform:MIN:MAX`` or ``column:NAME``.
        Raises SimInputError naming the rule and the accepted forms."""
        parts = text.split(":")
        forms = "quantile:COLUMN:MIN_S:MAX_S, fixed:S, uniform:MIN_S:MAX_S or column:NAME"
        try:
            if parts[0] == "quantile" and len(parts) == 4:
                rule = cls("quantile", parts[1], float(parts[2]), float(parts[3]))
            elif parts[0] == "fixed" and len(parts) == 2:
                rule = cls("fixed", "", float(parts[1]), float(parts[1]))
            elif parts[0] == "uniform" and len(parts) == 3:
                rule = cls("uniform", "", float(parts[1]), float(parts[2]))
            elif parts[0] == "column" and len(parts) == 2 and parts[1]:
                return cls("column", parts[1])
            else:
                raise ValueError
            if not (math.isfinite(rule.low_s) and math.isfinite(rule.high_s)):
                raise SimInputError(f"duration rule {text!r}: durations must be finite numbers of seconds")
        except ValueError:
            raise SimInputError(f"duration rule {text!r} is not understood; write {forms}") from None
        if not 0 < rule.low_s <= rule.high_s:
            raise SimInputError(f"duration rule {text!r}: durations must satisfy 0 < MIN <= MAX (seconds)")
        return rule

    def durations(self, rows: Sequence[Mapping[str, str]], rng: random.Random, source: str) -> list[float]:
        """One duration (s) per row. Raises SimInputError when a needed column is missing or not
        a number."""
        if self.kind == "fixed":
            return [self.low_s] * len(rows)
        if self.kind == "uniform":
            return [rng.uniform(self.low_s, self.high_s) for _ in rows]
        values = [_number(r, self.column, source, i) for i, r in enumerate(rows)]
        if self.kind == "column":
            bad = next((i for i, v in enumerate(values) if v <= 0), None)
            if bad is not None:
                raise SimInputError(f"{source}: request {bad + 1}: column {self.column} must be a positive duration in s")
            return values
        ordered = sorted(values)
        n = len(ordered)
        out = []
        for v in values:
            below = bisect.bisect_left(ordered, v)
            equal = bisect.bisect_right(ordered, v) - below
            q = (below + equal / 2) / n
            out.append(self.low_s + q * (self.high_s - self.low_s))
        return out


def _number(row: Mapping[str, str], column: str, source: str, i: int) -> float:
    if column not in row:
        raise SimInputError(f"{source}: the duration rule needs column {column!r}, which the trace does not have "
                            f"(columns: {', '.join(row)}); choose another --duration-rule, e.g. fixed:5")
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise SimInputError(f"{source}: request {i + 1}: {column} = {row[column]!r} is not a number") from None
    if not math.isfinite(value):
        raise SimInputError(f"{source}: request {i + 1}: {column} = {row[column]!r} is not a finite number")
    return value


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _parse_time(text: str, source: str, where: str) -> float:
    """Seconds: a number as is, a date-time as its POSIX time."""
    text = str(text).strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise SimInputError(f"{source}: {where}: timestamp {text!r} is not a finite number of seconds")
        return value
    try:
        t = dt.datetime.fromisoformat(_FRACTION.sub(r"\1", text))
    except ValueError:
        raise SimInputError(f"{source}: {where}: timestamp {text!r} is neither seconds nor an ISO 8601 date-time "
                            "(e.g. 2023-11-16 18:15:46.680590)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def _time_key(keys: Sequence[str], source: str) -> str:
    lower = {k.lower().strip(): k for k in keys}
    for name in TIME_COLUMNS:
        if name in lower:
            return lower[name]
    raise SimInputError(f"{source}: no timestamp column; name one of {', '.join(TIME_COLUMNS)} (any case); "
                        f"found: {', '.join(keys) or 'nothing'}")


def read_rows(path: str | Path) -> tuple[list[float], list[dict[str, str]]]:
    """Arrival times (s, as in the file) and rows of a CSV or JSONL trace (JSONL when the name
    ends in .jsonl or .ndjson). Raises SimInputError for an unreadable or malformed file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SimInputError(f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}") from None
    rows: list[dict[str, str]] = []
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SimInputError(f"{source}: line {n} is not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise SimInputError(f"{source}: line {n} must be a JSON object with a timestamp key")
            rows.append(obj)
        if not rows:
            raise SimInputError(f"{source}: the trace has no requests")
        key = _time_key(list(rows[0]), source)
        times = []
        for n, r in enumerate(rows, 1):
            if key not in r:
                raise SimInputError(f"{source}: request {n} has no {key!r}")
            times.append(_parse_time(r[key], source, f"request {n}"))
        return times, rows
    reader = csv.reader(text.splitlines())
    try:
        header = next(reader)
    except StopIteration:
        raise SimInputError(f"{source}: the trace is empty; a CSV trace needs a header row such as "
                            "TIMESTAMP,ContextTokens,GeneratedTokens") from None
    header = [h.strip() for h in header]
    key = _time_key(header, source)
    times = []
    for n, rec in enumerate(reader, 2):
        if not rec or all(not x.strip() for x in rec):
            continue
        if len(rec) != len(header):
            raise SimInputError(f"{source}: line {n} has {len(rec)} fields, the header has {len(header)} "
                                f"({', '.join(header)})")
        row = dict(zip(header, (x.strip() for x in rec), strict=True))
        times.append(_parse_time(row[key], source, f"line {n}"))
        rows.append(row)
    if not rows:
        raise SimInputError(f"{source}: the trace has a header but no requests")
    return times, rows


def load_trace(path: str | Path, duration_rule: str | DurationRule = DEFAULT_DURATION_RULE, seed: int = 0,
               thin: float = 1.0, time_scale: float = 1.0, max_trace_s: float | None = None) -> list[TraceRequest]:
    """The replay of a trace file: requests sorted by arrival, times relative to the first
    arrival, cut, time-scaled and thinned as the module docstring says, each with an audio
    duration. Raises SimInputError for a bad file or option: a timestamp or duration column that
    is not a finite number, a non-finite or non-positive ``time_scale`` / ``max_trace_s``, or a
    replay spanning more than ``MAX_REPLAY_S`` seconds."""
    if not 0 < thin <= 1:
        raise SimInputError(f"--thin {thin} must be in (0, 1]: the share of requests kept")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise SimInputError(f"--time-scale {time_scale} must be a finite number > 0")
    if max_trace_s is not None and not (math.isfinite(max_trace_s) and max_trace_s > 0):
        raise SimInputError(f"--max-trace-s {max_trace_s} must be a finite number of seconds > 0")
    rule = DurationRule.parse(duration_rule) if isinstance(duration_rule, str) else duration_rule
    times, rows = read_rows(path)
    rng = random.Random(seed)
    durations = rule.durations(rows, rng, str(path))
    order = sorted(range(len(times)), key=lambda i: (times[i], i))
    t0 = times[order[0]]
    out: list[TraceRequest] = []
    for i in order:
        t = times[i] - t0
        if max_trace_s is not None and t > max_trace_s:
            continue
        if thin < 1 and rng.random() >= thin:
            continue
        out.append(TraceRequest(len(out), t * time_scale, durations[i]))
    if not out:
        raise SimInputError(f"{path}: no request left after --max-trace-s / --thin; keep more of the trace")
    span_s = out[-1].arrival_s
    if span_s > MAX_REPLAY_S:
        raise SimInputError(f"{path}: the replay spans {span_s:.6g} s (after --time-scale), more than the "
                            f"{MAX_REPLAY_S:g} s (7 days) the simulator accepts; cut it with --max-trace-s, lower "
                            "--time-scale, or check the timestamps' unit (seconds, or ISO 8601 date-times)")
    return out

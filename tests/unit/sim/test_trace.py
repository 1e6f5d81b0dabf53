from __future__ import annotations

import re

import pytest

from tideserve.sim import SimInputError, load_trace
from tideserve.sim.trace import DurationRule


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_style_csv_sorted_relative_with_quantile_durations(tmp_path):
    p = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:50.0000000,400,1\n"
              "2023-11-16 18:15:46.5000000,100,1\n"
              "2023-11-16 18:15:47.5000000,200,1\n"
              "2023-11-16 18:15:48.5000000,200,1\n")
    reqs = load_trace(p, "quantile:ContextTokens:1:31")
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0, 3.5]
    # Mid-rank quantiles over 4 values: 100 -> (0 + 0.5)/4 = 0.125; 200 (x2) -> (1 + 1)/4 = 0.5;
    # 400 -> (3 + 0.5)/4 = 0.875; duration = 1 + q * 30.
    assert [r.audio_s for r in reqs] == [4.75, 16.0, 16.0, 27.25]


def test_time_scale_cut_and_thin_are_deterministic(tmp_path):
    rows = "".join(f"{t},{t}\n" for t in range(100))
    p = write(tmp_path, "t.csv", "arrival_s,ContextTokens\n" + rows)
    reqs = load_trace(p, "fixed:5", max_trace_s=9, time_scale=2)
    assert [r.arrival_s for r in reqs] == [2.0 * t for t in range(10)] and {r.audio_s for r in reqs} == {5.0}
    a = load_trace(p, "fixed:5", seed=3, thin=0.3)
    b = load_trace(p, "fixed:5", seed=3, thin=0.3)
    assert a == b and 10 < len(a) < 60 and [r.id for r in a] == list(range(len(a)))


def test_jsonl_with_duration_column(tmp_path):
    p = write(tmp_path, "t.jsonl", '{"timestamp": 10, "audio_s": 3}\n\n{"timestamp": 12.5, "audio_s": 40}\n')
    reqs = load_trace(p, "column:audio_s")
    assert [(r.arrival_s, r.audio_s) for r in reqs] == [(0.0, 3.0), (2.5, 40.0)]


@pytest.mark.parametrize("text, message", [
    ("ContextTokens,GeneratedTokens\n1,2\n", "no timestamp column; name one of timestamp, time, arrival_s"),
    ("TIMESTAMP,ContextTokens\n1,2\n3\n", "line 3 has 1 fields, the header has 2"),
    ("TIMESTAMP,ContextTokens\nyesterday,2\n", "line 2: timestamp 'yesterday' is neither seconds nor an ISO 8601"),
    ("", "the trace is empty"),
    ("TIMESTAMP,ContextTokens\n", "has a header but no requests"),
    ("TIMESTAMP,Other\n1,2\n", "needs column 'ContextTokens', which the trace does not have"),
    ("TIMESTAMP,ContextTokens\n1,many\n", "request 1: ContextTokens = 'many' is not a number"),
])
def test_bad_csv_gives_clear_errors(tmp_path, text, message):
    p = write(tmp_path, "bad.csv", text)
    with pytest.raises(SimInputError) as exc:
        load_trace(p)
    assert message in str(exc.value) and str(p) in str(exc.value)


def test_bad_jsonl_missing_file_and_bad_options(tmp_path):
    with pytest.raises(SimInputError, match="line 2 is not JSON"):
        load_trace(write(tmp_path, "b.jsonl", '{"time": 1}\n{oops\n'), "fixed:1")
    with pytest.raises(SimInputError, match="cannot read trace"):
        load_trace(tmp_path / "nope.csv")
    ok = write(tmp_path, "ok.csv", "time\n1\n")
    with pytest.raises(SimInputError, match="--thin 0 must be in"):
        load_trace(ok, "fixed:1", thin=0)
    with pytest.raises(SimInputError, match="duration rule 'quantile:x' is not understood"):
        DurationRule.parse("quantile:x")
    with pytest.raises(SimInputError, match="0 < MIN <= MAX"):
        DurationRule.parse("uniform:5:1")


@pytest.mark.parametrize("text, message", [
    ("TIMESTAMP,ContextTokens\nnan,100\n1,200\n", "line 2: timestamp 'nan' is not a finite number of seconds"),
    ("TIMESTAMP,ContextTokens\n0,100\ninf,200\n", "line 3: timestamp 'inf' is not a finite number of seconds"),
    ("TIMESTAMP,ContextTokens\n0,nan\n1,200\n", "request 1: ContextTokens = 'nan' is not a finite number"),
    ("TIMESTAMP,ContextTokens\n0,100\n1e300,200\n", "the replay spans 1e+300 s (after --time-scale), more than "
                                                    "the 604800 s (7 days) the simulator accepts"),
])
def test_non_finite_or_endless_traces_are_refused(tmp_path, text, message):
    # Before: NaN/inf arrivals crashed the report with "cannot convert float NaN to integer", a NaN
    # token count silently skewed the quantile durations, and a 1e300 s span never finished.
    p = write(tmp_path, "odd.csv", text)
    with pytest.raises(SimInputError) as exc:
        load_trace(p)
    assert message in str(exc.value) and str(p) in str(exc.value)


def test_replay_span_limit_counts_the_time_scale(tmp_path):
    p = write(tmp_path, "week.csv", "time\n0\n600000\n")
    assert [r.arrival_s for r in load_trace(p, "fixed:1")] == [0.0, 600000.0]
    with pytest.raises(SimInputError, match=re.escape("the replay spans 1.2e+06 s")):
        load_trace(p, "fixed:1", time_scale=2.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"time_scale": float("nan")}, "--time-scale nan must be a finite number > 0"),
    ({"time_scale": float("inf")}, "--time-scale inf must be a finite number > 0"),
    ({"time_scale": -1.0}, "--time-scale -1.0 must be a finite number > 0"),
    ({"max_trace_s": float("nan")}, "--max-trace-s nan must be a finite number of seconds > 0"),
    ({"max_trace_s": -5.0}, "--max-trace-s -5.0 must be a finite number of seconds > 0"),
    ({"duration_rule": "fixed:inf"}, "duration rule 'fixed:inf': durations must be finite numbers of seconds"),
    ({"duration_rule": "quantile:ContextTokens:1:inf"}, "durations must be finite numbers of seconds"),
])
def test_absurd_options_are_refused(tmp_path, kwargs, message):
    p = write(tmp_path, "ok.csv", "time,ContextTokens\n0,1\n1,2\n")
    with pytest.raises(SimInputError) as exc:
        load_trace(p, **kwargs)
    assert message in str(exc.value)

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim_fixtures import grid_profile
from tideserve.cli.main import app
from tideserve.sim.profile import Profile, ProfileMetadata

ROOT = Path(__file__).resolve().parents[3]


def _profile(tmp_path: Path) -> Path:
    prof = Profile(metadata=ProfileMetadata(machine="test", date="2026-01-01T00:00:00+00:00", model="m"),
                   pools=[grid_profile("cpu-int8", "cpu-x86_64-int8", 1.0), grid_profile("cpu-fp32", "cpu-x86_64-fp32", 2.0)])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.model_dump()))
    return path


def test_simulate_writes_the_report_with_plots_and_attribution(tmp_path):
    trace = tmp_path / "azure_llm_2023_tiny.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" +
                     "".join(f"2023-11-16 18:{m:02d}:{s:02d}.0000000,{100 + 7 * m + s},10\n"
                             for m in range(0, 20, 3) for s in (0, 5, 9)))
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["simulate", str(ROOT / "examples" / "whisper-sim-cluster.yaml"), "--trace", str(trace),
                                 "--profile", str(_profile(tmp_path)), "--seed", "3", "--seeds", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "lever spot" in r.output and f"report: {out / 'report.md'}" in r.output
    md = (out / "report.md").read_text()
    assert "Patel et al., \"Splitwise" in md and "CC-BY-4.0" in md
    for heading in ("## Policies", "## Saving of each lever", "static-peak", "static-mean", "| tideserve |"):
        assert heading in md
    assert all((out / f).stat().st_size > 1000 for f in ("timeline.png", "latency_cdf.png", "cost.png"))
    doc = json.loads((out / "results.json").read_text())
    assert [x["name"] for x in doc["runs"]][:3] == ["static-peak", "static-mean", "tideserve"]
    # Two seeds per policy (3 and 4): the mean cost with its range, and the seeds among the inputs.
    assert "Each policy ran with 2 seeds" in md and "| cost range $ |" in md and doc["inputs"]["seeds"] == "3-4"
    t = doc["runs"][2]
    row = next(line for line in md.splitlines() if line.startswith("| tideserve |"))
    assert t["seeds"] == 2 and f"| {t['cost_usd']:.3f} | {t['cost_min_usd']:.3f}-{t['cost_max_usd']:.3f} |" in row


def test_simulate_and_profile_refuse_bad_input_clearly(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("when,ContextTokens\n1,2\n")
    r = CliRunner().invoke(app, ["simulate", str(ROOT / "examples" / "whisper-sim-cluster.yaml"), "--trace", str(bad),
                                 "--profile", str(_profile(tmp_path))])
    assert r.exit_code == 2 and "no timestamp column" in r.output
    r = CliRunner().invoke(app, ["bench", "profile", str(ROOT / "examples" / "whisper-tiny-en.yaml"), "--pool", "gpu"])
    assert r.exit_code == 2 and "no pool named gpu" in r.output
    r = CliRunner().invoke(app, ["bench", "profile", str(ROOT / "examples" / "whisper-tiny-en.yaml"), "--audio-s", "45"])
    assert r.exit_code == 2 and "must be <= 30" in r.output


def test_simulate_refuses_a_nan_arrival_without_a_traceback(tmp_path):
    # Before: "ValueError: cannot convert float NaN to integer" from the report's peak-rate bins.
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens\nnan,100\n1,200\n")
    r = CliRunner().invoke(app, ["simulate", str(ROOT / "examples" / "whisper-sim-cluster.yaml"), "--trace", str(trace),
                                 "--profile", str(_profile(tmp_path)), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert "line 2: timestamp 'nan' is not a finite number of seconds" in r.output


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0.5"], "--batch-sizes must list whole numbers >= 1, e.g. 1,2,4,8; got '0.5'"),
    (["--batch-sizes", "inf"], "--batch-sizes must list finite positive numbers; got 'inf'"),
    (["--audio-s", "nan"], "--audio-s must list finite positive numbers; got 'nan'"),
    (["-o", "/nonexistent-dir/p.json"], "-o /nonexistent-dir/p.json: directory /nonexistent-dir does not exist"),
])
def test_bench_profile_refuses_absurd_flags_before_measuring(args, message):
    # Before: int(inf) / int(nan) tracebacks, batch size 0.5 -> 0 -> a numpy stack error after
    # loading the model, and an unwritable -o failed only after the whole measurement.
    r = CliRunner().invoke(app, ["bench", "profile", str(ROOT / "examples" / "whisper-tiny-en.yaml"), *args])
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit)
    assert message in r.output

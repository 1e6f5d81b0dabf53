"""``tideserve bench profile`` and ``tideserve simulate``: measure service times, replay traces."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import typer
from rich.markup import escape

from tideserve.cli.common import err

bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure this machine.")


def _floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        err.print(f"[red]error:[/red] {what} must be comma-separated numbers, e.g. 1,2,4,8; got {text!r}", highlight=False)
        raise typer.Exit(2) from None
    if not vals or any(not (math.isfinite(v) and v > 0) for v in vals):
        err.print(f"[red]error:[/red] {what} must list finite positive numbers; got {text!r}", highlight=False)
        raise typer.Exit(2)
    return vals


def _sizes(text: str) -> list[int]:
    vals = _floats(text, "--batch-sizes")
    if any(v != int(v) for v in vals):
        err.print(f"[red]error:[/red] --batch-sizes must list whole numbers >= 1, e.g. 1,2,4,8; got {text!r}",
                  highlight=False)
        raise typer.Exit(2)
    return [int(v) for v in vals]


@bench_app.command("profile")
def bench_profile(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file"),
    pool: list[str] | None = typer.Option(None, "--pool", help="pool to measure (repeat; default: every pool)"),
    batch_sizes: str = typer.Option("1,2,4,8", help="batch sizes, comma-separated"),
    audio_s: str = typer.Option("5,15,30", "--audio-s", help="window lengths in seconds (<= 30), comma-separated"),
    repeats: int = typer.Option(3, min=1, help="executions measured per point (the median is kept)"),
    out_file: Path = typer.Option(Path("profile.json"), "-o", "--out", help="profile JSON to write"),
    speech: Path | None = typer.Option(None, "--speech", help="directory of .wav speech clips (default: "
                                          "pytest-audioeval's English clips)"),
    config: Path | None = typer.Option(None, "--config", help="local config (allowed file roots, cache dir)"),
) -> None:
    """Measure a pool's engine here: batch size x audio length -> latency of one execution (JSON)."""
    from tideserve.cli.bench import measure_profile
    from tideserve.cli.common import load_or_exit as _load
    from tideserve.errors import TideserveError

    ep = _load(file)
    sizes = _sizes(batch_sizes)
    lengths = _floats(audio_s, "--audio-s")
    if any(a > 30 for a in lengths):
        err.print("[red]error:[/red] --audio-s values are window lengths and must be <= 30 (Whisper's window)")
        raise typer.Exit(2)
    names = pool or [p.name for p in ep.spec.pools]
    unknown = [n for n in names if n not in {p.name for p in ep.spec.pools}]
    if unknown:
        err.print(f"[red]error:[/red] no pool named {', '.join(unknown)} in {file}; pools: "
                  f"{', '.join(p.name for p in ep.spec.pools)}", highlight=False)
        raise typer.Exit(2)
    if not out_file.parent.is_dir():
        # Checked before measuring (minutes of work) rather than when writing the result.
        err.print(f"[red]error:[/red] -o {out_file}: directory {out_file.parent} does not exist; create it or "
                  "choose another path", highlight=False)
        raise typer.Exit(2)
    try:
        from tideserve.spec import load_local_config

        cfg = load_local_config(config)
        prof = measure_profile(ep, names, sizes, lengths, repeats, progress=lambda s: err.print(s, highlight=False),
                               speech_dir=speech, allowed_file_roots=cfg.allowed_file_roots, cache_dir=cfg.cache_dir)
    except (TideserveError, RuntimeError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    try:
        out_file.write_text(json.dumps(prof.model_dump(), indent=1) + "\n")
    except OSError as exc:
        err.print(f"[red]error:[/red] cannot write {out_file}: {exc.strerror or exc}", highlight=False)
        raise typer.Exit(1) from None
    err.print(f"wrote {out_file}", highlight=False)


def simulate_cmd(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file"),
    trace: Path = typer.Option(..., "--trace", help="trace CSV or JSONL with a timestamp column"),
    profile: list[Path] | None = typer.Option(None, "--profile", help="profile JSON (repeat); default: bench/profiles/*.json"),
    seed: int = typer.Option(0, help="seed of every random choice (thinning, spot interruptions)"),
    thin: float = typer.Option(1.0, help="keep each request with this probability, (0, 1]"),
    time_scale: float = typer.Option(1.0, help="multiply arrival times (2: half the rate over twice the time)"),
    max_trace_s: float | None = typer.Option(None, help="only the first this many seconds of the trace"),
    duration_rule: str = typer.Option("quantile:ContextTokens:1:30", help="audio duration per request: "
                                      "quantile:COL:MIN:MAX | fixed:S | uniform:MIN:MAX | column:NAME"),
    spot_interruption_rate_per_h: float = typer.Option(0.05, min=0, help="spot interruptions per spot node-hour"),
    spot_discount: float = typer.Option(0.6, min=0, max=0.99, help="spot price = on-demand x (1 - discount)"),
    slo_s: float | None = typer.Option(None, min=0.001, help="latency SLO, s (default: the endpoint's "
                                          "autoscaling.slo_p95_s)"),
    cluster: str = typer.Option("aws", help="aws (machines from the offering catalog) or local (embedded, one machine)"),
    replica_slots: int = typer.Option(4, min=1, help="local cluster: replica slots on the machine"),
    out_dir: Path = typer.Option(Path("sim-report"), "--out", help="directory for report.md, plots and results.json"),
    model_bytes: float | None = typer.Option(None, min=1, help="model size for the cold start's load phase "
                                                "(default: the catalog's, tiny.en's ~75 MB)"),
    start_warm: bool = typer.Option(False, help="autoscaled runs start with one ready replica (a replay cut out of "
                                    "continuous traffic)"),
    seeds: int = typer.Option(1, min=1, help="runs per policy with seeds SEED, SEED+1, ...: costs are their mean "
                                             "(spot interruptions and service times are random draws)"),
) -> None:
    """Replay a trace through tideserve's policies; compare static and autoscaled fleets; write a TCO report."""
    from tideserve.cli.common import exit_missing_extra, load_or_exit as _load

    exit_missing_extra("tideserve simulate's report plots", "sim")
    from tideserve.sim import ColdStartCatalog, RunOptions, SimInputError, compare, load_profile, load_trace
    from tideserve.sim.profile import pools_for_backend
    from tideserve.sim.report import count_text, write_report

    ep = _load(file)
    if slo_s is None:
        slo_s = ep.spec.autoscaling.slo_p95_s
    if cluster not in ("aws", "local"):
        err.print(f"[red]error:[/red] --cluster must be aws or local, not {cluster!r}", highlight=False)
        raise typer.Exit(2)
    paths = profile or sorted(Path("bench/profiles").glob("*.json"))
    if not paths:
        err.print("[red]error:[/red] no profile: pass --profile FILE (write one with `tideserve bench profile`)")
        raise typer.Exit(2)
    try:
        profs = [load_profile(p) for p in paths]
        reqs = load_trace(trace, duration_rule, seed, thin, time_scale, max_trace_s)
        # A CPU replica's machine has the cores its profile was measured with.
        cpu_cores = max((p.metadata.cpus for p in profs if p.metadata.gpu is None and p.metadata.cpus), default=2)
        opts = RunOptions(cluster="aws" if cluster == "aws" else "local",
                          replica_slots=replica_slots, seed=seed, spot_discount=spot_discount,
                          spot_interruption_rate_per_h=spot_interruption_rate_per_h, cpu_cores=cpu_cores)
        pools = pools_for_backend(profs, list(paths), ep.spec.model.backend)
        cs = ColdStartCatalog() if model_bytes is None else ColdStartCatalog(model_bytes=model_bytes)
        opts = dataclasses.replace(opts, coldstart=cs)
        runs, levers = compare(ep.spec, reqs, pools, opts, slo_s, start_warm=start_warm, seeds=seeds)
    except SimInputError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    inputs = {"endpoint": str(file), "trace": str(trace), "thin": f"{thin:g}", "time-scale": f"{time_scale:g}",
              "duration rule": duration_rule, "seed": str(seed), "cluster": cluster,
              "spot interruptions per node-hour": f"{spot_interruption_rate_per_h:g}",
              "spot discount": f"{spot_discount:g}", "profiles": ", ".join(str(p) for p in paths)}
    if seeds > 1:
        inputs["seeds"] = f"{seed}-{seed + seeds - 1}"
    if max_trace_s is not None:
        inputs["max trace s"] = f"{max_trace_s:g}"
    if model_bytes is not None:
        inputs["model bytes"] = f"{model_bytes:g}"
    if start_warm:
        inputs["start warm"] = "one ready replica at t = 0 in autoscaled runs"
    path = write_report(out_dir, runs, levers, reqs, profs, inputs, slo_s, cs)
    for r in runs + [lv.off for lv in levers if lv.off is not None]:
        s = r.summary
        print(f"{r.name:<26} cost ${s.cost_usd:8.3f}  GPU-h {s.gpu_hours:6.2f}  CPU node-h {s.cpu_node_hours:6.2f}  "
              f"SLO {100 * s.slo_attainment:5.1f}%  p50 {s.p50_s or 0:6.2f}s  p95 {s.p95_s or 0:7.2f}s  "
              f"p99 {s.p99_s or 0:7.2f}s  failed {count_text(s.failed)}  cold starts {count_text(s.cold_starts)}")
    for lv in levers:
        print(f"lever {lv.name:<20} " + (f"saving ${lv.saving_usd:.3f}" if lv.saving_usd is not None else lv.note))
    print(f"report: {path}")


def register(app: typer.Typer) -> None:
    """Add ``bench`` (a sub-app) and ``simulate`` to the ``tideserve`` app."""
    app.add_typer(bench_app, name="bench")
    app.command("simulate")(simulate_cmd)

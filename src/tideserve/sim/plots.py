"""PNG plots of a comparison (the only module of tideserve.sim that imports matplotlib; Agg)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tideserve.sim.compare import PolicyRun


def timeline(run: PolicyRun, requests_per_min: Sequence[tuple[float, int]], path: Path) -> None:
    """Replicas (ready per pool, all) and nodes over time against the load and arrivals/min."""
    tl = run.result.timeline
    t = [x[0] / 60 for x in tl]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    ax1.bar([m for m, _ in requests_per_min], [n for _, n in requests_per_min], width=1.0, color="#cfd8e3",
            label="arrivals per minute", align="edge")
    ax1b = ax1.twinx()
    ax1b.plot(t, [x[1] for x in tl], color="#1f4e79", lw=0.8, label="load (pending + in flight)")
    ax1.set_ylabel("arrivals per minute")
    ax1b.set_ylabel("requests")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax1b.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8)
    seed = f" (seed {run.options.seed})" if run.options is not None and len(run.results) > 1 else ""
    ax1.set_title(f"{run.name}{seed}: load, replicas and nodes over time")
    pools = sorted({p for x in tl for p in x[2]})
    for p in pools:
        ax2.step(t, [x[2].get(p, 0) for x in tl], where="post", lw=1, label=f"ready replicas, {p}")
    ax2.step(t, [x[3] for x in tl], where="post", lw=1, ls="--", color="black", label="replicas (all states)")
    ax2.step(t, [x[4] for x in tl], where="post", lw=1, ls=":", color="#b03a2e", label="nodes")
    ax2.set_xlabel("time (min)")
    ax2.set_ylabel("count")
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_cdf(runs: Sequence[PolicyRun], slo_s: float, path: Path) -> None:
    """Empirical CDF of request latency per policy (answered requests), SLO marked."""
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = ("-", "--", ":", "-.")
    for k, run in enumerate(runs):  # line styles and widths differ so that identical curves stay visible
        results = run.results or (run.result,)  # every seed's requests pooled, as the table's figures are
        lat = sorted(r.latency_s for res in results for r in res.requests if r.latency_s is not None)
        n = sum(len(res.requests) for res in results)
        if lat:
            ax.step(lat, [(i + 1) / n for i in range(len(lat))], where="post", label=run.name,
                    ls=styles[k % len(styles)], lw=2.4 - 0.25 * k)
    ax.axvline(slo_s, color="grey", ls="--", lw=0.8, label=f"SLO {slo_s:g} s")
    ax.set_xscale("log")
    ax.set_xlabel("latency (s, log scale)")
    ax.set_ylabel("share of all requests")
    ax.set_ylim(0, 1.01)
    ax.legend(fontsize=8)
    ax.set_title("Latency CDF by policy (failed requests never reach 1.0)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cost_bars(runs: Sequence[PolicyRun], path: Path) -> None:
    """Cost in $ per policy and lever-off run."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [r.name for r in runs]
    costs = [r.summary.cost_usd for r in runs]
    bars = ax.bar(names, costs, color=["#8e9aaf" if r.name.startswith("static") else
                                       "#2e86ab" if r.name == "tideserve" else "#c9d6df" for r in runs])
    for b, c in zip(bars, costs, strict=True):
        ax.annotate(f"${c:.3f}" if c < 10 else f"${c:.0f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("cost ($)")
    ax.set_title("Cost by policy over the replayed trace")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

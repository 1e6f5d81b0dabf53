"""Read values out of Prometheus text exposition (for `tideserve status`, tests and benches)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0.0 when none)."""
    total = 0.0
    want = labels or {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                total += s.value
    return total

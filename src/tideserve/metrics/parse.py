"""Read values out of Prometheus text exposition (for `tideserve status`, tests and benches)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0.0 when none).

    prometheus-client's parser reports a counter's samples as ``<name>_total`` even when the
    exposition (like Triton's) writes them without the suffix; both spellings match.
    """
    total = 0.0
    want = labels or {}
    names = {name, name + "_total"}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names and all(s.labels.get(k) == v for k, v in want.items()):
                total += s.value
    return total

"""The scaler's metric arithmetic: what KEDA and the HPA make of the numbers it reports."""

from __future__ import annotations

import math

import pytest

from tideserve.gateway.scaler import hpa_desired, keda_milli, metric_name, metric_numbers, target_milli, wire_float

DESIRED = (0, 1, 7, 40)
TARGETS = (0.01, 0.1, 0.3, 0.7, 1, 2.5, 4, 7.77, 33.333, 1000, 100_000)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("desired", DESIRED)
def test_keda_sees_exact_milli_integers_and_hpa_ceil_gives_desired(desired, target):
    n = metric_numbers(desired, target)
    t, v = keda_milli(n.target_float), keda_milli(n.value_float)
    assert (t, v) == (n.target_milli, n.value_milli) == (round(target * 1000), desired * round(target * 1000))
    assert math.ceil(v / t) == desired
    # The deprecated integer fields carry the same ratio (milli-units on both sides).
    assert n.value_milli // n.target_milli == desired and n.value_milli % n.target_milli == 0


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("desired", (1, 7, 40))
def test_hpa_lands_on_desired_from_any_current_up_to_nine_and_when_settled(desired, target):
    n = metric_numbers(desired, target)
    t, v = keda_milli(n.target_float), keda_milli(n.value_float)
    for current in range(1, 10):
        assert hpa_desired(v, t, current) == desired, current
    assert hpa_desired(v, t, desired) == desired  # settled: ratio exactly 1, nothing moves


def test_changes_over_ten_percent_survive_the_tolerance_at_any_size():
    n = metric_numbers(40, 4)
    for current in (10, 20, 30, 36, 45, 100):  # |40 - c| / c > 0.1
        assert hpa_desired(n.value_milli, n.target_milli, current) == 40, current


def test_within_ten_percent_at_ten_or_more_the_default_tolerance_holds_and_zero_tolerance_does_not():
    n = metric_numbers(40, 4)
    # 38 -> 40 is a 5 % change: no number with ceil(U/T) = 40 can leave the 10 % band.
    assert hpa_desired(n.value_milli, n.target_milli, 38) == 38
    assert hpa_desired(n.value_milli, n.target_milli, 38, tolerance=0.0) == 40
    for current in range(1, 200):
        assert hpa_desired(n.value_milli, n.target_milli, current, tolerance=0.0) == 40


def test_zero_desired_reports_zero():
    n = metric_numbers(0, 4)
    assert (n.value_milli, n.value_float, keda_milli(n.value_float)) == (0, 0.0, 0)
    assert hpa_desired(0, n.target_milli, 3) == 0  # the HPA then clamps to minReplicas; KEDA does 1 -> 0


def test_wire_float_nudges_only_when_truncation_would_lose_a_milli():
    assert wire_float(4000) == 4.0
    assert wire_float(2500) == 2.5
    for milli in range(1, 20_000):
        assert keda_milli(wire_float(milli)) == milli


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="desired replicas must be >= 0"):
        metric_numbers(-1, 4)
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number > 0"):
            target_milli(bad)
    with pytest.raises(ValueError, match=">= 1 replica"):
        hpa_desired(1000, 1000, 0)


def test_metric_name_names_endpoint_and_pool():
    assert metric_name("whisper", "a10g") == "tideserve-whisper-a10g-load"

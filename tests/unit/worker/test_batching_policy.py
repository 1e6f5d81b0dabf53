from __future__ import annotations

import pytest

from tideserve.worker.batching import BatchCut, QueuedItem, cut_batch


def q(*items):
    return [QueuedItem(c, t) for c, t in items]


def test_waits_for_the_oldest_items_delay_while_the_batch_is_not_full():
    # Oldest at 10.0, delay 0.02 s: at 10.005 the batch waits 0.015 s more.
    cut = cut_batch(q((1, 10.0), (2, 10.004)), max_batch_size=4, max_queue_delay_s=0.02, now=10.005)
    assert cut.take == () and cut.wait_s == pytest.approx(0.015)


def test_cuts_when_the_delay_has_run_out():
    assert cut_batch(q((1, 10.0), (2, 10.004)), 4, 0.02, now=10.02) == BatchCut((0, 1))


def test_cuts_at_once_when_full_and_takes_round_robin_over_callers():
    # Caller 1 queued three windows, then callers 2 and 3 one each: one per caller per round.
    cut = cut_batch(q((1, 0.0), (1, 0.0), (1, 0.0), (2, 0.1), (3, 0.2)), 4, 10.0, now=0.2)
    assert cut == BatchCut((0, 3, 4, 1))


def test_empty_queue_and_bad_arguments():
    assert cut_batch([], 4, 0.02, now=0.0) == BatchCut(())
    with pytest.raises(ValueError, match="max_batch_size 0"):
        cut_batch(q((1, 0.0)), 0, 0.0, 0.0)
    with pytest.raises(ValueError, match="max_queue_delay_s -1"):
        cut_batch(q((1, 0.0)), 1, -1, 0.0)


def test_the_last_free_instance_is_kept_for_callers_with_nothing_executing():
    from tideserve.worker.batching import schedulable

    queue = q((1, 0.0), (1, 0.0), (2, 0.5), (1, 0.0))
    # Two of three instances free: anything may start, caller 1's windows included.
    assert schedulable(queue, executing={1}, free_instances=2, instances=3) == [0, 1, 2, 3]
    # The last free one: only caller 2 (caller 1 already executes elsewhere).
    assert schedulable(queue, executing={1}, free_instances=1, instances=3) == [2]
    assert schedulable(queue, executing={1, 2}, free_instances=1, instances=3) == []
    # One instance: no instance is kept back (the caller waits for its own batch anyway).
    assert schedulable(queue, executing=set(), free_instances=1, instances=1) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="free_instances 0"):
        schedulable(queue, set(), 0, 3)
    with pytest.raises(ValueError, match="instances 0"):
        schedulable(queue, set(), 1, 0)

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


def test_short_callers_go_first_and_long_ones_run_in_the_background_on_all_instances_but_one():
    from tideserve.worker.batching import NextBatch, next_batch, short_callers

    # Caller 1: a long file (5 windows, more than a batch of 4); caller 2: one window.
    queue = q((1, 0.0), (1, 0.0), (1, 0.0), (2, 0.5), (1, 0.0), (1, 0.0))
    assert short_callers(queue, executing={}, max_batch_size=4) == {2}
    assert short_callers(queue, executing={}, max_batch_size=5) == {1, 2}
    # Items executing count: 5 queued + 1 executing is more than a batch of 5.
    assert short_callers(queue, executing={1: 1, 2: 4}, max_batch_size=5) == {2}
    # The short caller's window is cut first, alone (never batched with the long file's windows).
    assert next_batch(queue, {}, 0, 3, 3, 4, 0.0, now=1.0) == NextBatch((3,))
    # Without it, the long file fills a background batch, in queue order: its 5 windows divided
    # over the two instances its lane may take, 3 now (the rest go to the other instance).
    rest = [x for x in queue if x.caller == 1]
    assert next_batch(rest, {}, 0, 3, 3, 4, 0.0, now=1.0) == NextBatch((0, 1, 2), background=True)
    # Two instances of three run its batches: the third is kept, even with windows still queued.
    assert next_batch(rest, {1: 4}, 1, 2, 3, 4, 0.0, now=1.0) == NextBatch((0, 1, 2, 3), background=True)
    assert next_batch(rest, {1: 8}, 2, 1, 3, 4, 0.0, now=1.0) is None
    # A short caller waiting for its batch to fill: the long file still starts, then the wait.
    assert next_batch(queue, {}, 0, 3, 3, 4, 1.0, now=1.0) == NextBatch((0, 1, 2), background=True)
    assert next_batch(queue, {1: 8}, 2, 1, 3, 4, 1.0, now=1.0) == NextBatch((), 0.5)
    # Short callers may take every instance, the last one included, while no long caller waits.
    assert next_batch(q((2, 0.0), (3, 0.0)), {1: 8}, 2, 1, 3, 1, 0.0, now=0.0) == NextBatch((0,))
    # One instance: no classes, the whole queue round-robin, never background.
    assert next_batch(queue, {}, 0, 1, 1, 4, 0.0, now=1.0) == NextBatch((0, 3, 1, 2))
    assert next_batch([], {}, 0, 1, 1, 4, 0.0, now=1.0) is None
    with pytest.raises(ValueError, match="free_instances 0"):
        next_batch(queue, {}, 0, 0, 3, 4, 0.0, 0.0)
    with pytest.raises(ValueError, match="instances 0"):
        next_batch(queue, {}, 0, 1, 0, 4, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"background_executing 2 must be in 0\.\.1"):
        next_batch(queue, {}, 2, 2, 3, 4, 0.0, 0.0)


def test_a_short_requests_leftover_windows_stay_short():
    from tideserve.worker.batching import NextBatch, next_batch

    # Two requests of 5 windows, batches of 8: the first batch took 4 of each; their fifth
    # windows are still short (5 in all each), so they start in the foreground, not the background.
    queue = q((1, 0.0), (2, 0.0))
    assert next_batch(queue, {1: 4, 2: 4}, 0, 2, 3, 8, 0.0, now=0.0) == NextBatch((0, 1))


def test_a_long_file_is_never_starved_by_short_requests():
    from tideserve.worker.batching import NextBatch, next_batch

    # Short requests hold two of three instances and more wait; the long file (caller 1) has no
    # batch executing: the last free instance goes to it, in the background.
    queue = q((1, 0.0), (2, 0.0), (1, 0.0), (3, 0.0), (1, 0.0))
    assert next_batch(queue, {4: 1, 5: 1}, 0, 1, 3, 2, 0.0, now=0.0) == NextBatch((0, 2), background=True)
    # With one of its batches executing, short requests take the last free one.
    assert next_batch(queue, {1: 2, 4: 1}, 1, 1, 3, 2, 0.0, now=0.0) == NextBatch((1, 3))


def test_a_stretchs_part_counts_the_windows_it_still_holds():
    from tideserve.worker.batching import short_callers

    # Found in review: a stretch's part (up to 75 s, decoded one window after another) counted
    # as one window, so a file of 8 stretches (about 10 minutes) passed for a short caller and
    # ran in the foreground beside short requests. Three parts of three windows each: 9 > 8.
    stretches = [QueuedItem(1, 0.0, windows=3)] * 3
    assert short_callers([*stretches, QueuedItem(2, 0.0)], {}, 8) == {2}
    assert short_callers([QueuedItem(1, 0.0, windows=3)] * 2, {1: 2}, 8) == {1}  # 6 + 2 executing


def test_a_long_files_windows_are_divided_over_the_lanes_free_instances():
    from tideserve.worker.batching import NextBatch, next_batch

    # Six stretches of a 7-minute file, batches of 8, three instances (the lane may take two):
    # one batch of six would run on one lane worker (one thread: worker.cores.lane_threads),
    # so on one core; 3 and 3 run on two.
    six = [QueuedItem(1, 0.0, 3) for _ in range(6)]  # a stretch's part: three windows
    assert next_batch(six, {}, 0, 3, 3, 8, 0.0, now=0.0) == NextBatch((0, 1, 2), background=True)
    assert next_batch(six[3:], {1: 3}, 1, 2, 3, 8, 0.0, now=0.0) == NextBatch((0, 1, 2), background=True)
    # More than two batches' worth: full batches, as before; one lane instance left: all it may take.
    twenty = [QueuedItem(1, 0.0, 3) for _ in range(20)]
    assert next_batch(twenty, {}, 0, 3, 3, 8, 0.0, now=0.0).take == tuple(range(8))
    assert next_batch(six, {1: 8}, 1, 2, 3, 8, 0.0, now=0.0) == NextBatch(tuple(range(6)), background=True)
    # Nine instances (8 cores): 20 windows over the lane's 8 free instances, 3 a batch.
    assert next_batch(twenty, {}, 0, 9, 9, 8, 0.0, now=0.0).take == (0, 1, 2)


def test_a_streamed_long_files_windows_are_divided_in_two_rounds_so_its_first_delta_comes_early():
    from tideserve.worker.batching import LANE_ROUNDS, next_batch

    # A streamed 7-minute file decoded window by window: 16 windows, batches of 8, two lane
    # instances. Not streamed: 8 and 8 (full batches, the fastest whole answer). Streamed: 4 a
    # batch (LANE_ROUNDS 2), so its first windows are done after about half the time (its first
    # delta at 0.34-0.40 of the whole answer's time, against 0.81-0.88 in batches of 8).
    assert LANE_ROUNDS == 2
    plain = [QueuedItem(1, 0.0) for _ in range(16)]
    streamed = [QueuedItem(1, 0.0, streamed=True) for _ in range(16)]
    assert next_batch(plain, {}, 0, 3, 3, 8, 0.0, now=0.0).take == tuple(range(8))
    assert next_batch(streamed, {}, 0, 3, 3, 8, 0.0, now=0.0).take == (0, 1, 2, 3)
    assert next_batch(streamed[4:], {1: 4}, 1, 2, 3, 8, 0.0, now=0.0).take == (0, 1, 2, 3, 4, 5)  # one lane left
    # Beside a plain long file, a streamed one divides the lane's batches too (they are cut
    # round-robin over both): 28 windows in two rounds over two instances, 7 a batch.
    both = [QueuedItem(1, 0.0) for _ in range(16)] + [QueuedItem(2, 0.0, streamed=True) for _ in range(12)]
    assert next_batch(both, {}, 0, 3, 3, 8, 0.0, now=0.0).take == (0, 16, 1, 17, 2, 18, 3)

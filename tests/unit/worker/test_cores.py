"""Cores a replica may use: affinity, lowered to the cgroup v2 CPU quota (a pod's CPU limit)."""

from __future__ import annotations

import math
import os

from threadpoolctl import threadpool_limits

from tideserve.worker.cores import blas_threads, lane_threads, one_blas_thread, usable_cores
from tideserve.worker.engine import default_instances


def test_the_cgroup_quota_lowers_the_count(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")  # 1.5 CPUs: two cores may run at once
    assert usable_cores(f) == min(affinity, math.ceil(1.5))
    f.write_text("max 100000\n")
    assert usable_cores(f) == affinity
    f.write_text("garbage\n")
    assert usable_cores(f) == affinity
    assert usable_cores(tmp_path / "absent") == affinity
    f.write_text("1000 100000\n")  # a hundredth of a CPU still gets one
    assert usable_cores(f) == 1


def test_default_instances_is_a_core_each_plus_one_kept_for_newcomers():
    assert [default_instances(n) for n in (1, 2, 4, 8, 64)] == [2, 3, 5, 9, 9]


def test_a_background_lanes_instances_share_the_cores_its_batches_run_on_at_once():
    # (cores, instances) -> threads: instances - 1 lane batches run at once; at most 4, at least 1.
    cases = {(2, 3): 1, (8, 9): 1, (4, 3): 2, (16, 3): 4, (2, 2): 2, (1, 2): 1, (3, 3): 1}
    assert {k: lane_threads(*k) for k in cases} == cases


def test_default_prep_processes_a_quarter_of_the_cores_on_cpu_three_quarters_on_a_gpu():
    from tideserve.worker.prep import default_processes

    assert [default_processes(n) for n in (1, 2, 8, 16, 64)] == [1, 1, 2, 4, 8]
    assert [default_processes(n, gpu=True) for n in (1, 2, 8, 16, 64)] == [1, 1, 6, 12, 16]


def test_a_lowered_thread_is_set_to_the_process_value_plus_nice_once():
    import os
    import threading

    from tideserve.worker.cores import lower_thread_priority, on_lowered_thread

    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    seen: list[int] = []

    def lowered_twice() -> None:
        seen.append(lower_thread_priority(3))
        seen.append(lower_thread_priority(3))  # not 6: the target is the process's value + 3
        # A thread made by a lowered thread with the same nice (as the background lane's model,
        # loaded from a lowered instance thread): still + 3, not + 6.
        seen.append(on_lowered_thread(3, lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        seen.append(lower_thread_priority(0))  # never raised back: it stays where it is

    t = threading.Thread(target=lowered_twice)
    t.start()
    t.join()
    assert seen == [min(19, base + 3)] * 4
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # this thread untouched


def test_what_a_lowered_thread_raises_is_raised_to_the_caller():
    import pytest

    from tideserve.worker.cores import on_lowered_thread

    with pytest.raises(ZeroDivisionError):
        on_lowered_thread(1, lambda: 1 / 0)


def test_one_blas_thread_holds_numpys_blas_to_one_thread_and_says_how_many_it_had() -> None:
    import numpy  # noqa: F401  (its BLAS is the library held)

    with threadpool_limits(2, user_api="blas"):  # restored after the test
        assert blas_threads() == 2
        assert one_blas_thread() == 2
        assert blas_threads() == 1

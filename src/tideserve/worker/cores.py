"""How many CPU cores this process may use: the CPUs it may run on (its affinity), lowered to
the cgroup v2 CPU quota when one is set (``cpu.max``: a Kubernetes CPU limit of 2 on a 64-core
node gives 2, where ``os.cpu_count()`` says 64). Sizes the prep processes, the model instances
and their intra-op threads, so a replica in a small pod does not start a big machine's threads.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may use, >= 1: ``len(sched_getaffinity)`` (or ``cpu_count``), at most
    ceil(quota / period) from ``cpu_max`` (the file holds "<quota> <period>" in microseconds, or
    "max <period>" without a limit; cgroup v2, kernel docs "Control Group v2", CPU interface
    files). An unreadable or malformed file means no limit."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def intra_op_threads(cores: int) -> int:
    """Intra-op threads of one CPU model instance on ``cores`` cores: all of them, at most 4
    (CTranslate2's own default of 4, lowered so a small replica does not oversubscribe)."""
    return max(1, min(4, cores))


def lane_threads(cores: int, instances: int) -> int:
    """Intra-op threads of each model instance of a background lane on ``cores`` cores, whose
    ``instances`` - 1 batches may run at once (``worker.batching.next_batch``): the cores divided
    among them, at least 1, at most ``intra_op_threads``' 4."""
    return intra_op_threads(max(1, cores // max(1, instances - 1)))


def blas_threads() -> int:
    """The most threads a BLAS library loaded in this process has (numpy's OpenBLAS; threadpoolctl
    reads them), 1 when none is loaded."""
    from threadpoolctl import threadpool_info

    return max((int(lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas"), default=1)


def one_blas_thread() -> int:
    """Hold numpy's BLAS (OpenBLAS in numpy's wheels) in this process to one thread, through
    threadpoolctl, and return ``blas_threads`` as it was before. For a process whose model
    instances already fill its cores (the faster-whisper backend's lanes): each window's log-mel
    features end in one BLAS matrix product (faster-whisper's ``mel_filters @ magnitudes``), and
    with a BLAS thread per core that product ran on both cores of a 2-core machine beside the
    other lane's decode. On bench/accuracy.py's 20-minute file the 52 windows' features took 0.3 s
    of the lanes' time instead of 0.7 s, and the file 4-8% less wall time (medians over rounds
    taken in turns: 0.96 of six in an ad hoc run, 0.918 of five in ``bench/longfile_speed.py
    --blas-threads 1,0``; bench/results/longfile_speed.txt). Whatever the instances: one instance
    runs on every core too (``intra_op_threads``). Process-wide where numpy's OpenBLAS uses
    pthreads (numpy's PyPI wheels; an OpenMP build would limit only the calling thread). Call it
    from the thread that sets BLAS limits later (the main thread): threadpoolctl 3.8 lets only that
    thread change a pthreads OpenBLAS's threads while it lives."""
    from threadpoolctl import threadpool_limits

    before = blas_threads()
    threadpool_limits(1, user_api="blas")
    return before


def lower_thread_priority(nice: int) -> int:
    """Set the calling thread's nice value to the process's (its main thread's) plus ``nice``,
    at most 19, unless it is already that low or lower, and return the thread's value. The
    target is absolute, so a thread made by an already lowered thread is not lowered twice. On
    Linux the nice value is a property of each thread (setpriority(2), "BUGS": a thread's own id
    as ``who``), and threads a thread creates start with its value, so a model's worker threads
    made from a lowered thread run lowered too. An unprivileged process can raise its threads'
    nice values but never lower them again, so a lowered thread stays lowered. Where the OS has
    no per-thread value or refuses, nothing changes and 0 is returned (not the thread's value)."""
    import threading

    tid = threading.get_native_id()
    try:
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + max(0, nice))
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, AttributeError):
        return 0


def on_lowered_thread(nice: int, make):
    """``make()`` called on a new thread whose nice value is the process's plus ``nice``
    (``lower_thread_priority``); its return value, or the exception it raised, re-raised here.
    For a library that starts its worker threads when constructed (CTranslate2)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="lowered-priority-init", initializer=lower_thread_priority,
                            initargs=(nice,)) as one:
        return one.submit(make).result()

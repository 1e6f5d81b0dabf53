"""A worker killed with SIGKILL leaves no prep process and no fork server behind (they used to
stay forever: a prep process holds both ends of its own task queue and is the fork server's
child, so nothing told it the worker was gone)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap

OWNER = textwrap.dedent("""
    import os, sys, time
    from tideserve.worker.prep import PrepPool
    pool = PrepPool(2)
    pool.start()
    deadline = time.monotonic() + 60
    while len(pool.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    preps = pool.pids()
    server = int(open(f"/proc/{preps[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    print(" ".join(map(str, [server, *preps])), flush=True)
    time.sleep(600)
""")


def _exits_within(pid: int, timeout_s: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_prep_processes_and_their_fork_server_end_with_a_killed_owner():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        server, *preps = map(int, owner.stdout.readline().split())
        assert len(preps) == 2 and server != owner.pid
        for pid in (server, *preps):
            assert not _exits_within(pid, 0), f"{pid} is not running before the owner dies"
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        for pid in preps:  # the pidfd wakes the watcher at once; 10 s is only a bound
            assert _exits_within(pid, 10), f"prep process {pid} outlived its killed owner"
        assert _exits_within(server, 10), f"fork server {server} outlived its killed owner and its children"
    finally:
        if owner.poll() is None:
            owner.kill()

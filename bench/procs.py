"""Process helpers the benchmarks share: CPU seconds from /proc, and stopping a server.

Linux only (/proc). Used by gpu_e2e, front_cpu, fairness, memory_budget and cpu_serving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from /proc/PID/stat. Raises OSError
    when the process is gone."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the task ended meanwhile
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def process_tree_cpu(root_pid: int) -> dict[int, tuple[str, float]]:
    """``pid -> (command line, CPU seconds)`` for ``root_pid`` and its descendants."""
    out, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        try:
            cpu = proc_cpu_s(pid)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        out[pid] = (cmd, cpu)
        todo += _children(pid)
    return out


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> None:
    """Ask ``proc`` to stop with ``sig`` (a server drains and exits), killing it after ``timeout_s``."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()

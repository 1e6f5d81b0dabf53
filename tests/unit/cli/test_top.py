"""``tideserve top`` (cli.top.run_top) writing to a pipe or file: each frame once, the output ending
with a newline (found by adversarial testing: ``top --iterations 1 | cat`` ended mid-line)."""

from __future__ import annotations

import io

from rich.console import Console

from tideserve.cli.top import run_top

STATUS = {"endpoint": "whisper", "model": "whisper-tiny.en", "gateway": {"pending": 0, "in_flight": 0},
          "pools": [{"name": "cpu", "target": "cpu-x86_64-int8", "state": "ready", "reason": "", "ready": 1,
                     "desired": 1, "replicas": [{"id": "cpu-0", "state": "ready", "outstanding": 0, "restarts": 0,
                                                 "uptime_s": 5}]}],
          "last_decision": None}


def test_top_to_a_pipe_ends_with_a_newline():
    buf = io.StringIO()
    run_top(lambda: (STATUS, ""), 0.01, 1, Console(file=buf, width=120))
    out = buf.getvalue()
    assert out.endswith("┘\n") and out.count("cpu-0") == 1

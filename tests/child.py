"""A Python child process for a check that needs its own process environment (Triton's
interpreter, CTranslate2's kernel choice: both read once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def child_json(args: list[str], env: dict[str, str], timeout_s: float = 240) -> dict:
    """Run ``python <args>`` with ``env`` over this process's environment; the child prints one
    JSON object on its last line of output, returned here. AssertionError (with the end of its
    stderr) when it fails; subprocess.TimeoutExpired past ``timeout_s``."""
    out = subprocess.run([sys.executable, *args], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])

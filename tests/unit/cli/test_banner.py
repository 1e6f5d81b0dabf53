"""The start-up banner's example commands name the CLI the way the user's shell can run it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tideserve.cli.serve import cli_command


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_the_banner_names_the_cli_by_the_path_make_run_started(tmp_path, monkeypatch):
    # Found by a new user's try: `make run` starts .venv/bin/tideserve, and the banner said
    # `tideserve invoke ...`, which a shell without the virtualenv activated does not find. Then
    # an adversarial helper's: a relative path fails from another folder (make -C), and
    # `python -m tideserve` printed a bare `tideserve` that was not on PATH.
    exe = _script(tmp_path / ".venv" / "bin" / "tideserve")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert cli_command(str(exe)) == str(exe)  # absolute: it runs from any folder
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin")  # the virtualenv activated: the bare name runs it
    assert cli_command(str(exe)) == "tideserve"
    python = tmp_path / ".venv" / "bin" / "python"
    assert cli_command("/usr/lib/python3/tideserve/__main__.py", str(python)) == f"{python} -m tideserve"
    assert os.path.isabs(cli_command("serve-it", "bin/python").split()[0])

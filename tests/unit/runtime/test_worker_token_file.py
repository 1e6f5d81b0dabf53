"""The workers' token file: made once (mode 0600), then read back; an empty one is an error."""

from __future__ import annotations

import stat

import pytest

from tideserve.files import read_or_create_secret
from tideserve.spec import LocalConfig


def test_a_missing_token_file_is_created_owner_only_and_then_reused(tmp_path):
    path = tmp_path / "state" / "worker-token"
    made = iter(["first", "second"])
    assert read_or_create_secret(path, lambda: next(made)) == "first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_or_create_secret(path, lambda: next(made)) == "first"  # kept: Prometheus's copy stays valid


def test_an_empty_token_file_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "worker-token"
    path.write_text("\n")
    with pytest.raises(ValueError, match="is empty; delete it"):
        read_or_create_secret(path, lambda: "x")


def test_the_token_file_defaults_to_the_cache_directory(tmp_path):
    assert LocalConfig(cache_dir=tmp_path).worker_token_path == tmp_path / "worker-token"
    assert LocalConfig(cache_dir=tmp_path, worker_token_file=tmp_path / "t").worker_token_path == tmp_path / "t"

"""hf:// from a Hugging Face cache built by hand in the standard layout, offline (no network)."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from tideserve.errors import SourceError
from tideserve.sources import SourceNetworkError, SourceNotFoundError, resolve_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"d_model": 384}', "model.bin": os.urandom(2048), "vocabulary.txt": b"a\nb\n"}


def populate(hub: Path, repo_id: str, commit: str, files: dict[str, bytes], ref: str = "main") -> Path:
    """``models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>,
    refs/<ref>}``, the layout huggingface_hub writes (docs: "Understand caching")."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, body in files.items():
        blob = repo / "blobs" / hashlib.sha256(body).hexdigest()
        blob.write_bytes(body)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with socket.socket() as s:  # should anything try the network, it gets a closed local port
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    return hub


def test_hf_resolves_branch_commit_and_default_revision_offline(hub):
    snapshot = populate(hub, "acme/tiny-whisper", COMMIT, FILES)
    for uri in ("hf://acme/tiny-whisper@main", f"hf://acme/tiny-whisper@{COMMIT}", "hf://acme/tiny-whisper"):
        path = resolve_source(uri)
        assert Path(path) == snapshot
        assert {p.name: p.read_bytes() for p in Path(path).iterdir()} == FILES


def test_hf_commit_revision_needs_no_network_even_when_online(hub, monkeypatch):
    snapshot = populate(hub, "acme/tiny-whisper", COMMIT, FILES)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert resolve_source(f"hf://acme/tiny-whisper@{COMMIT}") == snapshot


def test_hf_missing_repo_or_revision_offline_is_a_clear_error(hub):
    populate(hub, "acme/tiny-whisper", COMMIT, FILES)
    with pytest.raises(SourceNotFoundError, match=r"not \(completely\) in the Hugging Face cache .*HF_HUB_OFFLINE"):
        resolve_source("hf://acme/no-such-model@main")
    with pytest.raises(SourceNotFoundError, match="revision 'v9' of acme/tiny-whisper"):
        resolve_source("hf://acme/tiny-whisper@v9")


def test_hf_hub_unreachable_and_not_cached_is_a_network_error(hub, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; an earlier test may have had it set
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(SourceNetworkError, match=r"cannot reach the Hub \(http://127.0.0.1:\d+\)"):
        resolve_source("hf://acme/no-such-model@main")


def test_hf_malformed_uri(hub):
    with pytest.raises(SourceError, match="the repo is missing"):
        resolve_source("hf://@main")
    with pytest.raises(SourceError, match="not a valid Hugging Face repo id"):
        resolve_source("hf://a/b/c/d@main")

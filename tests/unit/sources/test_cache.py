import hashlib
import json
import re
import threading
import time

import pytest

from tideserve.sources import SourceIntegrityError, default_cache_dir
from tideserve.sources.cache import MANIFEST_NAME, ModelCache, cache_key, parse_sha256sums, receive, safe_relpath


def test_parse_sha256sums_accepts_sha256sum_output_and_rejects_the_rest():
    h = "ab" * 32
    text = f"# made by sha256sum\n{h}  model.bin\n{h.upper()} *./sub/vocab.txt\n\n"
    assert parse_sha256sums(text, "x") == {"model.bin": h, "sub/vocab.txt": h}
    with pytest.raises(SourceIntegrityError, match="line 1 is not"):
        parse_sha256sums("deadbeef  model.bin\n", "x")
    with pytest.raises(SourceIntegrityError, match=re.escape("refusing file name '../etc/passwd'")):
        parse_sha256sums(f"{h}  ../etc/passwd\n", "x")


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "a//b", "./a", ".."])
def test_safe_relpath_refuses_escapes(bad):
    with pytest.raises(SourceIntegrityError):
        safe_relpath(bad, "s3://b/k")


def test_cache_key_is_stable_and_order_sensitive():
    a = cache_key({"source": "s3://b/m", "objects": [["x", 1, "e1"]]})
    assert a == cache_key({"objects": [["x", 1, "e1"]], "source": "s3://b/m"}) and len(a) == 32
    assert a != cache_key({"source": "s3://b/m", "objects": [["x", 1, "e2"]]})


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tideserve"


def _fill_ok(tmp):
    return [receive(tmp, "a/b.bin", [b"abc", b"def"])]


def test_fetch_publishes_with_manifest_then_hits(tmp_path):
    cache = ModelCache(tmp_path)
    path, hit = cache.fetch("k1", "s3://b/m", _fill_ok)
    assert not hit and (path / "a" / "b.bin").read_bytes() == b"abcdef"
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["files"] == [{"path": "a/b.bin", "size_bytes": 6, "sha256": hashlib.sha256(b"abcdef").hexdigest()}]
    assert cache.fetch("k1", "s3://b/m", lambda tmp: pytest.fail("must not refetch")) == (path, True)


def test_failed_or_inconsistent_fill_publishes_nothing(tmp_path):
    cache = ModelCache(tmp_path)

    def boom(tmp):
        receive(tmp, "half.bin", [b"x" * 10])
        raise OSError("disk full")

    def lies_about_size(tmp):
        r = receive(tmp, "m.bin", [b"12345"])
        return [type(r)(r.path, 999, r.sha256)]

    def leaves_extra(tmp):
        (tmp / "stray").write_text("?")
        return _fill_ok(tmp)

    with pytest.raises(OSError, match="disk full"):
        cache.fetch("k", "u", boom)
    with pytest.raises(SourceIntegrityError, match="has 5 bytes on disk, expected 999"):
        cache.fetch("k", "u", lies_about_size)
    with pytest.raises(SourceIntegrityError, match=r"unexpected files.*stray"):
        cache.fetch("k", "u", leaves_extra)
    assert cache.published("k") is None and list((tmp_path / "models" / ".tmp").iterdir()) == []


def test_stale_temporary_directory_is_removed_by_the_next_fetch(tmp_path):
    stale = tmp_path / "models" / ".tmp" / "k.crashed"
    stale.mkdir(parents=True)
    (stale / "partial.bin").write_bytes(b"x")
    ModelCache(tmp_path).fetch("k", "u", _fill_ok)
    assert not stale.exists()


def test_concurrent_fetchers_fill_once(tmp_path):
    calls = []

    def slow_fill(tmp):
        calls.append(1)
        time.sleep(0.2)
        return _fill_ok(tmp)

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(ModelCache(tmp_path).fetch("k", "u", slow_fill)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({p for p, _ in results}) == 1 and sorted(h for _, h in results) == [False, True, True, True]

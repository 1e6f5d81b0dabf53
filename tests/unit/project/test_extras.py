"""Optional extras: tideserve.extras agrees with pyproject.toml, and a feature whose extra is
missing fails with an error naming the extra (the library is hidden from the import system)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tideserve.errors import MissingExtraError
from tideserve.extras import EXTRAS, needs_extra, require
from distributions import IMPORT_NAME

REPO = Path(__file__).resolve().parents[3]
OPTIONAL = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``import NAME`` (and of its submodules) raise ModuleNotFoundError, as without the
    library; tideserve modules that imported it already are forgotten too."""
    for mod in list(sys.modules):
        if mod.split(".")[0] in names or mod.startswith(("tideserve.sources.s3", "tideserve.sources.hf",
                                                         "tideserve.sim.plots", "tideserve.worker.backends.torch")):
            monkeypatch.delitem(sys.modules, mod)
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def test_extras_module_lists_the_libraries_of_each_extra_in_pyproject():
    for extra, libs in EXTRAS.items():
        dists = [re.split(r"[<>=]", r, maxsplit=1)[0] for r in OPTIONAL[extra]]
        assert tuple(IMPORT_NAME[d] for d in dists if d != "botocore") == tuple(x for x in libs if x != "botocore")
    assert set(OPTIONAL) == set(EXTRAS) | {"all", "test"}
    assert OPTIONAL["all"] == [f"tideserve[{','.join(EXTRAS)}]"]


def test_a_missing_library_of_an_extra_becomes_an_error_naming_the_extra(monkeypatch):
    _hide(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtraError) as info, needs_extra("sim", "the plots"):
        import matplotlib  # noqa: F401
    assert info.value.extra == "sim"
    assert str(info.value) == ("the plots need the 'sim' extra (matplotlib is not installed); install it with "
                               "pip install 'tideserve[sim]' (or 'tideserve[all]')")


def test_an_unrelated_missing_module_is_not_blamed_on_the_extra():
    with pytest.raises(ModuleNotFoundError) as info, needs_extra("sim", "the plots"):
        import tideserve_no_such_module  # noqa: F401
    assert info.value.name == "tideserve_no_such_module"


def test_s3_source_without_boto3_names_the_s3_extra(monkeypatch, tmp_path):
    from tideserve.sources import resolve_source

    _hide(monkeypatch, "boto3", "botocore")
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'tideserve[s3]'")) as info:
        resolve_source("s3://bucket/models/tiny", cache_dir=tmp_path)
    assert info.value.extra == "s3"
    assert "s3:// model sources" in str(info.value)


def test_hf_source_without_huggingface_hub_names_the_hf_extra(monkeypatch, tmp_path):
    from tideserve.sources import resolve_source

    _hide(monkeypatch, "huggingface_hub")
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'tideserve[hf]'")):
        resolve_source("hf://openai/whisper-tiny.en", cache_dir=tmp_path)


def test_torch_backend_without_torch_names_the_gpu_extra(monkeypatch):
    from tideserve.worker.backends import backend_class

    _hide(monkeypatch, "torch")
    with pytest.raises(MissingExtraError, match=re.escape("model.backend 'torch' workers need the 'gpu' extra")):
        backend_class("torch")


def test_require_finds_a_missing_library_without_importing(monkeypatch):
    _hide(monkeypatch, "kopf")
    with pytest.raises(MissingExtraError, match="'k8s' extra"):
        require("k8s", "tideserve operator")
    monkeypatch.setitem(EXTRAS, "stdlib", ("json", "sqlite3"))
    require("stdlib", "a feature")  # both present: no error


def test_operator_command_without_the_k8s_extra_exits_78_naming_it(monkeypatch):
    from tideserve.cli.main import app

    _hide(monkeypatch, "kopf")
    result = CliRunner().invoke(app, ["operator", "--all-namespaces"])
    assert result.exit_code == 78
    assert "pip install 'tideserve[k8s]'" in result.output

"""The import contracts in pyproject.toml cover the whole package: a module or package added
under src/tideserve must be placed in a layer, and every third-party distribution the package
depends on has a contract naming its adapter."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from distributions import IMPORT_NAME

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "src" / "tideserve"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]


def _top_level_names() -> set[str]:
    names = set()
    for p in PACKAGE.iterdir():
        if p.name.startswith(("_", ".")):
            continue
        if p.is_dir() and (p / "__init__.py").exists():
            names.add(p.name)
        elif p.suffix == ".py":
            names.add(p.stem)
    return names


def _layered_names() -> set[str]:
    (layers,) = [c for c in CONTRACTS if c["type"] == "layers"]
    assert layers["containers"] == ["tideserve"]
    return {name.strip() for layer in layers["layers"] for name in re.split(r"[|:]", layer)}


def test_every_module_of_the_package_is_in_a_layer():
    assert _top_level_names() - _layered_names() == set()


def test_the_layers_name_no_module_that_does_not_exist():
    assert _layered_names() - _top_level_names() == set()


def _distributions() -> set[str]:
    deps = list(PYPROJECT["project"]["dependencies"])
    for extra, reqs in PYPROJECT["project"].get("optional-dependencies", {}).items():
        if extra != "test":
            deps += [r for r in reqs if not r.startswith("tideserve")]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}


def test_every_runtime_dependency_has_a_protected_contract():
    protected = {m for c in CONTRACTS if c["type"] == "protected" for m in c["protected_modules"]}
    dists = _distributions()
    assert dists - IMPORT_NAME.keys() == set(), "add the new dependency's import name to IMPORT_NAME"
    missing = {IMPORT_NAME[d] for d in dists if IMPORT_NAME[d] is not None} - protected
    assert missing == set()

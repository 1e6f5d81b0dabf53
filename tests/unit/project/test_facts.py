"""docs/facts.md agrees with the code: every row that names a code symbol holds the value the code has.

Convention (docs/facts.md, "How to read this file"): a fact table has the header
``| fact | value | code | source | status |``. ``code`` is ```module:PATH``` or ``—`` (a fact the code
only cites in prose); ``value`` is the exact Python literal in backticks. PATH is a name followed by
accessors: ``.attr`` (for a pydantic model or a dataclass class, the field's default), ``[literal]``
(a dict entry or an index), ``[attr=literal]`` (the one item of a sequence whose ``attr`` equals the
literal), ``(param)`` (a parameter's default) and ``{a,b}`` (a tuple of attributes).

Modules that import a heavy library themselves (torch, grpc, kopf...) are read with ``ast`` instead of being
imported, so that the pure unit tier stays pure; only ``NAME``, ``Class.field`` and
``func(param)`` / ``Class.method(param)`` with literal values are supported there.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[3]
FACTS = REPO / "docs" / "facts.md"
HEADER = ["fact", "value", "code", "source", "status"]
STATUSES = {"verified", "secondary", "derived", "estimate", "assumption", "unverified"}
#: Top-level imports that make a module unfit to import in the pure unit tier.
STATIC_IF_IMPORTS = {"torch", "grpc", "av", "faster_whisper", "ctranslate2", "boto3", "huggingface_hub", "kopf",
                     "kubernetes", "matplotlib"}
_ACCESSOR = re.compile(r"\.(\w+)|\[([^\]]*)\]|\((\w+)\)|\{([\w,]+)\}")
_TICKED = re.compile(r"^`(.+)`$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def fact_rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, [fact, value, code, source, status]) of every row of every fact table."""
    rows, in_table = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells == HEADER:
            in_table = True
        elif in_table and not set("".join(cells)) <= set("-: "):
            rows.append((n, cells))
    return rows


def _literal(text: str) -> Any:
    return ast.literal_eval(text.strip())


def _field_default(cls: type, name: str) -> Any:
    if isinstance(cls, type) and issubclass(cls, BaseModel) and name in cls.model_fields:
        f = cls.model_fields[name]
        return f.default_factory() if f.default_factory is not None else f.default
    if dataclasses.is_dataclass(cls) and isinstance(cls, type):
        for f in dataclasses.fields(cls):
            if f.name == name:
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
                return f.default
    return getattr(cls, name)


def _param_default(fn: Any, name: str) -> Any:
    p = inspect.signature(fn).parameters[name]
    assert p.default is not inspect.Parameter.empty, f"parameter {name} of {fn} has no default"
    return p.default


def _select(items: Any, spec: str) -> Any:
    attr, _, want = spec.partition("=")
    hits = [i for i in items if getattr(i, attr.strip()) == _literal(want)]
    assert len(hits) == 1, f"[{spec}] matches {len(hits)} items, not one"
    return hits[0]


def _static(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"no module {module}"
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] in STATIC_IF_IMPORTS for n in names):
            return True
    return False


def _static_value(module: str, path: str) -> Any:
    """NAME, Class.field, func(param) or Class.method(param), read from the source with ast."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    m = re.fullmatch(r"(\w+)(?:\.(\w+))?(?:\((\w+)\))?", path)
    assert m, f"{path!r}: only NAME, Class.field and func(param) can be read without importing {module}"
    name, member, param = m.groups()
    scope: list[ast.stmt] = tree.body
    if member is not None:
        cls = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == name), None)
        assert cls is not None, f"no class {name} in {module}"
        scope, name = cls.body, member
    if param is not None:
        fn = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name), None)
        assert fn is not None, f"no function {name} in {module}"
        args = fn.args.posonlyargs + fn.args.args
        pairs = list(zip(args[len(args) - len(fn.args.defaults):], fn.args.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None]
        for a, d in pairs:
            if a.arg == param:
                return ast.literal_eval(d)
        raise AssertionError(f"no parameter {param} with a default in {module}:{path}")
    for node in scope:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return ast.literal_eval(node.value)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no literal {name} in {module}")


def resolve(ref: str) -> Any:
    """The value ``module:PATH`` names (module docstring)."""
    module, sep, path = ref.partition(":")
    assert sep and path, f"{ref!r} is not module:PATH"
    if _static(module):
        return _static_value(module, path)
    head = re.match(r"\w+", path)
    assert head, f"{ref!r}: PATH must start with a name"
    value: Any = getattr(importlib.import_module(module), head.group())
    rest = path[head.end():]
    while rest:
        m = _ACCESSOR.match(rest)
        assert m, f"{ref!r}: cannot read accessor at {rest!r}"
        attr, sub, param, group = m.groups()
        if attr is not None:
            value = _field_default(value, attr) if isinstance(value, type) else getattr(value, attr)
        elif sub is not None:
            value = _select(value, sub) if re.match(r"\s*\w+\s*=", sub) else value[_literal(sub)]
        elif param is not None:
            value = _param_default(value, param)
        else:
            value = tuple(getattr(value, a) for a in group.split(","))
        rest = rest[m.end():]
    return value


ROWS = fact_rows(FACTS.read_text())
CODE_ROWS = [(n, c) for n, c in ROWS if _TICKED.match(c[2])]


def test_the_file_has_fact_tables() -> None:
    # A broken header or table would silently make every check below vacuous.
    assert len(ROWS) >= 80, f"docs/facts.md has only {len(ROWS)} fact rows"
    assert len(CODE_ROWS) >= 70, f"docs/facts.md has only {len(CODE_ROWS)} rows naming code"


@pytest.mark.parametrize(("line", "cells"), ROWS, ids=[f"line{n}" for n, _ in ROWS])
def test_every_row_is_well_formed(line: int, cells: list[str]) -> None:
    assert len(cells) == len(HEADER), f"line {line}: {len(cells)} cells, expected {len(HEADER)}"
    fact, value, code, source, status = cells
    assert fact and source, f"line {line}: a fact needs a description and a source"
    assert status in STATUSES, f"line {line}: status {status!r} is not one of {sorted(STATUSES)}"
    assert code == "—" or _TICKED.match(code), f"line {line}: code must be `module:PATH` or —"
    if _TICKED.match(code):
        m = _TICKED.match(value)
        assert m, f"line {line}: a row naming code needs its value as a `Python literal`"
        _literal(m.group(1))


@pytest.mark.parametrize(("line", "cells"), CODE_ROWS, ids=[f"line{n}:{c[2].strip('`')}" for n, c in CODE_ROWS])
def test_the_code_holds_the_documented_value(line: int, cells: list[str]) -> None:
    expected = _literal(_TICKED.match(cells[1]).group(1))
    actual = resolve(_TICKED.match(cells[2]).group(1))
    assert type(actual) is type(expected) and actual == expected, (
        f"docs/facts.md line {line}: {cells[2]} is {actual!r} in the code but {expected!r} in the doc; "
        "if the figure changed on purpose, update docs/facts.md (value and source) in the same commit")


def test_resolver_reads_each_accessor_form() -> None:
    """The path forms the doc may use, on known values (so a resolver bug cannot hide drift)."""
    assert resolve("tideserve.provisioner.catalog:SpotMarket.discount") == 0.6  # dataclass field default
    assert resolve("tideserve.spec.models:Decoding.beam_size") == 5  # pydantic field default
    assert resolve("tideserve.spec.models:GPU_COMPUTE_CAPABILITY['l4']") == "sm89"
    assert resolve("tideserve.provisioner.catalog:AWS_US_EAST_1[instance_type='g5.xlarge']{accelerator,vcpus}") == (
        "a10g", 4)
    assert resolve("tideserve.worker.windows:split_windows(sample_rate)") == 16_000
    assert _static("tideserve.worker.backends.torch_whisper.features")
    assert not _static("tideserve.spec.models")
    with pytest.raises(AssertionError):
        resolve("tideserve.provisioner.catalog:AWS_US_EAST_1[instance_type='no-such']")

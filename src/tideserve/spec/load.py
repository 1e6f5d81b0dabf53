"""Load ``InferenceEndpoint`` and local-config YAML into the pydantic models.

Errors are a :class:`~tideserve.errors.SpecError` whose problems name the field path
(``spec.pools[0].replicas.min``), the YAML line, and a hint (e.g. the field you probably
meant when a name is misspelt).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tideserve.errors import SpecError
from tideserve.spec.local import LocalConfig
from tideserve.spec.models import InferenceEndpoint

M = TypeVar("M", bound=BaseModel)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _yaml_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the key at ``loc``; for a missing field, of its deepest existing parent."""
    node, line = root, None
    for part in loc:
        found = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for k, v in node.value:
                if getattr(k, "value", None) == part:
                    found, line = v, k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            found = node.value[part]
            line = found.start_mark.line + 1
        if found is None:
            break
        node = found
    return line


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc[:-1]`` (for 'did you mean')."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part) or next(
            (f for f in current.model_fields.values() if f.alias == part), None
        )
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current if isinstance(current, type) else None


def _problems(err: ValidationError, model: type[BaseModel], root: yaml.Node | None) -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            known = []
            if owner is not None:
                known = [f.alias or n for n, f in owner.model_fields.items()]
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg = f"unknown field '{loc[-1]}'"
            if close:
                msg += f"; did you mean '{close[0]}'?"
            elif known:
                msg += f"; allowed here: {', '.join(known)}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        elif e["type"] in ("bool_parsing", "bool_type"):
            msg = f"{msg} (got {e.get('input')!r}); write true or false"
        line = _yaml_line(root, loc)
        path = _format_loc(loc) + (f" (line {line})" if line else "")
        problems.append((path, msg))
    return problems


def load_model_text(model: type[M], text: str, source: str = "<string>") -> M:
    """Parse YAML ``text`` into ``model``. Raises SpecError with field paths and lines."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML: {exc}") from None
    return _validate(model, {} if data is None else data, source, root)


def _validate(model: type[M], data: Any, source: str, root: yaml.Node | None) -> M:
    """``data`` (a parsed mapping) as ``model``; SpecError names each field path (and its YAML
    line when ``root`` is given)."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source} is not a valid {model.__name__}:", _problems(exc, model, root)) from None


def load_endpoint(path: str | os.PathLike[str]) -> InferenceEndpoint:
    """Load an InferenceEndpoint YAML file. Raises SpecError (missing file, YAML, fields)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read endpoint file {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{p} is not UTF-8 text; an endpoint file is YAML") from None
    return load_model_text(InferenceEndpoint, text, str(p))


def default_config_path() -> Path | None:
    env = os.environ.get("TIDESERVE_CONFIG")
    if env:
        return Path(env)
    p = Path.home() / ".config" / "tideserve" / "config.yaml"
    return p if p.exists() else None


def load_local_config(path: str | os.PathLike[str] | None = None) -> LocalConfig:
    """Load the embedded-runtime config: ``path``, else $TIDESERVE_CONFIG, else the user's
    ``~/.config/tideserve/config.yaml``, else defaults. Raises SpecError."""
    p = Path(path) if path is not None else default_config_path()
    if p is None:
        return LocalConfig()
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read config file {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{p} is not UTF-8 text; the local config is YAML") from None
    cfg = load_model_text(LocalConfig, text, str(p))
    return _resolve_paths(cfg, p.resolve().parent, str(p))


def _resolve_paths(cfg: LocalConfig, base: Path, source: str) -> LocalConfig:
    """Relative paths in a config file mean relative to that file; files it names must exist."""

    def fix(v: Path | None) -> Path | None:
        if v is None:
            return None
        v = v.expanduser()
        return v if v.is_absolute() else base / v

    cfg = cfg.model_copy(update={
        "tls_cert_file": fix(cfg.tls_cert_file), "tls_key_file": fix(cfg.tls_key_file),
        "api_keys_file": fix(cfg.api_keys_file), "run_dir": fix(cfg.run_dir), "cache_dir": fix(cfg.cache_dir),
        "allowed_file_roots": [fix(r) for r in cfg.allowed_file_roots],
    })
    problems = [
        (name, f"file {path} does not exist or is not readable (relative paths are relative to the config file)")
        for name in ("tls_cert_file", "tls_key_file", "api_keys_file")
        if (path := getattr(cfg, name)) is not None and not (path.is_file() and os.access(path, os.R_OK))
    ]
    if problems:
        raise SpecError(f"{source} is not a valid LocalConfig:", problems)
    return cfg


def endpoint_from_dict(data: Any, source: str = "<object>") -> InferenceEndpoint:
    """Validate an already-parsed InferenceEndpoint mapping (e.g. a Kubernetes object's
    ``apiVersion``, ``kind``, ``metadata.name/labels`` and ``spec``). Raises SpecError whose
    problems name the field paths (no line numbers: there is no YAML text)."""
    return _validate(InferenceEndpoint, data, source, None)

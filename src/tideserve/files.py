"""Small file helpers shared by the worker and the CLI."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one: into
    ``<path>.tmp`` first, then renamed over ``path``. Raises OSError."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_or_create_secret(path: str | os.PathLike[str], make: Callable[[], str]) -> str:
    """The secret in ``path`` (surrounding whitespace stripped); when the file does not exist,
    ``make()`` is written there first, readable by its owner only (mode 0600, created with
    O_EXCL, so two processes starting at once agree on one secret). Parent directories are
    created. Raises OSError when the file cannot be read or created, ValueError when it is empty."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(make() + "\n")
    secret = p.read_text().strip()
    if not secret:
        raise ValueError(f"{p} is empty; delete it to have a new secret made, or write one into it")
    return secret

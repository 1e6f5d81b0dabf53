"""Small file helpers shared by the worker and the CLI."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one: into
    ``<path>.tmp`` first, then renamed over ``path``. Raises OSError."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)

"""Download progress: a rich progress bar on an interactive terminal, a log line per file otherwise.

The bar goes to stderr and only when stderr is a TTY (``sys.stderr.isatty()``), so replica logs
and CI output get plain, greppable lines from the ``tideserve.sources`` logger instead.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

log = logging.getLogger("tideserve.sources")


class DownloadProgress:
    """Use as ``with DownloadProgress(uri, total_bytes, n_files) as p:`` then, per file,
    ``p.start(name, size_bytes)``, ``p.advance(n_bytes)`` per chunk and ``p.done()``."""

    def __init__(self, uri: str, total_bytes: int, n_files: int, *, tty: bool | None = None) -> None:
        self.uri = uri
        self.total_bytes = total_bytes
        self.n_files = n_files
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bar: Progress | None = None  # rich is imported only for a TTY (__enter__)
        self._task: TaskID | None = None
        self._name = ""
        self._size = 0
        self._t_file = 0.0
        self._t0 = 0.0

    def __enter__(self) -> DownloadProgress:
        self._t0 = time.monotonic()
        log.info("%s: downloading %d files, %d bytes", self.uri, self.n_files, self.total_bytes)
        if self.tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.uri, total=self.total_bytes)
        return self

    def start(self, name: str, size_bytes: int) -> None:
        self._name, self._size, self._t_file = name, size_bytes, time.monotonic()
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=f"{self.uri} {name}")

    def advance(self, n_bytes: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n_bytes)

    def done(self) -> None:
        if self._bar is not None:
            return
        dt = time.monotonic() - self._t_file
        log.info(
            "%s: fetched %s (%d bytes in %.2f s, %.1f MB/s)",
            self.uri, self._name, self._size, dt, self._size / max(dt, 1e-6) / 1e6,
        )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        if exc_type is None:
            dt = time.monotonic() - self._t0
            log.info(
                "%s: downloaded %d bytes in %.2f s (%.1f MB/s)",
                self.uri, self.total_bytes, dt, self.total_bytes / max(dt, 1e-6) / 1e6,
            )

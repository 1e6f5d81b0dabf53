"""What every ``tideserve`` command shares: the two consoles and loading an endpoint file.

Commands live in sibling modules (main, sim, bench, ...) that import this one and never each
other's internals, so the command modules form no import cycle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from tideserve.errors import MissingExtraError, SpecError
from tideserve.extras import require
from tideserve.spec import InferenceEndpoint, load_endpoint

#: Exit status of a command that cannot work with this installation or configuration
#: (sysexits.h EX_CONFIG, as the worker uses).
EX_CONFIG = 78

#: Errors and progress go to stderr.
err = Console(stderr=True, soft_wrap=True)
#: Results go to stdout; piped output is not cut to 80 columns, so tables keep every column
#: readable in logs and scripts.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def exit_missing_extra(feature: str, extra: str) -> None:
    """Exit with EX_CONFIG (78) and a one-line message if ``extra`` is not installed (see
    :func:`tideserve.extras.require`)."""
    try:
        require(extra, feature)
    except MissingExtraError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EX_CONFIG) from None


def load_or_exit(file: Path) -> InferenceEndpoint:
    """The endpoint in ``file``; on a :class:`SpecError` prints each problem (field path, line,
    hint) to stderr and exits with status 2 (usage error), as every command does."""
    try:
        return load_endpoint(file)
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, highlight=False)
        raise typer.Exit(2) from None

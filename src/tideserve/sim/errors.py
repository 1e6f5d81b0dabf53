"""The simulator's input error: a trace, profile or option that cannot be used."""

from __future__ import annotations

from tideserve.errors import BadInputError


class SimInputError(BadInputError):
    """A trace, profile or simulation option is unusable; the message names the file, the line or
    field, and how to fix it."""

    code = "bad_sim_input"

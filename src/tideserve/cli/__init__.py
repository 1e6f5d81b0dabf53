"""The ``tideserve`` command: the composition root (nothing imports it)."""

"""tideserve: one declarative inference endpoint in front of heterogeneous pools.

See README.md for the architecture; ``tideserve.cli.main`` is the composition root.
"""

__version__ = "0.1.0"

"""tideserve: one declarative inference endpoint in front of heterogeneous pools.

See README.md for the architecture; ``tideserve.cli.main`` is the composition root.
"""

#: The package version, written only here (pyproject.toml reads it; images, the Helm chart and
#: the KServe server metadata derive from it).
__version__ = "0.1.0"

"""tideserve: one declarative inference endpoint in front of heterogeneous pools.

See README.md for the architecture; ``tideserve.cli.main`` is the composition root.
"""

import os as _os

#: gRPC's fork handlers off in every tideserve process, set before anything imports grpc (a
#: user's explicit setting wins). With them on (grpcio 1.80 to at least 1.85, grpc/grpc#43055),
#: a process holding gRPC channels or a server that starts a subprocess with ``preexec_fn`` (a
#: real fork: the zygote, test endpoints) restarts gRPC's poller in the child, which then aborts
#: before ``exec`` ("Epoll1Poller encountered epoll_wait error: Bad file descriptor", SIGABRT).
#: Measured here: 4 of 200 such forks died with it on, 0 of 600 with it off
#: (tests/integration/test_grpc_fork.py). No tideserve child uses its parent's gRPC state.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

#: The package version, written only here (pyproject.toml reads it; images, the Helm chart and
#: the KServe server metadata derive from it).
__version__ = "0.1.0"

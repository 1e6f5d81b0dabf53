"""The single entry point: routing, holding while no replica can take work, limits, admin API."""

import os

# The gateway's gRPC servers (KEDA's scaler, the inference protocol) run in a process that
# starts replicas with fork+exec. gRPC's fork handlers are for children that go on using gRPC;
# here they only print "Other threads are currently calling into gRPC, skipping fork()
# handlers" at every replica start. Set before grpc is imported (its modules are in this package).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

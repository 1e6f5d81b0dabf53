"""A stand-in for KEDA: calls an external scaler through stubs generated from KEDA's own proto.

    python keda_fake.py STUBS_DIR ADDRESS

STUBS_DIR holds ``keda_externalscaler_pb2(_grpc).py``, compiled by the test from KEDA's
``externalscaler.proto`` in its Go module at the version of scripts/k8s/versions (tests/upstream.py).
This runs as its own process, as KEDA does: the
scaler's own generated modules use the same protobuf package and could not share a process's
descriptor pool with KEDA's.

Commands, one JSON object a line on stdin; answers one a line on stdout:
  {"id": 1, "call": "IsActive" | "GetMetricSpec", "metadata": {...}}
  {"id": 2, "call": "GetMetrics", "metadata": {...}, "metricName": "..."}
  {"id": 3, "call": "StreamIsActive", "metadata": {...}}   -> every pushed message as
      {"stream": 3, "result": true}, then {"stream": 3, "end": "<status code>"}
  answer: {"id": n, "result": ...} or {"id": n, "error": {"code": "NOT_FOUND", "details": "..."}}
"""

from __future__ import annotations

import json
import sys
import threading

import grpc

sys.path.insert(0, sys.argv[1])
import keda_externalscaler_pb2 as pb
import keda_externalscaler_pb2_grpc as pb_grpc

_lock = threading.Lock()


def send(obj: dict) -> None:
    with _lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def ref(cmd: dict) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="so", namespace="ml", scalerMetadata=cmd.get("metadata", {}))


def stream(stub: pb_grpc.ExternalScalerStub, cmd: dict) -> None:
    sid = cmd["id"]
    try:
        for msg in stub.StreamIsActive(ref(cmd)):
            send({"stream": sid, "result": msg.result})
        send({"stream": sid, "end": "OK"})
    except grpc.RpcError as exc:
        send({"stream": sid, "end": exc.code().name, "details": exc.details()})


def main() -> None:
    channel = grpc.insecure_channel(sys.argv[2])
    stub = pb_grpc.ExternalScalerStub(channel)
    send({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        call = cmd["call"]
        try:
            if call == "IsActive":
                result = stub.IsActive(ref(cmd), timeout=10).result
            elif call == "GetMetricSpec":
                result = [{"metricName": s.metricName, "targetSize": s.targetSize, "targetSizeFloat": s.targetSizeFloat}
                          for s in stub.GetMetricSpec(ref(cmd), timeout=10).metricSpecs]
            elif call == "GetMetrics":
                req = pb.GetMetricsRequest(scaledObjectRef=ref(cmd), metricName=cmd.get("metricName", ""))
                result = [{"metricName": v.metricName, "metricValue": v.metricValue, "metricValueFloat": v.metricValueFloat}
                          for v in stub.GetMetrics(req, timeout=10).metricValues]
            elif call == "StreamIsActive":
                threading.Thread(target=stream, args=(stub, cmd), daemon=True).start()
                result = "started"
            else:
                raise ValueError(f"unknown call {call}")
        except grpc.RpcError as exc:
            send({"id": cmd["id"], "error": {"code": exc.code().name, "details": exc.details()}})
            continue
        send({"id": cmd["id"], "result": result})


if __name__ == "__main__":
    main()

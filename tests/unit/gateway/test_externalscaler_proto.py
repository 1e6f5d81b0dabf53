"""The committed generated modules equal a fresh run of scripts/gen_proto.py, and our proto is
wire compatible with KEDA's (compared field by field with KEDA's own proto, from its Go module, at test time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from tideserve.gateway import externalscaler_pb2
from upstream import upstream_file

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ("externalscaler_pb2.py", "externalscaler_pb2.pyi", "externalscaler_pb2_grpc.py",
             "inference_pb2.py", "inference_pb2.pyi")


def test_regenerating_gives_the_committed_files(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for name in GENERATED:
        fresh = (tmp_path / "tideserve" / "gateway" / name).read_text()
        committed = (ROOT / "src" / "tideserve" / "gateway" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto` (scripts/gen_proto.py) and commit it"


def _shape(fd: descriptor_pb2.FileDescriptorProto) -> dict:
    """What travels on the wire: package, messages' fields (number, type, label, type name), methods."""
    def msg(m):
        return {
            "fields": {f.name: (f.number, f.type, f.label, f.type_name) for f in m.field},
            "nested": {n.name: msg(n) for n in m.nested_type},
            "map_entry": m.options.map_entry,
        }
    return {
        "package": fd.package,
        "messages": {m.name: msg(m) for m in fd.message_type},
        "services": {s.name: {x.name: (x.input_type, x.output_type, x.client_streaming, x.server_streaming)
                              for x in s.method} for s in fd.service},
    }


def test_wire_compatible_with_kedas_proto(tmp_path):
    keda_proto = upstream_file("keda_externalscaler.proto")  # KEDA's, from its Go module
    out = tmp_path / "keda.pb"
    code = protoc.main(["grpc_tools.protoc", f"-I{keda_proto.parent}", f"--descriptor_set_out={out}", str(keda_proto)])
    assert code == 0
    keda = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = descriptor_pb2.FileDescriptorProto()
    externalscaler_pb2.DESCRIPTOR.CopyToProto(ours)
    assert _shape(ours) == _shape(keda)
    assert set(_shape(ours)["services"]["ExternalScaler"]) == {
        "IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics", "StreamMetricSpec"}

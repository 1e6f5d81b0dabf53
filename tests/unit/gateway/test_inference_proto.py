"""tideserve's inference.proto is wire compatible with Triton's: every message and field we
define exists in the descriptors tritonclient ships (grpc_service.proto, model_config.proto)
with the same number, type, cardinality and message or enum type; the service registers
Triton's method names."""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2, service_pb2

from tideserve.gateway import grpc_server, inference_pb2


def _triton(name: str) -> Descriptor:
    for module in (service_pb2, model_config_pb2):
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise AssertionError(f"Triton has no message {name}")


def _same(ours: Descriptor, theirs: Descriptor) -> int:
    checked = 0
    for f in ours.fields:
        t = theirs.fields_by_name.get(f.name)
        assert t is not None, f"{theirs.full_name} has no field {f.name}"
        assert (f.number, f.type, f.is_repeated) == (t.number, t.type, t.is_repeated), f"{ours.full_name}.{f.name}"
        if f.message_type is not None:
            assert f.message_type.name == t.message_type.name, f"{ours.full_name}.{f.name}"
            if f.message_type.GetOptions().map_entry:
                checked += _same(f.message_type, t.message_type)
        if f.enum_type is not None:
            assert f.enum_type.name == t.enum_type.name
            assert {v.name: v.number for v in f.enum_type.values}.items() <= {
                v.name: v.number for v in t.enum_type.values}.items()
        checked += 1
    for nested in ours.nested_types:
        if not nested.GetOptions().map_entry:
            checked += _same(nested, theirs.nested_types_by_name[nested.name])
    return checked


def test_every_message_matches_tritons_on_the_wire():
    checked = sum(_same(m, _triton(name)) for name, m in inference_pb2.DESCRIPTOR.message_types_by_name.items())
    assert checked >= 100  # every field of every message (and of the map entries)


def test_the_service_has_tritons_name_and_methods():
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert grpc_server.SERVICE == service.full_name == "inference.GRPCInferenceService"
    for method, (request, response) in grpc_server.METHODS.items():
        theirs = service.methods_by_name[method]
        assert (request.DESCRIPTOR.name, response.DESCRIPTOR.name) == (theirs.input_type.name, theirs.output_type.name)
    assert set(grpc_server.METHODS) == {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                                        "ModelInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex"}

"""The KServe v2 / Triton gRPC inference protocol on the gateway (``grpc.aio``, the gateway's
event loop), for ``tritonclient.grpc``, perf_analyzer and other Triton clients.

Served methods (``inference.GRPCInferenceService``, Triton's names): ServerLive, ServerReady,
ModelReady, ServerMetadata, ModelMetadata, ModelInfer, ModelConfig, ModelStatistics,
RepositoryIndex; the messages are tideserve's own proto (inference.proto), wire compatible with
Triton's. ``ModelInfer`` goes through the same path as HTTP (``GatewayCore.call``: holding,
limits, routing, retries, metrics, Triton statistics, request ids): it is forwarded to a
replica as an HTTP ``/infer`` request with binary tensors, so BYTES inputs travel unchanged.

API keys: metadata ``authorization: Bearer KEY`` on every method but ServerLive and ServerReady
(open, as HTTP's health routes). Errors are gRPC status codes (``STATUS_OF_HTTP``); a
``Retry-After`` becomes trailing metadata ``retry-after``; the request id is returned in
trailing metadata ``x-request-id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from tideserve import __version__
from tideserve.errors import BadInputError, TideserveError, UnauthorizedError, UnknownModelError
from tideserve.gateway import inference_pb2 as pb
from tideserve.gateway.app import GatewayCore
from tideserve.protocol import kserve

log = logging.getLogger("tideserve.grpc")

SERVICE = "inference.GRPCInferenceService"
#: method -> (request message, response message)
METHODS: dict[str, tuple[Any, Any]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
}
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})

#: HTTP status of an error -> gRPC status (gRPC's own mapping of HTTP semantics).
STATUS_OF_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED, 422: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED, 502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


class _Failed(Exception):
    """An answer that is a gRPC error: ``status`` (HTTP), message, optional Retry-After."""

    def __init__(self, status: int, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


class InferenceService:
    """The handlers, over one gateway's ``GatewayCore``."""

    def __init__(self, core: GatewayCore) -> None:
        self.core = core
        self.model = core.endpoint.spec.model.name

    def _check_model(self, name: str) -> None:
        if not self.core.endpoint.spec.model.serves(name):
            raise UnknownModelError.naming(name, self.model, self.core.endpoint.spec.model.aliases)

    # --- health and metadata ------------------------------------------------------------------
    async def ServerLive(self, req: Any, ctx: dict) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, req: Any, ctx: dict) -> Any:
        return pb.ServerReadyResponse(ready=self.core.accepting())

    async def ModelReady(self, req: Any, ctx: dict) -> Any:
        return pb.ModelReadyResponse(ready=self.core.endpoint.spec.model.serves(req.name) and self.core.accepting())

    async def ServerMetadata(self, req: Any, ctx: dict) -> Any:
        meta = kserve.server_metadata(__version__)
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, req: Any, ctx: dict) -> Any:
        self._check_model(req.name)
        meta = kserve.model_metadata(self.model, self.core.endpoint.spec.model.backend)
        tensors = [pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                   for t in meta["inputs"]]
        outs = [pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                for t in meta["outputs"]]
        return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                        inputs=tensors, outputs=outs)

    async def ModelConfig(self, req: Any, ctx: dict) -> Any:
        self._check_model(req.name)
        spec = self.core.endpoint.spec
        c = kserve.model_config(self.model, spec.model.backend, spec.batching.max_batch_size,
                                spec.batching.max_queue_delay_ms,
                                [(p.name, p.accelerator, p.replicas.max) for p in spec.pools])
        config = pb.ModelConfig(
            name=c["name"], platform=c["platform"], backend=c["backend"], max_batch_size=c["max_batch_size"],
            input=[pb.ModelInput(name=t["name"], data_type=pb.TYPE_STRING, dims=t["dims"], optional=t["optional"])
                   for t in c["input"]],
            output=[pb.ModelOutput(name=t["name"], data_type=pb.TYPE_STRING, dims=t["dims"]) for t in c["output"]],
            instance_group=[pb.ModelInstanceGroup(name=g["name"], count=g["count"],
                                                  kind=g["kind"])
                            for g in c["instance_group"]],
            parameters={k: pb.ModelParameter(string_value=v["string_value"]) for k, v in c["parameters"].items()},
        )
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, req: Any, ctx: dict) -> Any:
        if req.name:
            self._check_model(req.name)
        out = pb.ModelStatisticsResponse()
        for s in self.core.stats.to_json(self.model)["model_stats"]:
            st = s["inference_stats"]
            out.model_stats.append(pb.ModelStatistics(
                name=s["name"], version=s["version"], last_inference=s["last_inference"],
                inference_count=s["inference_count"], execution_count=s["execution_count"],
                inference_stats=pb.InferStatistics(**{k: pb.StatisticDuration(**v) for k, v in st.items()})))
        return out

    async def RepositoryIndex(self, req: Any, ctx: dict) -> Any:
        models = kserve.repository_index(self.model, self.core.accepting(), req.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**m) for m in models])

    # --- inference ----------------------------------------------------------------------------
    async def ModelInfer(self, req: Any, ctx: dict) -> Any:
        self._check_model(req.model_name)
        self.core.arrived()
        if req.raw_input_contents and len(req.raw_input_contents) != len(req.inputs):
            raise _Failed(400, f"raw_input_contents has {len(req.raw_input_contents)} entries for "
                               f"{len(req.inputs)} inputs; send one per input")
        try:  # what the request asks for and this server lacks, checked as over HTTP
            kserve.refuse_outputs(len(req.outputs))
            for tensor, kind in [(t, "input") for t in req.inputs] + [(o, "output") for o in req.outputs]:
                kserve.refuse_extensions(tensor.parameters, f"{kind} '{tensor.name}'")
        except BadInputError as exc:
            raise _Failed(400, str(exc)) from None
        inputs = []
        for i, t in enumerate(req.inputs):
            if req.raw_input_contents and t.HasField("contents"):
                raise _Failed(400, f"input '{t.name}' has both contents and raw_input_contents; send one of them")
            raw = req.raw_input_contents[i] if req.raw_input_contents else \
                kserve.pack_bytes_elements(list(t.contents.bytes_contents))
            inputs.append((t.name, t.datatype, list(t.shape), raw))
        for out in req.outputs:
            if out.name != kserve.OUTPUT_TEXT:
                raise _Failed(400, f"unknown output '{out.name}'; this model has output {kserve.OUTPUT_TEXT}")
        body, hlen = kserve.binary_infer_body(ctx["request_id"], inputs)
        headers = {"Content-Type": "application/octet-stream", kserve.HEADER_LENGTH: str(hlen)}
        status, out_headers, data = await self.core.call(ctx, "POST", f"/v2/models/{self.model}/infer", body, headers)
        if status != 200:
            ctx["status"] = status
            raise _Failed(status, _error_message(data), out_headers.get("Retry-After"))
        try:
            text = kserve.parse_binary_infer_response(data, out_headers.get(kserve.HEADER_LENGTH))
        except (ValueError, KeyError) as exc:
            ctx["status"] = 502
            raise _Failed(502, f"the replica's answer could not be read ({exc}); retry") from None
        ctx["status"] = status
        out = pb.ModelInferResponse.InferOutputTensor(name=kserve.OUTPUT_TEXT, datatype="BYTES", shape=[1])
        return pb.ModelInferResponse(model_name=self.model, model_version="1", id=req.id, outputs=[out],
                                     raw_output_contents=[text])


def _error_message(data: bytes) -> str:
    try:
        doc = json.loads(data)
        return str(doc.get("message") or doc.get("error") or data[:200])
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")


def _bearer(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            scheme, _, credential = str(value).partition(" ")
            return credential if scheme.lower() == "bearer" and credential else None
    return None


def _metadata(metadata: Any, name: str) -> str | None:
    for key, value in metadata or ():
        if key.lower() == name:
            return str(value)
    return None


def _handler(core: GatewayCore, service: InferenceService, method: str, message: Any) -> Callable:
    """The handler of ``method``: it takes the raw request bytes and parses them as ``message``
    itself, so that a malformed request is INVALID_ARGUMENT (not gRPC's UNKNOWN with a traceback)."""
    fn = getattr(service, method)

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        metadata = context.invocation_metadata()
        request: Any = None
        with contextlib.suppress(DecodeError):  # answered INVALID_ARGUMENT below (after the key check)
            request = message.FromString(raw)
        sent_id = (getattr(request, "id", "") if method == "ModelInfer" else "") or _metadata(metadata, "x-request-id")
        rid: str = sent_id if sent_id and _REQUEST_ID_RE.fullmatch(sent_id) else uuid.uuid4().hex
        ctx: dict = {"request_id": rid, "started": time.monotonic()}
        status = 200
        try:
            if method not in OPEN_METHODS and not core.key_ok(_bearer(metadata)):
                raise UnauthorizedError("missing or invalid API key: send metadata 'authorization: Bearer <key>'")
            if request is None:
                raise _Failed(400, f"the request is not a valid {message.DESCRIPTOR.name} message")
            answer = await fn(request, ctx)
            context.set_trailing_metadata((("x-request-id", rid),))
            return answer
        except asyncio.CancelledError:
            status = ctx["status"] = 499  # the client cancelled or its deadline passed: not a success
            raise
        except TideserveError as err:
            status = err.http_status
            retry = None if err.retry_after_s is None else str(max(1, round(err.retry_after_s)))
            await _abort(context, rid, status, err.message, retry)
        except _Failed as f:
            status = f.status
            await _abort(context, rid, f.status, f.message, f.retry_after)
        except Exception:
            status = 500
            log.exception("gRPC %s failed", method)
            await _abort(context, rid, 500, "internal error; the server log has the details", None)
        finally:
            if method == "ModelInfer":
                core.account(ctx, "grpc", ctx.get("status", status), ctx["started"])
        return None  # not reached: _abort raises

    return handle


async def _abort(context: grpc.aio.ServicerContext, rid: str, status: int, message: str, retry: str | None) -> None:
    trailing = [("x-request-id", rid)] + ([("retry-after", retry)] if retry else [])
    context.set_trailing_metadata(tuple(trailing))
    await context.abort(STATUS_OF_HTTP.get(status, grpc.StatusCode.INTERNAL), message)


class InferenceGrpcServer:
    """The gRPC server of one gateway: ``start(host, port)`` (0: any free port) returns the
    bound port; ``stop(grace_s)``. ``max_message_bytes``: largest request (the endpoint's
    ``max_body_bytes``; larger ones get RESOURCE_EXHAUSTED)."""

    def __init__(self, core: GatewayCore, max_message_bytes: int) -> None:
        service = InferenceService(core)
        handlers: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(
                _handler(core, service, name, req), request_deserializer=None,  # raw bytes: parsed by the handler
                response_serializer=resp.SerializeToString)
            for name, (req, resp) in METHODS.items()
        }
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes + 65536),
                                                ("grpc.max_send_message_length", max_message_bytes + 65536)])
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def start(self, host: str, port: int, tls: tuple[bytes, bytes] | None = None) -> int:
        """Listen on ``host:port`` (TLS with ``tls`` = (private key PEM, certificate chain PEM),
        as the HTTP side). Returns the bound port. Raises OSError when it cannot listen."""
        address = f"{host}:{port}"
        bound = self._server.add_secure_port(address, grpc.ssl_server_credentials([tls])) if tls else \
            self._server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot listen for gRPC on {host}:{port}")
        await self._server.start()
        return bound

    async def stop(self, grace_s: float = 5.0) -> None:
        await self._server.stop(grace_s)

"""``model.kv_cache_dtype``: fp8 is accepted only for the torch backend on pools whose GPUs convert
FP8 in hardware (sm89 and newer), with an error naming the pool and the fix otherwise; the
worker's engine then builds the torch backend with FP8 cross-attention keys and values.
``model.cross_attention: absorbed`` needs fp8 and builds it over one FP8 copy of the encoder's output."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tideserve.spec.models import EndpointSpec


def _spec(backend: str, pools: list[tuple[str, str]], kv: str, cross: str = "kv") -> EndpointSpec:
    return EndpointSpec.model_validate({
        "model": {"name": "m", "backend": backend, "source": "file:///models/m", "kv_cache_dtype": kv,
                  "cross_attention": cross, "decoding": {"beam_size": 1}},
        "pools": [{"name": f"p{i}", "accelerator": acc, "target": target} for i, (acc, target) in enumerate(pools)]})


def test_fp8_is_accepted_on_ada_and_hopper_pools_with_the_torch_backend():
    spec = _spec("torch", [("h200", "cuda-sm90-bf16"), ("l40s", "cuda-sm89-fp16")], "fp8")
    assert spec.model.kv_cache_dtype == "fp8"
    assert _spec("torch", [("a10g", "cuda-sm86-fp16")], "auto").model.kv_cache_dtype == "auto"
    assert _spec("faster-whisper", [("cpu", "cpu-x86_64-int8")], "auto").model.kv_cache_dtype == "auto"


@pytest.mark.parametrize(("backend", "pools", "named"), [
    ("torch", [("h200", "cuda-sm90-bf16"), ("a10g", "cuda-sm86-fp16")], "pool 'p1'"),  # Ampere: no FP8
    ("torch", [("cpu", "cpu-x86_64-fp32")], "pool 'p0'"),
    ("faster-whisper", [("cpu", "cpu-x86_64-int8")], "pool 'p0'"),
])
def test_fp8_elsewhere_is_refused_naming_the_pool_and_the_fix(backend, pools, named):
    with pytest.raises(ValidationError, match=rf"{named}: model.kv_cache_dtype fp8 needs the torch backend on a GPU "
                                              r"of sm89 or newer .* set it to auto"):
        _spec(backend, pools, "fp8")


def test_an_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValidationError, match="kv_cache_dtype"):
        _spec("torch", [("h200", "cuda-sm90-bf16")], "int8")


def test_the_absorbed_cross_attention_needs_fp8_and_says_so():
    assert _spec("torch", [("h100", "cuda-sm90-bf16")], "fp8", "absorbed").model.cross_attention == "absorbed"
    assert _spec("torch", [("h100", "cuda-sm90-bf16")], "fp8").model.cross_attention == "kv"
    with pytest.raises(ValidationError, match=r"cross_attention absorbed keeps the encoder's output in FP8: set "
                                              r"model.kv_cache_dtype: fp8 too"):
        _spec("torch", [("h100", "cuda-sm90-bf16")], "auto", "absorbed")
    with pytest.raises(ValidationError, match="cross_attention"):
        _spec("torch", [("h100", "cuda-sm90-bf16")], "fp8", "latent")


@pytest.mark.parametrize(("kv", "cross", "want"), [("fp8", "kv", {"cross_fp8": True}), ("auto", "kv", {}),
                                                   ("fp8", "absorbed", {"cross_fp8": True, "cross_absorbed": True})])
def test_the_engine_builds_the_backend_with_the_cache_dtype(monkeypatch, kv, cross, want):
    from tideserve.spec.models import Decoding, Target
    from tideserve.worker import backends
    from tideserve.worker.engine import EngineConfig, engine_main

    seen: list[dict] = []

    class Backend:
        def __init__(self, *args, **kwargs):
            seen.append(kwargs)
            raise RuntimeError("no model here")

    class Outbox:
        def __init__(self):
            self.sent: list[tuple] = []

        def send(self, msg):
            self.sent.append(msg)

    monkeypatch.setattr(backends, "backend_class", lambda name: Backend)
    out = Outbox()
    engine_main(None, out, EngineConfig(backend="torch", model_dir="/nowhere", target=Target.parse("cuda-sm90-bf16"),
                                        decoding=Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0,
                                        kv_cache_dtype=kv, cross_attention=cross))
    assert {k: seen[0][k] for k in ("cross_fp8", "cross_absorbed") if k in seen[0]} == want
    assert out.sent == [("failed", "RuntimeError", "no model here")]

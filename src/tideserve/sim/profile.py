"""Service-time profiles: measured latency of one model execution per pool and target.

A profile (JSON, written by ``tideserve bench profile``) holds, for each pool and engine target,
the wall time of ONE batched execution of ``batch_size`` windows of ``audio_s`` seconds each, as
the worker's backend runs it (features, batched encoder, batched decoding), plus metadata saying
where and when it was measured. Schema (pydantic, ``Profile``)::

    {"format": "tideserve.profile/v1",
     "metadata": {"machine": str, "cpu": str, "cpus": int, "gpu": str | null, "date": ISO-8601 UTC,
                  "model": str, "model_source": str, "backend": str, "backend_version": str,
                  "decoding": {...}, "repeats": int, "measured": true, "load_average_1m": [float, float],
                  "notes": str},
     "pools": [{"pool": str, "target": str, "accelerator": str,
                "points": [{"batch_size": int, "audio_s": float, "latency_s": float,
                            "samples_s": [float, ...]}, ...]}, ...]}

``latency_s`` is the median of ``samples_s`` (seconds). A GPU profile is the same document with
``gpu`` set and a CUDA target; ``measured`` must be true: the simulator refuses estimates, except
a profile that names in ``derived_from`` the measurements it was derived from and how (e.g.
bench/derive_profiles.py: H200 measurements scaled to other GPUs by FLOPs and memory bandwidth).

Interpolation (``PoolProfile.service_time_s``): for each measured audio length, latency is
piecewise linear in batch size between measured sizes, extended beyond the largest measured size
along the line through the last two points (with one point: proportional to batch size); between
audio lengths it is linear, clamped to the shortest and longest measured length (Whisper pads every
window to 30 s, so length matters only through decoding; Whisper's 3000-frame input).
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tideserve.sim.errors import SimInputError

FORMAT: Literal["tideserve.profile/v1"] = "tideserve.profile/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ProfilePoint(_Strict):
    batch_size: int = Field(ge=1, description="Windows run through the model in one execution.")
    audio_s: float = Field(gt=0, le=30, description="Length of each window of the batch, s (<= Whisper's 30 s).")
    latency_s: float = Field(gt=0, description="Median wall time of one execution, s.")
    samples_s: list[float] = Field(default_factory=list, description="Every measured execution time, s.")


class PoolProfile(_Strict):
    pool: str = Field(description="Pool name in the endpoint file.")
    target: str = Field(description="Engine target measured, e.g. cpu-x86_64-int8 or cuda-sm90-bf16.")
    accelerator: str = Field(description="cpu or the GPU model (a10g, l4, l40s, a100, h100, h200).")
    points: list[ProfilePoint] = Field(min_length=1)
    busy_cores_per_window: float | None = Field(
        None, gt=0, description="CPU pools: cores one window of an execution keeps busy (an execution of b windows "
        "keeps min(intra-op threads, b x this) busy), measured by running lone requests at once on as many instances "
        "(bench/profile_e2e.py); None: an execution keeps all its intra-op threads busy.")

    @model_validator(mode="after")
    def _unique(self) -> PoolProfile:
        keys = [(p.batch_size, p.audio_s) for p in self.points]
        if len(set(keys)) != len(keys):
            raise ValueError(f"pool {self.pool}: a (batch_size, audio_s) point is listed twice")
        return self

    def _curve(self, audio_s: float, batch_size: int) -> float:
        pts = sorted((p.batch_size, p.latency_s) for p in self.points if p.audio_s == audio_s)
        sizes = [b for b, _ in pts]
        if len(pts) == 1:
            return pts[0][1] * batch_size / pts[0][0]
        i = bisect.bisect_left(sizes, batch_size)
        if i < len(pts) and sizes[i] == batch_size:
            return pts[i][1]
        lo, hi = (pts[-2], pts[-1]) if i >= len(pts) else (pts[0], pts[1]) if i == 0 else (pts[i - 1], pts[i])
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return max(1e-6, lo[1] + slope * (batch_size - lo[0]))

    def service_time_s(self, batch_size: int, audio_s: float) -> float:
        """Seconds one execution of ``batch_size`` windows takes when its longest window is
        ``audio_s`` seconds (interpolation rules in the module docstring). Raises ValueError for
        batch_size < 1 or audio_s <= 0."""
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        if audio_s <= 0:
            raise ValueError(f"audio_s {audio_s} must be > 0")
        lengths = sorted({p.audio_s for p in self.points})
        a = min(max(audio_s, lengths[0]), lengths[-1])
        j = bisect.bisect_left(lengths, a)
        if lengths[j] == a:
            return self._curve(a, batch_size)
        a0, a1 = lengths[j - 1], lengths[j]
        w = (a - a0) / (a1 - a0)
        return (1 - w) * self._curve(a0, batch_size) + w * self._curve(a1, batch_size)


class ProfileMetadata(_Strict):
    machine: str = Field(description="Host name or a description of the machine.")
    cpu: str = Field("", description="CPU model.")
    cpus: int = Field(0, ge=0, description="Logical CPUs the measurement could use.")
    gpu: str | None = Field(None, description="GPU model for GPU profiles; None on CPU.")
    date: str = Field(description="When measured, ISO 8601 UTC.")
    model: str = Field(description="Model name served (spec.model.name).")
    model_source: str = Field("", description="spec.model.source of the measured model.")
    backend: str = Field("", description="spec.model.backend.")
    backend_version: str = Field("", description="Version of the backend library.")
    decoding: dict = Field(default_factory=dict, description="spec.model.decoding used.")
    repeats: int = Field(1, ge=1, description="Executions measured per point.")
    measured: bool = Field(True, description="True: measured, not estimated (the simulator needs true).")
    derived_from: str = Field("", description="For measured: false: the measurements this profile was derived "
                              "from and the rule (the simulator accepts no other estimate).")
    load_average_1m: list[float] = Field(
        default_factory=list, description="The machine's 1-minute load average before and after measuring "
        "(other work on the machine inflates latencies).")
    notes: str = ""


class Profile(_Strict):
    format: Literal["tideserve.profile/v1"] = FORMAT
    metadata: ProfileMetadata
    pools: list[PoolProfile] = Field(min_length=1)

    def for_pool(self, pool: str, target: str) -> PoolProfile | None:
        """The profile of ``pool`` measured for ``target``, else the first of any pool with that
        ``target``; None if neither exists."""
        same = [p for p in self.pools if p.target == target]
        return next((p for p in same if p.pool == pool), same[0] if same else None)


def load_profile(path: str | Path) -> Profile:
    """Read a profile JSON file. Raises SimInputError naming the file and the bad field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise SimInputError(f"cannot read profile {path}: {exc.strerror}; write one with `tideserve bench profile`") from None
    except json.JSONDecodeError as exc:
        raise SimInputError(f"profile {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        prof = Profile.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise SimInputError(f"profile {path}: {where}: {first['msg']} ({exc.error_count()} problem(s))") from None
    if not prof.metadata.measured and not prof.metadata.derived_from:
        raise SimInputError(f"profile {path} is marked measured: false and names no derived_from; the simulator uses "
                             "measured profiles, or profiles derived from measurements by a stated rule")
    return prof


def merge_profiles(profiles: list[Profile]) -> list[PoolProfile]:
    """All pool profiles of ``profiles``, in order (later files do not replace earlier ones)."""
    return [p for prof in profiles for p in prof.pools]


def pools_for_backend(profiles: list[Profile], paths: list, backend: str) -> list[PoolProfile]:
    """The pool profiles of ``profiles`` measured with ``backend`` (the endpoint's
    ``model.backend``; a profile without a recorded backend is kept). Raises SimInputError when
    none is, naming each file's backend: service times of another backend (beam search on
    CTranslate2 vs greedy on torch) are not this endpoint's."""
    kept = [pp for prof in profiles if prof.metadata.backend in ("", backend) for pp in prof.pools]
    if not kept:
        seen = ", ".join(f"{path} ({prof.metadata.backend})" for prof, path in zip(profiles, paths, strict=True))
        raise SimInputError(f"no profile was measured with the endpoint's backend {backend}: {seen}; measure one "
                            "with `tideserve bench profile FILE`")
    return kept

"""Worker metrics with Triton Inference Server's names and labels (``model``, ``version``),
so that existing Triton dashboards work. Names and meanings: Triton's metrics doc
(docs/user_guide/metrics.md). Durations are cumulative microseconds, as in Triton.

- ``nv_inference_request_success`` / ``_failure``: requests (failure labelled by ``reason``)
- ``nv_inference_count``: inferences performed (one per 30 s window of audio)
- ``nv_inference_exec_count``: model executions (batches); exec < count shows batching
- ``nv_inference_pending_request_count``: windows queued, updated on enqueue and dequeue
- ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
  ``nv_inference_compute_{input,infer,output}_duration_us``

prometheus-client appends ``_total`` to every counter it renders, which would rename
Triton's counters; so this family is rendered here, in the text format (version 0.0.4),
and histograms come from a prometheus-client registry.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Histogram, generate_latest

#: Failure reasons, as Triton labels them: bad input, client gone, model error, anything else.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

#: Latency buckets in seconds, reaching long audio (a 10 min file on CPU can take minutes).
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

_FAMILIES: dict[str, tuple[str, str]] = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (one per 30 s audio window)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (batches)"),
    "nv_inference_pending_request_count": ("gauge", "Instantaneous number of pending windows awaiting execution"),
    "nv_inference_request_duration_us": ("counter", "Cumulative inference request duration in microseconds"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative inference queuing duration in microseconds"),
    "nv_inference_compute_input_duration_us": ("counter", "Cumulative compute input duration in microseconds"),
    "nv_inference_compute_infer_duration_us": ("counter", "Cumulative compute inference duration in microseconds"),
    "nv_inference_compute_output_duration_us": ("counter", "Cumulative inference compute output duration in microseconds"),
    "tideserve_worker_dropped": ("counter", "Queued windows dropped unexecuted because their client went away"),
    "tideserve_worker_requests_in_batcher": ("gauge", "Requests whose audio windows are queued or executing"),
    "tideserve_model_load_seconds": ("gauge", "Seconds this replica took to load its model, by model source scheme"),
    "tideserve_worker_stage_duration_us": ("counter", "Cumulative microseconds spent per serving stage (prep: body parsing "
                                           "and audio decoding in the prep processes; queue: windows waiting in the engine, "
                                           "summed per window; features, encoder, decode_steps, detokenize: engine time)"),
    "tideserve_worker_decode_rows": ("counter", "Sum over decode chunks of the rows decoding in them (divide by "
                                     "tideserve_worker_decode_chunks for the mean running batch)"),
    "tideserve_worker_decode_chunks": ("counter", "Decode chunks (a few decoder steps each) the engine ran"),
    "tideserve_worker_fallbacks": ("counter", "Windows decoded again at a higher temperature (Whisper's fallback)"),
    "tideserve_worker_seeks": ("counter", "Window parts started from a seek point (Whisper's long-form rule)"),
    "tideserve_worker_quiet_rests": ("counter", "Seeks not taken because the window's rest held no speech "
                                     "(under 0.25 s of sound above its quiet level)"),
    "tideserve_worker_repeated_rests": ("counter", "Rests decoded after a seek whose text was only the end of the "
                                        "text before them (an early closing timestamp), dropped"),
    "tideserve_worker_resumed_rests": ("counter", "Rests after a seek queued to be decoded over their window's kept "
                                       "encoder output, from the seek point (no second encoder pass)"),
    "tideserve_worker_redone_rests": ("counter", "Resumed rests not kept (under Whisper's quality thresholds, looping, "
                                      "or leaving speech untranscribed), decoded again from their own audio"),
    "tideserve_worker_loop_splits": ("counter", "Looping windows decoded again as two halves cut at their longest pause"),
    "tideserve_worker_language_mismatch": ("counter", "Requests whose speech the language-ID model heard in a "
                                           "language the model cannot transcribe (model.language_id)"),
    "tideserve_worker_spread_parts": ("counter", "Later parts of spread long files (spec.gateway.spread_min_audio_s) this "
                                      "replica sent out, by where they were transcribed (helper: another replica; "
                                      "here: this one, after the helper failed)"),
    "tideserve_worker_active_rows": ("gauge", "Windows decoding in the engine now"),
    "tideserve_worker_audio_held_seconds": ("gauge", "Decoded audio this replica holds now, in seconds (the budget is "
                                            "spec.gateway.max_audio_s_in_flight)"),
}
STAGES = ("prep", "queue", "features", "encoder", "decode_steps", "detokenize")


def _fmt_labels(labels: dict[str, str]) -> str:
    esc = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc, strict=True)) + "}"


class TritonMetrics:
    """The Triton metric family for one model."""

    def __init__(self, model: str, version: str = "1") -> None:
        self.labels = {"model": model, "version": version}
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for name in _FAMILIES:
            if name not in ("nv_inference_request_failure", "tideserve_model_load_seconds"):
                self._values[(name, ())] = 0.0
        for reason in FAILURE_REASONS:  # every failure series exists from the start, at 0
            self._values[("nv_inference_request_failure", (("reason", reason),))] = 0.0
        del self._values[("tideserve_worker_stage_duration_us", ())]
        for stage in STAGES:
            self._values[("tideserve_worker_stage_duration_us", (("stage", stage),))] = 0.0
        self.registry = CollectorRegistry()
        lbl = list(self.labels)
        self._latency = Histogram(
            "nv_inference_request_duration_seconds", "Request latency in seconds", lbl,
            buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )
        self._batch = Histogram(
            "tideserve_worker_batch_size", "Windows per model execution", lbl,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry,
        )

    def add(self, name: str, value: float, **extra: str) -> None:
        key = (name, tuple(sorted(extra.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def set(self, name: str, value: float, **extra: str) -> None:
        """Set a gauge."""
        with self._lock:
            self._values[(name, tuple(sorted(extra.items())))] = float(value)

    def value(self, name: str, **extra: str) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(extra.items()))), 0.0)

    def render(self) -> bytes:
        """Prometheus text exposition of every metric of this worker."""
        lines = []
        with self._lock:
            items = sorted(self._values.items())
        seen: set[str] = set()
        for (name, extra), v in items:
            if name not in seen:
                kind, help_ = _FAMILIES[name]
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
                seen.add(name)
            lines.append(f"{name}{_fmt_labels({**self.labels, **dict(extra)})} {v!r}")
        return ("\n".join(lines) + "\n").encode() + generate_latest(self.registry)

    def model_loaded(self, source_scheme: str, seconds: float) -> None:
        """Record the model load time, labelled by source scheme (pkg, file, s3, hf)."""
        with self._lock:
            self._values[("tideserve_model_load_seconds", (("source", source_scheme),))] = seconds


    def on_engine_stats(self, st) -> None:
        """Add the engine's counters (a ``worker.engine.EngineStats`` delta). Triton's compute
        durations are the engine's time per stage (input: features; infer: encoder and decode
        steps; output: detokenize), counted once, not once per window of a batch."""
        self.add("nv_inference_exec_count", st.executions)
        self.add("nv_inference_count", st.windows)
        self.add("nv_inference_queue_duration_us", st.queue_s * 1e6)
        self.add("nv_inference_compute_input_duration_us", st.features_s * 1e6)
        self.add("nv_inference_compute_infer_duration_us", (st.encoder_s + st.decode_s) * 1e6)
        self.add("nv_inference_compute_output_duration_us", st.detokenize_s * 1e6)
        for stage, v in (("queue", st.queue_s), ("features", st.features_s), ("encoder", st.encoder_s),
                         ("decode_steps", st.decode_s), ("detokenize", st.detokenize_s)):
            self.add("tideserve_worker_stage_duration_us", v * 1e6, stage=stage)
        self.add("tideserve_worker_decode_rows", st.rows_stepped)
        self.add("tideserve_worker_decode_chunks", st.chunks)
        self.add("tideserve_worker_fallbacks", st.fallbacks)
        self.add("tideserve_worker_seeks", st.seeks)
        self.add("tideserve_worker_loop_splits", st.splits)
        self.add("tideserve_worker_quiet_rests", st.quiet_rests)
        self.add("tideserve_worker_repeated_rests", st.repeated_rests)
        self.add("tideserve_worker_resumed_rests", st.resumed_rests)
        self.add("tideserve_worker_redone_rests", st.redone_rests)
        self.add("tideserve_worker_dropped", st.dropped)
        with self._lock:
            self._values[("nv_inference_pending_request_count", ())] = float(st.queued)
            self._values[("tideserve_worker_active_rows", ())] = float(st.active)
        if st.executions and st.windows:
            self._batch.labels(**self.labels).observe(st.windows / st.executions)

    def on_request(self, ok: bool, duration_s: float, reason: str = "") -> None:
        """Count one finished request. ``reason`` labels failures: REJECTED (bad input),
        CANCELED (client went away), BACKEND (model error)."""
        if ok:
            self.add("nv_inference_request_success", 1)
        else:
            self.add("nv_inference_request_failure", 1, reason=reason or "OTHER")
        self.add("nv_inference_request_duration_us", duration_s * 1e6)
        self._latency.labels(**self.labels).observe(duration_s)

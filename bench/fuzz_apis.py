"""Property-based fuzz of every API of a running endpoint: no input may get a 5xx.

Not part of CI: it needs a running ``tideserve up`` and the ``hypothesis`` package
(``.venv/bin/uv pip install --python .venv/bin/python hypothesis``).

    tideserve up examples/whisper-tiny-en.yaml &      # or any endpoint, on 127.0.0.1
    .venv/bin/python bench/fuzz_apis.py --url http://127.0.0.1:8080 --duration-s 600 --out fuzz.jsonl

Requests are built by Hypothesis strategies around the three APIs' shapes (SageMaker
``/invocations`` JSON, KServe v2 ``/infer`` in JSON and binary-tensor form, OpenAI multipart
``/v1/audio/transcriptions``) and around their edges: random and hostile text (lone surrogates,
control characters, long strings) in every text field, wrong types, broken base64, cut binary
tensors, odd charsets and transfer encodings in multipart parts, garbage bodies, odd headers
and methods, unknown routes. A fraction carries a real short WAV so that prompts and languages
reach the model. Every response with status >= 500 is written to ``--out`` (JSON lines: the
request in short and the answer); the summary counts statuses. 502/503/504 are reported apart:
they are documented statuses for capacity or a replica failure, not input handling.

Exit code: 0 when no response was >= 500 other than 502/503/504, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import struct
import sys
import time
import wave
from collections import Counter
from pathlib import Path

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

DOCUMENTED_5XX = {502, 503, 504}


def _wav(seconds: float, rate: int = 16000) -> bytes:
    """A sine tone WAV (16-bit mono)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        n = int(seconds * rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n)))
    return buf.getvalue()


WAV = _wav(0.5)
WAV_B64 = base64.b64encode(WAV).decode()

# --- strategies -----------------------------------------------------------------------------
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=4),
    st.text(alphabet=st.characters(codec=None, categories=["Cc", "Cs", "Co", "Cn", "Zs"]), max_size=20),
    st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "\U0001f600", "en", "whisper-tiny.en", "json", "0",
                     "x" * 3000, "NaN", "-0", "1e309", "<|endoftext|>", "<|en|><|transcribe|>"]),
)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), hostile_text)
json_value = st.recursive(json_scalar, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(hostile_text, kids, max_size=3),
                          max_leaves=8)
audio_b64 = st.one_of(
    st.just(WAV_B64),
    st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=64).map(lambda b: base64.b64encode(WAV[:44] + b).decode()),
    st.just(WAV_B64[: len(WAV_B64) // 2]),
    hostile_text,
)


def _dumps(doc) -> bytes:
    # ensure_ascii keeps lone surrogates as \\udXXX escapes, as a hostile client would send them.
    return json.dumps(doc, ensure_ascii=True).encode()


@st.composite
def sagemaker_request(draw):
    doc = {}
    if draw(st.integers(0, 9)):
        doc["audio_data"] = draw(st.one_of(audio_b64, json_value))
    if draw(st.booleans()):
        doc["whisper_prompt"] = draw(st.one_of(hostile_text, json_value))
    for _ in range(draw(st.integers(0, 2))):
        doc[draw(hostile_text)] = draw(json_value)
    body = _dumps(doc if draw(st.integers(0, 9)) else draw(json_value))
    if draw(st.integers(0, 9)) == 0:
        body = draw(st.binary(max_size=300))
    return "POST", "/invocations", {"Content-Type": "application/json"}, body


@st.composite
def kserve_request(draw, model: str):
    name = draw(st.sampled_from([model, model, "other", "%ED%A0%80", "%00"]))
    binary = draw(st.booleans())
    inputs, blobs = [], b""
    for tensor in draw(st.lists(st.sampled_from(["AUDIO", "PROMPT", "X"]), min_size=0, max_size=3)):
        value = WAV if tensor == "AUDIO" and draw(st.booleans()) else draw(st.one_of(
            st.binary(max_size=80), hostile_text.map(lambda t: t.encode("utf-8", "surrogatepass"))))
        spec: dict = {"name": tensor, "datatype": draw(st.sampled_from(["BYTES", "BYTES", "FP32", None])),
                      "shape": draw(st.sampled_from([[1], [1], [2], []]))}
        if binary:
            blob = struct.pack("<I", len(value)) + value
            if draw(st.integers(0, 5)) == 0:
                blob = blob[: draw(st.integers(0, len(blob)))]
            spec["parameters"] = {"binary_data_size": draw(st.sampled_from([len(blob), len(blob), len(blob) + 3, -1]))}
            blobs += blob
        else:
            data = base64.b64encode(value).decode() if tensor == "AUDIO" else draw(
                st.one_of(hostile_text, st.just(value.decode("utf-8", "replace"))))
            spec["data"] = draw(st.sampled_from([[data], [[data]], [data, data], data]))
        inputs.append(spec)
    doc = {"inputs": inputs}
    if draw(st.booleans()):
        doc["id"] = draw(st.one_of(hostile_text, json_value))
    if draw(st.booleans()):
        doc["outputs"] = [{"name": draw(st.sampled_from(["TEXT", "Y"])),
                           "parameters": {"binary_data": draw(st.booleans())}}]
    if draw(st.booleans()):
        doc["parameters"] = draw(st.one_of(json_value, st.just({"binary_data_output": True})))
    head = _dumps(doc)
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if binary:
        headers["Inference-Header-Content-Length"] = draw(st.sampled_from(
            [str(len(head)), str(len(head)), "0", "-1", "abc", str(len(head) + len(blobs) + 5)]))
    return "POST", f"/v2/models/{name}/infer", headers, head + blobs


@st.composite
def openai_request(draw, model: str):
    boundary = "fuzzb0undary"
    parts = []
    fields = {"model": draw(st.sampled_from([model, model, "whisper-1", ""]))}
    for key in ("prompt", "language", "response_format", "temperature"):
        if draw(st.booleans()):
            fields[key] = draw(st.one_of(hostile_text, st.sampled_from(
                {"language": ["en", "fr", "xx-yy"], "response_format": ["json", "text", "verbose_json", "srt", "vtt"],
                 "temperature": ["0", "0.0", "1", "nan"], "prompt": ["hello"]}[key])))
    for key, value in fields.items():
        charset = draw(st.sampled_from([None, None, "utf-8", "latin-1", "unicode_escape", "utf-16", "bogus"]))
        ctype = f"Content-Type: text/plain; charset={charset}\r\n" if charset else ""
        raw = value.encode("unicode_escape" if charset == "unicode_escape" else "utf-8", "surrogatepass")
        parts.append(f'Content-Disposition: form-data; name="{key}"\r\n{ctype}\r\n'.encode("utf-8", "surrogatepass") + raw)
    if draw(st.integers(0, 5)):
        audio = WAV if draw(st.booleans()) else draw(st.binary(max_size=200))
        cte = draw(st.sampled_from(["", "", "Content-Transfer-Encoding: base64\r\n", "Content-Transfer-Encoding: x\r\n"]))
        if "base64" in cte:
            audio = base64.b64encode(audio)
        parts.append(b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n'
                     + cte.encode() + b"\r\n" + audio)
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + boundary.encode() + b"--\r\n"
    if draw(st.integers(0, 9)) == 0:
        body = body[: draw(st.integers(0, len(body)))]
    ctype = draw(st.sampled_from([f"multipart/form-data; boundary={boundary}"] * 4
                                 + ["multipart/form-data", "application/json", "text/plain"]))
    return "POST", "/v1/audio/transcriptions", {"Content-Type": ctype}, body


@st.composite
def odd_request(draw, model: str):
    path = draw(st.sampled_from(["/ping", "/v2", f"/v2/models/{model}", f"/v2/models/{model}/ready", "/v1/models",
                                 "/v2/health/ready", "/v2/health/live", f"/v2/models/{model}/versions/1/infer",
                                 "/admin/status", "/nope", "/invocations", "/v2/models/%ED%A0%80"]))
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
    headers = {}
    if draw(st.booleans()):
        headers["X-Request-Id"] = draw(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200))
    if draw(st.booleans()):
        headers["Content-Type"] = draw(st.sampled_from(["application/json", "multipart/form-data; boundary=", "x/y"]))
    if draw(st.booleans()):
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate", "br", "zstd", "bogus"]))
    return method, path, headers, draw(st.binary(max_size=100))


# --- the run ----------------------------------------------------------------------------------
class Fuzzer:
    def __init__(self, url: str, api_key: str | None, out: Path, deadline: float) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=url, headers=headers, timeout=120)
        self.out_path = out
        self.deadline = deadline
        self.statuses: Counter[int] = Counter()
        self.errors: Counter[str] = Counter()
        self.count = 0
        self.skipped = 0

    def __enter__(self) -> Fuzzer:
        self.out = open(self.out_path, "a")
        return self

    def __exit__(self, *exc: object) -> None:
        self.out.close()
        self.client.close()

    def send(self, req: tuple[str, str, dict, bytes]) -> None:
        if time.monotonic() > self.deadline:
            return
        method, path, headers, body = req
        self.count += 1
        try:
            r = self.client.request(method, path, headers=headers, content=body if method not in ("GET", "HEAD") else None)
        except (UnicodeError, ValueError, TypeError, httpx.LocalProtocolError):  # httpx will not send this one
            self.skipped += 1
            return
        except httpx.HTTPError as exc:  # a transport failure is a finding too (connection reset)
            self.errors[type(exc).__name__] += 1
            self.out.write(json.dumps({"method": method, "path": path, "body_len": len(body), "transport_error": repr(exc),
                                       "body_head": body[:300].decode("latin-1")}) + "\n")
            self.out.flush()
            return
        self.statuses[r.status_code] += 1
        if r.status_code >= 500:
            self.out.write(json.dumps({"method": method, "path": path, "headers": headers, "body_len": len(body),
                                       "body_head": body[:300].decode("latin-1"), "status": r.status_code,
                                       "answer": r.text[:500]}) + "\n")
            self.out.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default=None, help="model name (default: asked from /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--duration-s", type=float, default=60.0, help="stop after this long (seconds)")
    p.add_argument("--max-requests", type=int, default=1_000_000, help="stop after this many requests")
    p.add_argument("--batch", type=int, default=50, help="examples per strategy between time checks")
    p.add_argument("--out", type=Path, default=Path("fuzz_5xx.jsonl"), help="JSON lines of every response >= 500")
    args = p.parse_args(argv)

    started = time.monotonic()
    with Fuzzer(args.url, args.api_key, args.out, started + args.duration_s) as fz:
        model = args.model or fz.client.get("/v1/models").json()["data"][0]["id"]
        cfg = settings(max_examples=args.batch, deadline=None, database=None, derandomize=False,
                       suppress_health_check=list(HealthCheck), phases=[Phase.generate])

        strategies = [sagemaker_request(), kserve_request(model), openai_request(model), odd_request(model)]
        runners = [given(s)(cfg(lambda req: fz.send(req))) for s in strategies]
        while time.monotonic() < fz.deadline and fz.count < args.max_requests:
            for run in runners:
                run()
    elapsed = time.monotonic() - started
    bad = sum(n for s, n in fz.statuses.items() if s >= 500 and s not in DOCUMENTED_5XX)
    documented = sum(n for s, n in fz.statuses.items() if s in DOCUMENTED_5XX)
    print(json.dumps({
        "url": args.url, "duration_s": round(elapsed, 1), "requests": fz.count - fz.skipped, "not_sendable_skipped": fz.skipped,
        "statuses": dict(sorted(fz.statuses.items())), "transport_errors": dict(fz.errors),
        "responses_ge_500": bad + documented, "undocumented_5xx": bad, "documented_502_503_504": documented,
        "findings_file": str(args.out),
    }, indent=2))
    return 1 if bad or fz.errors else 0


if __name__ == "__main__":
    sys.exit(main())

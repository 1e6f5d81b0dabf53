"""API keys, TLS, and the per-request timeout."""

from __future__ import annotations

import base64
import json
import ssl

import httpx
import pytest
import trustme
from audio import wer
from endpoint import EndpointProcess, write_endpoint


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """An endpoint with API keys and TLS."""
    tmp = tmp_path_factory.mktemp("secured")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    (tmp / "keys.txt").write_text("# one key a line\nkey-from-file\n")
    config = {
        "api_keys": ["secret-key-1"],
        "api_keys_file": str(tmp / "keys.txt"),
        "tls_cert_file": str(tmp / "server.pem"),
        "tls_key_file": str(tmp / "server.pem"),
    }
    path = write_endpoint(tmp, gateway={"grpc_port": 0})
    ctx = ssl.create_default_context(cafile=str(tmp / "ca.pem"))
    with EndpointProcess(path, tmp, config=config, scheme="https", verify=ctx, api_key="secret-key-1") as ep:
        yield ep


def test_no_key_is_401(secured):
    r = httpx.post(secured.url + "/invocations", json={"audio_data": ""}, verify=secured.verify)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Bearer realm="tideserve"'
    assert r.json()["code"] == 401 and r.json()["error"] == "unauthorized"
    assert "Authorization: Bearer" in r.json()["message"]


def test_wrong_key_is_401(secured):
    r = httpx.get(secured.url + "/admin/status", headers={"Authorization": "Bearer nope"}, verify=secured.verify)
    assert r.status_code == 401 and r.json()["message"] == "invalid API key"
    assert r.json()["code"] == "unauthorized" and r.headers["WWW-Authenticate"] == 'Bearer realm="tideserve"'


def test_right_keys_pass(secured, en_clips):
    hello = next(c for c in en_clips if c.name == "hello_world")
    for key in ("secret-key-1", "key-from-file"):
        r = httpx.post(secured.url + "/invocations", json={"audio_data": base64.b64encode(hello.wav).decode()},
                       headers={"Authorization": f"Bearer {key}"}, verify=secured.verify, timeout=60)
        assert r.status_code == 200, r.text
        assert wer(hello.reference, r.json()["transcribe_text"]) <= 0.15


def test_health_is_open_without_key(secured):
    assert httpx.get(secured.url + "/v2/health/live", verify=secured.verify).status_code == 200


def test_plain_http_refused_on_tls_port(secured):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{secured.port}/ping", timeout=5)


# The 504 for a request that outlasts request_timeout_s is tested against a replica that never
# answers (tests/unit/gateway/test_request_timeout.py), not against a slow transcription here.
@pytest.fixture(scope="module")
def short_timeout(tmp_path_factory):
    """An endpoint whose requests may take 1 s at most."""
    tmp = tmp_path_factory.mktemp("short-timeout")
    with EndpointProcess(write_endpoint(tmp, gateway={"request_timeout_s": 1.0}), tmp) as ep:
        yield ep


def test_cli_status_over_tls_with_config_and_cacert(secured):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TIDESERVE_API_KEY": "secret-key-1", "COLUMNS": "200"}
    # The endpoint file's port is 0 (picked at start), so the URL is given; the scheme comes from it.
    ok = subprocess.run([sys.executable, "-m", "tideserve", "status", "--url", secured.url,
                         "--cacert", str(secured.tmp / "ca.pem")], capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "cpu-0" in ok.stdout and "ready" in ok.stdout
    plain = subprocess.run([sys.executable, "-m", "tideserve", "status", "--url", f"http://127.0.0.1:{secured.port}"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert "the server may speak HTTPS" in plain.stderr
    untrusted = subprocess.run([sys.executable, "-m", "tideserve", "status", "--url", secured.url],
                               capture_output=True, text=True, timeout=60, env=env)
    assert untrusted.returncode == 1 and "pass --cacert" in untrusted.stderr


def test_gateway_binds_loopback_by_default():
    from tideserve.spec import GatewaySpec

    assert GatewaySpec().host == "127.0.0.1"


def test_unicode_whitespace_bearer_is_refused(secured):
    import socket
    import ssl as _ssl

    ctx = _ssl.create_default_context(cafile=str(secured.tmp / "ca.pem"))
    for token in (b"\xc2\xa0", b"\xe3\x80\x80", b"secret-key-1\xc2\xa0"):
        with socket.create_connection(("127.0.0.1", secured.port)) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /admin/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 401"), reply[:100]


def test_slow_body_is_cut_off_by_the_request_timeout(short_timeout):
    import socket
    import time

    with socket.create_connection(("127.0.0.1", short_timeout.port)) as s:
        s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        s.settimeout(30)
        started = time.monotonic()
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 504"), reply[:200]
    assert b"did not arrive within request_timeout_s=1" in reply
    assert time.monotonic() - started < 20


def test_slow_header_connection_is_closed_by_the_gateway(tmp_path):
    """Issue 15: connections that never finished their headers stayed open past 100 s."""
    import socket
    import time

    path = write_endpoint(tmp_path, min_replicas=None, gateway={"header_timeout_s": 1.0})
    with EndpointProcess(path, tmp_path, wait_ready=False) as ep:
        socks = []
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", ep.port))
            s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.settimeout(15)
            socks.append(s)
        started = time.monotonic()
        for s in socks:
            assert s.recv(1024) == b""  # closed by the server, nothing answered
            s.close()
        assert time.monotonic() - started < 10
        with ep.client(timeout=10) as c:  # the gateway still serves others
            assert c.get("/v2/health/live").status_code == 200


def test_sagemaker_runtime_clients_send_the_key_in_custom_attributes(secured, en_clips):
    import boto3
    import botocore.config
    import botocore.exceptions

    client = boto3.client("sagemaker-runtime", endpoint_url=secured.url, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x", verify=str(secured.tmp / "ca.pem"),
                          config=botocore.config.Config(retries={"max_attempts": 0}))
    clip = en_clips[0]
    # boto3 signs Authorization with SigV4 (not verified by tideserve): without the attribute, 401.
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client.invoke_endpoint(EndpointName="whisper", Body=clip.wav, ContentType="audio/wav")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client.invoke_endpoint(EndpointName="whisper", Body=clip.wav, ContentType="audio/wav",
                               CustomAttributes="tideserve-api-key=wrong")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401
    r = client.invoke_endpoint(EndpointName="whisper", Body=clip.wav, ContentType="audio/wav",
                               CustomAttributes="trace=1; tideserve-api-key=key-from-file")
    assert wer(clip.reference, json.loads(r["Body"].read())["transcribe_text"]) <= 0.15


def test_grpc_over_tls_takes_the_api_key_from_metadata(secured, en_clips):
    import numpy as np
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    port = httpx.get(secured.url + "/admin/status", headers={"Authorization": "Bearer secret-key-1"},
                     verify=secured.verify).json()["gateway"]["grpc_port"]
    client = tgrpc.InferenceServerClient(url=f"127.0.0.1:{port}", ssl=True,
                                         root_certificates=str(secured.tmp / "ca.pem"))
    assert client.is_server_live()  # health stays open, as on HTTP
    audio = tgrpc.InferInput("AUDIO", [1], "BYTES")
    audio.set_data_from_numpy(np.array([en_clips[0].wav], dtype=np.object_))
    for headers in (None, {"authorization": "Bearer wrong"}):
        with pytest.raises(InferenceServerException) as err:
            client.infer("whisper-tiny.en", [audio], headers=headers)
        assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    result = client.infer("whisper-tiny.en", [audio], headers={"authorization": "Bearer key-from-file"})
    assert wer(en_clips[0].reference, result.as_numpy("TEXT")[0].decode()) <= 0.15

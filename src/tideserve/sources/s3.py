"""``s3://bucket/prefix`` → a verified local copy in the model cache (the only importer of boto3/botocore).

Where the endpoint and credentials come from: boto3's standard chain, untouched — the
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` variables or ``endpoint_url`` in the config file
(MinIO, moto, other S3-compatible stores), ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, SSO, web identity (IRSA on EKS), instance roles; retries
from ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE`` (boto3 docs: "Configuration", "Credentials",
"Service-specific endpoints").

What is fetched: every object whose key starts with ``prefix + "/"``, so ``s3://b/model`` never
picks up ``model-v2/...``; keys ending in ``/`` with no content (console "folders") are skipped.
The local layout mirrors the keys below the prefix.

What is verified before the directory is published (see cache.py for the publish itself):
- each file's size equals the ``Size`` that ListObjectsV2 reported;
- each object is read with ``IfMatch=<listed ETag>``, so an object replaced after the listing
  fails with 412 instead of mixing two versions of a model;
- ``ChecksumSHA256`` when the object has one: GetObject with ``ChecksumMode="ENABLED"`` returns
  the base64 SHA-256 stored at upload (AWS S3 User Guide, "Checking object integrity"). A
  multipart object's checksum is of type COMPOSITE (a checksum of the parts' checksums, shown
  with a ``-<parts>`` suffix) and cannot be compared with the whole file's hash; it is skipped;
  botocore also validates the response checksum it supports (``response_checksum_validation``);
- a ``sha256sums`` or ``SHA256SUMS`` file at the top of the prefix (``sha256sum`` format): every
  file it names must be present and match.

The cache key is a digest of the URI and every listed key with its size and ETag, so a cache hit
still costs one ListObjectsV2 call (a changed model is noticed), and no GetObject.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import botocore.exceptions as bex
from botocore.config import Config

from tideserve.errors import SourceError
from tideserve.sources.cache import CHECKSUM_MANIFESTS, FileRecord, ModelCache, cache_key, parse_sha256sums, receive
from tideserve.sources.errors import SourceAuthError, SourceIntegrityError, SourceNetworkError, SourceNotFoundError
from tideserve.sources.progress import DownloadProgress

CHUNK_BYTES = 1 << 20
"""Bytes read from a GetObject body at a time."""

ChunkHook = Callable[[str, int], None]
"""Called after each chunk is written with (relative path, bytes of that file written so far);
an exception raised by it aborts the download like a network failure would (tests use it)."""


@dataclass(frozen=True)
class S3Object:
    key: str
    rel: str  # path below the prefix, POSIX
    size_bytes: int
    etag: str


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix``; the prefix without slashes at its ends
    (``""`` for a whole bucket). Raises SourceError for a URI without a bucket."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise SourceError(f"{uri}: an S3 source is s3://<bucket>/<prefix>; the bucket is missing")
    return bucket, prefix.strip("/")


def make_client(
    *, connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0, max_attempts: int | None = None
):
    """An S3 client from boto3's standard configuration chain, with these socket timeouts
    (boto3's defaults are 60 s each) and, when given, ``max_attempts`` total tries per call
    (else ``AWS_MAX_ATTEMPTS`` / the config file / boto3's default)."""
    kwargs: dict = {"connect_timeout": connect_timeout_s, "read_timeout": read_timeout_s}
    if max_attempts is not None:
        kwargs["retries"] = {"total_max_attempts": max_attempts}
    return boto3.session.Session().client("s3", config=Config(**kwargs))


def resolve_s3(
    uri: str,
    cache_dir: Path,
    *,
    client=None,
    chunk_bytes: int = CHUNK_BYTES,
    on_chunk: ChunkHook | None = None,
    tty: bool | None = None,
) -> tuple[Path, bool]:
    """``(local directory, cache hit)`` for ``uri``; downloads and publishes it on a miss.

    Raises SourceNotFoundError (no bucket, nothing under the prefix), SourceAuthError (no,
    unknown or wrong credentials, or not allowed), SourceNetworkError (endpoint unreachable,
    timeouts), SourceIntegrityError (size, checksum or sha256sums mismatch; object changed).
    """
    bucket, prefix = parse_s3_uri(uri)
    client = client if client is not None else make_client()
    objects = list_objects(client, uri, bucket, prefix)
    canonical = f"s3://{bucket}/{prefix}"
    key = cache_key({"source": canonical, "objects": [[o.rel, o.size_bytes, o.etag] for o in objects]})

    def fill(tmp: Path) -> list[FileRecord]:
        return _download_all(client, uri, bucket, objects, tmp, chunk_bytes, on_chunk, tty)

    return ModelCache(cache_dir).fetch(key, canonical, fill)


def list_objects(client, uri: str, bucket: str, prefix: str) -> list[S3Object]:
    """Every object under ``prefix/`` (ListObjectsV2, paginated), sorted by key."""
    list_prefix = f"{prefix}/" if prefix else ""
    objects: list[S3Object] = []
    with _s3_errors(client, uri, bucket, f"listing s3://{bucket}/{list_prefix}", "s3:ListBucket"):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=list_prefix):
            for item in page.get("Contents", []):
                k = item["Key"]
                if k.endswith("/") and item["Size"] == 0:
                    continue  # a "folder" marker
                objects.append(S3Object(k, k[len(list_prefix):], item["Size"], item["ETag"]))
    if not objects:
        raise SourceNotFoundError(
            f"{uri}: nothing under s3://{bucket}/{list_prefix} at {client.meta.endpoint_url}. A source names a "
            f"'directory' of objects and matches it exactly (keys under '{prefix}-v2/' or the object "
            f"'{prefix}' itself do not count): check the prefix and that the upload finished"
        )
    return sorted(objects, key=lambda o: o.key)


def _download_all(client, uri, bucket, objects, tmp, chunk_bytes, on_chunk, tty) -> list[FileRecord]:
    by_rel = {o.rel: o for o in objects}
    manifests = [by_rel[name] for name in CHECKSUM_MANIFESTS if name in by_rel]
    rest = [o for o in objects if o not in manifests]
    records: list[FileRecord] = []
    sums: dict[str, str] = {}
    with DownloadProgress(uri, sum(o.size_bytes for o in objects), len(objects), tty=tty) as progress:
        for obj in manifests + rest:  # checksum manifests first: they vouch for the rest
            progress.start(obj.rel, obj.size_bytes)
            record = _download_one(client, uri, bucket, obj, tmp, chunk_bytes, on_chunk, progress.advance)
            progress.done()
            if obj in manifests:
                where = f"s3://{bucket}/{obj.key}"
                for rel, hexsum in parse_sha256sums((tmp / obj.rel).read_text(errors="replace"), where).items():
                    if rel not in by_rel:
                        raise SourceIntegrityError(
                            f"{uri}: {obj.rel} lists '{rel}', which is not under the prefix; upload it or "
                            f"regenerate {obj.rel}"
                        )
                    if sums.setdefault(rel, hexsum) != hexsum:
                        raise SourceIntegrityError(f"{uri}: the checksum manifests disagree about '{rel}'")
            elif obj.rel in sums and sums[obj.rel] != record.sha256:
                raise SourceIntegrityError(
                    f"{uri}: '{obj.rel}' has SHA-256 {record.sha256} but the checksum manifest says "
                    f"{sums[obj.rel]}: the upload is corrupt or the manifest is stale; re-upload the model "
                    "or regenerate the manifest (sha256sum * > sha256sums)"
                )
            records.append(record)
    return records


def _download_one(client, uri, bucket, obj: S3Object, tmp, chunk_bytes, on_chunk, advance) -> FileRecord:
    where = f"s3://{bucket}/{obj.key}"
    with _s3_errors(client, uri, bucket, f"downloading {where}", "s3:GetObject"):
        resp = client.get_object(Bucket=bucket, Key=obj.key, IfMatch=obj.etag, ChecksumMode="ENABLED")
        written = 0

        def chunks() -> Iterator[bytes]:
            nonlocal written
            for chunk in resp["Body"].iter_chunks(chunk_bytes):
                yield chunk
                written += len(chunk)
                advance(len(chunk))
                if on_chunk is not None:
                    on_chunk(obj.rel, written)

        try:
            record = receive(tmp, obj.rel, chunks())
        finally:
            resp["Body"].close()
    if record.size_bytes != obj.size_bytes:
        raise SourceIntegrityError(
            f"{uri}: {where} gave {record.size_bytes} bytes, the listing said {obj.size_bytes}; retry"
        )
    expected = resp.get("ChecksumSHA256")
    if expected and resp.get("ChecksumType") != "COMPOSITE" and "-" not in expected:
        try:
            expected_hex = base64.b64decode(expected, validate=True).hex()
        except binascii.Error:
            raise SourceIntegrityError(f"{uri}: {where} has a malformed ChecksumSHA256 '{expected}'") from None
        if expected_hex != record.sha256:
            raise SourceIntegrityError(
                f"{uri}: {where} has SHA-256 {record.sha256} but S3 stored {expected_hex} (ChecksumSHA256) at "
                "upload: the transfer was corrupted; retry"
            )
    return record


_AUTH_CODES = {
    "InvalidAccessKeyId": "the access key id {key_id} is unknown to {endpoint}: set AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY or AWS_PROFILE to credentials of this account and endpoint",
    "SignatureDoesNotMatch": "the secret access key does not match access key id {key_id}: check "
    "AWS_SECRET_ACCESS_KEY (or the profile's aws_secret_access_key)",
    "ExpiredToken": "the session token of {key_id} has expired: refresh the credentials (aws sso login, a new "
    "STS session) and retry",
    "InvalidToken": "the session token of {key_id} is invalid: check AWS_SESSION_TOKEN",
    "TokenRefreshRequired": "the session token of {key_id} must be refreshed: get new credentials and retry",
    "AccessDenied": "access key id {key_id} is valid but not allowed {action} here: grant it in an IAM or "
    "bucket policy, or use credentials that have it",
    "AllAccessDisabled": "all access to this bucket is disabled: use another bucket",
}
_NOT_FOUND_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}


@contextmanager
def _s3_errors(client, uri: str, bucket: str, doing: str, action: str) -> Iterator[None]:
    """Turn botocore exceptions raised inside into SourceError subclasses with a fix in the message."""
    endpoint = client.meta.endpoint_url
    try:
        yield
    except bex.ClientError as e:
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = f"{code}: {err.get('Message', '')}".rstrip(": ")
        if code in _AUTH_CODES or status == 403:
            hint = _AUTH_CODES.get(code, _AUTH_CODES["AccessDenied"])
            raise SourceAuthError(
                f"{uri}: {doing} was refused ({detail}); "
                + hint.format(key_id=_key_id(client), endpoint=endpoint, action=action)
            ) from None
        if code == "NoSuchBucket":
            raise SourceNotFoundError(
                f"{uri}: bucket '{bucket}' does not exist at {endpoint}: "
                "check the bucket name, and AWS_ENDPOINT_URL_S3 / the region if it lives elsewhere"
            ) from None
        if code in _NOT_FOUND_CODES or status == 404:
            raise SourceNotFoundError(
                f"{uri}: {doing}: the object is gone ({detail}); the model was changed while it was being "
                "fetched: retry once the upload is complete"
            ) from None
        if code in ("PreconditionFailed", "412") or status == 412:
            raise SourceIntegrityError(
                f"{uri}: {doing}: the object changed after it was listed (ETag differs); the model is being "
                "re-uploaded: retry once the upload is complete"
            ) from None
        raise SourceError(f"{uri}: {doing} failed at {endpoint}: {detail} (HTTP {status}); retry later") from None
    except (bex.NoCredentialsError, bex.PartialCredentialsError, bex.CredentialRetrievalError) as e:
        raise SourceAuthError(
            f"{uri}: {doing}: no usable AWS credentials ({e}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE, or run with an instance role / IRSA"
        ) from None
    except bex.FlexibleChecksumError as e:
        raise SourceIntegrityError(f"{uri}: {doing}: the response failed its checksum ({e}); retry") from None
    except (bex.ConnectionError, bex.HTTPClientError) as e:
        raise SourceNetworkError(
            f"{uri}: {doing}: cannot reach the S3 endpoint {endpoint} ({type(e).__name__}: {e}). Check "
            "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, the region, proxies and the network path, then retry"
        ) from None


def _key_id(client) -> str:
    """The access key id the client signs with, shortened, and where boto3 found it ('env',
    'shared-credentials-file', 'iam-role'...); best effort, for error messages only."""
    try:
        creds = client._get_credentials()  # botocore's (private) view of the signing credentials
        key, method = creds.access_key or "", getattr(creds, "method", None)
    except Exception:
        return "(unknown)"
    shown = f"{key[:4]}...{key[-4:]}" if len(key) > 12 else key
    return f"'{shown}' (from {method})" if method else f"'{shown}'"

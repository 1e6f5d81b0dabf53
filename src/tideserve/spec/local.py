"""Settings of the embedded runtime that are not part of an endpoint.

Loaded from ``--config FILE`` (YAML), else ``$TIDESERVE_CONFIG``, else
``~/.config/tideserve/config.yaml`` when it exists, else the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from tideserve.spec.models import _Strict


class RestartPolicy(_Strict):
    """Crash restarts of a replica: backoff doubles from ``backoff_initial_s`` up to
    ``backoff_max_s``; after ``max_restarts`` restarts within ``window_s`` the pool is failed."""

    backoff_initial_s: float = Field(1.0, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    max_restarts: int = Field(5, ge=0)
    window_s: float = Field(300.0, gt=0)


class LocalConfig(_Strict):
    replica_slots: int = Field(4, ge=1, description="Most replica processes on this machine.")
    cache_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tideserve",
        description="Where fetched models and engines are kept.",
    )
    run_dir: Path | None = Field(
        None, description="Where replica logs and port files go; default a fresh temporary directory."
    )
    allowed_file_roots: list[Path] = Field(
        default_factory=list, description="file:// model sources must lie under one of these directories."
    )
    api_keys: list[str] = Field(default_factory=list, description="Accepted 'Authorization: Bearer' keys; empty = no auth.")
    api_keys_file: Path | None = Field(None, description="A file with one API key a line (added to api_keys).")
    worker_token_file: Path | None = Field(
        None, description="File holding the token every worker requires (all routes but liveness); created with a "
        "random token (mode 0600) if missing. Prometheus's worker scrape job reads it (authorization: "
        "{credentials_file: ...}). Default: <cache_dir>/worker-token.",
    )
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    cpu_threads_per_replica: int = Field(
        0, ge=0, description="Intra-op threads per CPU replica; 0 = the backend's default (all cores)."
    )
    prep_processes: int = Field(
        0, ge=0, le=64, description="Processes per replica that parse request bodies and decode audio, apart from "
        "the engine process; 0 = a quarter of the cores (1 to 8) on a CPU replica, three quarters (1 to 16) on a GPU one.",
    )
    zygote: bool = Field(
        True, description="Fork replicas from a template process that has already imported the worker's "
        "libraries (about 1 s less cold start here); false starts each replica as a fresh interpreter.",
    )
    engine_stall_s: float = Field(
        120.0, gt=0, description="A replica whose engine process has made no progress this long (one round of "
        "its loop running, or no heartbeat: stopped, hung in a device call) is taken down, its requests answered "
        "503, and restarted. A round is one decode chunk or batch admission, well under a second in service; "
        "the default leaves room for a first-use compilation.",
    )
    prep_stall_s: float = Field(
        120.0, ge=2, description="A prep process with no heartbeat this long (stopped, hung), or that has held one "
        "request this long (parsing its body, decoding its audio), is ended with the replica's other prep "
        "processes, which are replaced, and the requests they held are tried once more. Decoding an hour of "
        "compressed audio took 4-9 s on 2 idle cores here: keep it well above the longest decode.",
    )
    health_interval_s: float = Field(2.0, gt=0, description="Seconds between health checks of a ready replica.")
    ready_timeout_s: float = Field(300.0, gt=0, description="Longest a replica may take to become ready.")
    restart: RestartPolicy = Field(default_factory=RestartPolicy)

    @property
    def worker_token_path(self) -> Path:
        """Where the workers' token is kept: ``worker_token_file`` or ``<cache_dir>/worker-token``."""
        return self.worker_token_file or self.cache_dir / "worker-token"

    @field_validator("api_keys")
    @classmethod
    def _keys_have_no_blanks(cls, keys: list[str]) -> list[str]:
        for i, k in enumerate(keys):
            if not k or any(ch.isspace() for ch in k) or not k.isprintable():
                raise ValueError(f"api_keys[{i}] is empty or holds whitespace or control characters; use a random token")
        return keys

    @model_validator(mode="after")
    def _tls_pair(self) -> LocalConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set both tls_cert_file and tls_key_file, or neither")
        return self

    def all_api_keys(self) -> list[str]:
        """The configured keys plus those in ``api_keys_file`` (blank lines and # comments skipped)."""
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            for line in Path(self.api_keys_file).read_text().splitlines():
                line = line.strip(" \t\r")
                if line and not line.startswith("#") and not any(ch.isspace() for ch in line):
                    keys.append(line)
        return keys

"""``tideserve gateway --replica``: a malformed replica URL is refused at start, not turned into a
500 on every request routed to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tideserve.cli.main import app

ENDPOINT = Path(__file__).resolve().parents[3] / "examples" / "whisper-tiny-en.yaml"


@pytest.mark.parametrize("replica", ["cpu=http://[::1", "cpu=http://a b:8000", "cpu=http://127.0.0.1:99999",
                                     "cpu=http://:8000", "cpu=ftp://127.0.0.1", "cpu"])
def test_a_malformed_replica_url_is_refused(replica):
    r = CliRunner().invoke(app, ["gateway", str(ENDPOINT), "--discovery", "static", "--replica", replica])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert f"error: --replica '{replica}': write POOL=URL with a valid http(s) URL, e.g. cpu=http://127.0.0.1:8000" \
        in " ".join(r.output.split())

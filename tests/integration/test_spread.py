"""A long file spread over replicas (issue 13, ``spec.gateway.spread_min_audio_s``): the gateway
offers the replica that receives it the replicas idle at that moment; that replica cuts the file
into parts of whole windows and sends the later parts there, then answers once, with the same
transcript as one replica writes alone. A helper that cannot be reached costs nothing but time:
its part is transcribed by the receiving replica."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from endpoint import EndpointProcess, write_endpoint

MODEL = "whisper-tiny.en"
PARTS = "X-Tideserve-Parts"
POOL = {"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 2, "max": 2},
        "max_concurrency": 4, "capacity_types": ["on-demand"], "cost_usd_per_h": 0.1}


GRACE_S = 8.0  # spec.gateway.spread_part_grace_s here (default 30): the never-answering helper's wait


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spread")
    path = write_endpoint(tmp, pools=[POOL], gateway={"spread_min_audio_s": 20, "spread_part_grace_s": GRACE_S},
                          model={"decoding": {"beam_size": 1, "without_timestamps": False}})
    with EndpointProcess(path, tmp) as ep:
        yield ep


@pytest.fixture(scope="module")
def long_audio(en_clips):
    import numpy as np
    from audio import SR, Clip, encode, join_clips

    # Two runs of about 40 s (windows cut at the 1 s gaps), 3 s apart: two stretches
    # (windows.stretch_starts), and the file may be cut between them (windows.part_starts).
    half = join_clips(en_clips, repeat=4)
    samples = np.concatenate([half.samples, np.zeros(2 * SR, np.float32), half.samples])
    clip = Clip("spread", encode(samples, "wav"), f"{half.reference} {half.reference}", samples)
    assert clip.duration_s > 60
    return clip


def _form(audio: bytes, **extra: str):
    return {"files": {"file": ("a.wav", audio)},
            "data": {"model": MODEL, "response_format": "verbose_json", **extra}}


def _workers(ep: EndpointProcess) -> list[str]:
    with ep.client(timeout=10) as c:
        return sorted(f"http://{t}" for g in c.get("/admin/sd").json() for t in g["targets"])


def _direct(ep: EndpointProcess, worker: str, audio: bytes, spread: str | None = None) -> httpx.Response:
    headers = {"X-Tideserve-Token": ep.worker_token, **({"X-Tideserve-Spread": spread} if spread else {})}
    return httpx.post(worker + "/v1/audio/transcriptions", headers=headers, timeout=120, **_form(audio))


def _parts_metric(ep: EndpointProcess, placement: str) -> float:
    found = re.findall(rf'tideserve_worker_spread_parts\{{[^}}]*placement="{placement}"[^}}]*\}} (\S+)',
                       ep.worker_metrics())
    return sum(float(v) for v in found)


def _same_transcript(a: dict, b: dict) -> None:
    assert a["text"] == b["text"]
    assert [s["text"] for s in a["segments"]] == [s["text"] for s in b["segments"]]
    for x, y in zip(a["segments"], b["segments"], strict=True):
        assert x["start"] == pytest.approx(y["start"], abs=0.011) and x["end"] == pytest.approx(y["end"], abs=0.011)


def test_a_long_file_is_spread_over_the_idle_replica_with_the_same_transcript(two, long_audio):
    workers = _workers(two)
    assert len(workers) == 2
    alone = _direct(two, workers[0], long_audio.wav)  # no helpers offered: one replica, one piece
    assert alone.status_code == 200 and PARTS not in alone.headers, alone.text
    with two.client() as c:
        spread = c.post("/v1/audio/transcriptions", **_form(long_audio.wav))
    assert spread.status_code == 200, spread.text
    assert spread.headers[PARTS] == "2"  # two replicas, 80 s in two stretches, parts of at least 10 s
    assert _parts_metric(two, "helper") == 1 and _parts_metric(two, "here") == 0
    body = spread.json()
    _same_transcript(body, alone.json())
    starts = [s["start"] for s in body["segments"]]
    assert starts == sorted(starts) and body["segments"][-1]["end"] <= body["duration"] + 0.02
    assert body["duration"] == pytest.approx(long_audio.duration_s, abs=0.01)


def test_a_helper_that_cannot_be_reached_leaves_its_part_to_the_receiving_replica(two, long_audio):
    workers = _workers(two)
    before = _parts_metric(two, "here")
    r = _direct(two, workers[1], long_audio.wav, spread="http://127.0.0.1:1")  # nothing listens there
    assert r.status_code == 200 and r.headers[PARTS] == "2", r.text
    assert _parts_metric(two, "here") == before + 1
    _same_transcript(r.json(), _direct(two, workers[1], long_audio.wav).json())


def test_a_spread_stream_sends_the_parts_text_in_audio_order(two, long_audio):
    with two.client() as c:
        whole = c.post("/v1/audio/transcriptions", **_form(long_audio.wav)).json()["text"]
        r = c.post("/v1/audio/transcriptions", **_form(long_audio.wav, stream="true", response_format="json"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    deltas = "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta")
    assert deltas == whole and events[-1]["type"] == "transcript.text.done" and events[-1]["text"] == whole
    assert _parts_metric(two, "helper") == 3  # this stream's part and the whole file's went to the helper too


def test_a_compressed_file_is_spread_when_the_client_sends_its_duration(two, long_audio):
    """Opus at 48 kHz is far smaller than the 32 kB/s the gateway's estimate assumes: without
    X-Audio-Seconds it looks short and no replica is offered; with it, it is spread."""
    from audio import encode

    ogg = encode(long_audio.samples, "ogg")
    assert len(ogg) / 32_000 < 20  # the estimate from its size: under spread_min_audio_s
    with two.client() as c:
        plain = c.post("/invocations", content=ogg, headers={"Content-Type": "audio/ogg"})
        told = c.post("/invocations", content=ogg, headers={"Content-Type": "audio/ogg",
                                                            "X-Audio-Seconds": f"{long_audio.duration_s:.1f}"})
    assert plain.status_code == 200 and PARTS not in plain.headers, plain.text
    assert told.status_code == 200 and told.headers[PARTS] == "2", told.text
    assert told.json()["transcribe_text"] == plain.json()["transcribe_text"]
    # The helper's log line of its part carries the client's request id too.
    rid = told.headers["X-Request-Id"]
    lines = [json.loads(x) for x in (two.tmp / "up.log").read_text().splitlines() if x.startswith("{")]
    done = sorted(x["audio_s"] for x in lines if x.get("msg") == "transcribed" and x.get("request_id") == rid)
    assert len(done) == 2 and done[0] < done[1] == pytest.approx(long_audio.duration_s, abs=0.1)


def test_a_file_that_opens_with_silence_is_identified_in_the_part_that_holds_its_first_speech(two, en_clips):
    """25 s of digital silence, then French, spread: flagged as in one piece (the adversarial
    pass: when the first part was all silence it came back unflagged, and in reject mode answered
    200). The silence is now left out of the windows (``worker.windows.window_cuts``), so the
    first part opens with the French; a part of silence alone is covered by the unit test
    ``test_the_part_holding_the_files_first_sound_identifies_its_language``."""
    import numpy as np

    from audio import SR, _decode_wav_file, encode

    import pytest_audioeval

    french = _decode_wav_file(Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "fr" / "pangrama.wav")
    gap = np.zeros(SR, np.float32)
    run = [french, gap] * 11  # about 50 s: one stretch; two of them 3 s apart, so the file is cut between them
    samples = np.concatenate([np.zeros(25 * SR, np.float32), *run, np.zeros(2 * SR, np.float32), *run])
    wav = encode(samples, "wav")
    workers = _workers(two)
    alone = _direct(two, workers[0], wav)
    with two.client() as c:
        spread = c.post("/v1/audio/transcriptions", **_form(wav))
    assert spread.status_code == 200 and spread.headers[PARTS] == "2", spread.text
    for r in (alone, spread):
        assert r.json()["detected_language"] == "fr" and r.json()["language_mismatch"] is True, r.text
        assert r.headers["X-Tideserve-Language-Mismatch"] == "fr"


def test_a_helper_that_never_answers_is_given_up_and_its_part_transcribed_here(two, long_audio):
    """A helper that takes the connection and then says nothing (stuck, or a black hole in the
    network) costs at most the grace (spec.gateway.spread_part_grace_s, GRACE_S here: this file's
    own part takes about 2 s), then the receiving replica transcribes the part itself."""
    import socket
    import threading
    import time

    from tideserve.worker.api import PART_GRACE_MIN_S

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        before = _parts_metric(two, "here")
        t0 = time.monotonic()
        r = _direct(two, _workers(two)[0], long_audio.wav, spread=f"http://127.0.0.1:{listener.getsockname()[1]}")
        took = time.monotonic() - t0
    finally:
        listener.close()
        for s in held:
            s.close()
    assert r.status_code == 200 and r.headers[PARTS] == "2", r.text
    # the endpoint's grace, not the default's 30 s (the grace is also at least 3x this replica's own
    # part's time, about 2 s here)
    assert GRACE_S <= took < PART_GRACE_MIN_S
    assert _parts_metric(two, "here") == before + 1 and held  # the helper was reached, then given up
    _same_transcript(r.json(), _direct(two, _workers(two)[0], long_audio.wav).json())

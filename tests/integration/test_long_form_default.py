"""A long file at the endpoint's default decoding (issue 13): with ``without_timestamps`` unset, a
json request cut into several windows decodes with timestamp tokens, as its verbose_json does,
so Whisper's seek runs and both formats give the same, whole text. Before, the default (then
``true``) decoded json without them: a window whose decode stopped early lost its last sentences
(a new user's 81 s file: 3 of 24 sentences missing as json, none as verbose_json)."""

from __future__ import annotations

import pytest

from endpoint import EndpointProcess, write_endpoint

MODEL = "whisper-tiny.en"
#: ``model.decoding.without_timestamps`` of the endpoint under test (None: unset, the default).
WITHOUT_TIMESTAMPS = None


@pytest.fixture(scope="module")
def default_endpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("long-form")
    path = write_endpoint(tmp, model={"decoding": {"beam_size": 5, "without_timestamps": WITHOUT_TIMESTAMPS}})
    with EndpointProcess(path, tmp) as ep:
        yield ep


def test_a_long_files_json_text_is_its_verbose_json_text_and_whole(default_endpoint, en_clips):
    from audio import join_clips, wer

    clip = join_clips(en_clips, repeat=8, name="long-form")  # about 80 s: windows cut at the 1 s gaps
    assert clip.duration_s > 60
    texts = {}
    with default_endpoint.client(timeout=300) as c:
        for fmt in ("json", "verbose_json"):
            r = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", clip.wav)},
                       data={"model": MODEL, "response_format": fmt})
            assert r.status_code == 200, r.text
            texts[fmt] = r.json()["text"]
    assert texts["json"] == texts["verbose_json"]
    assert wer(clip.reference, texts["json"]) <= 0.05, texts["json"]

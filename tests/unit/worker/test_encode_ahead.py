"""Encoding windows ahead of their admission (``EngineLoop(encode_ahead=N)`` over a continuous
backend's ``encode_ahead``; README, The served path (21)): the loop encodes the first N windows
of the queue's round-robin while the rows decode, one pass of at most ``max_batch_size``,
admits windows only once encoded (while rows decode, only those whose pass has finished), in
the same order as without, drops them with their request, and encodes at admission for a while
when encoding ahead fails; the torch backend writes the same text from windows encoded ahead as
from windows encoded at admission."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideserve.spec.models import Decoding, Target
from tideserve.worker.backends.base import WindowTask
from tideserve.worker.engine import EngineLoop, RequestOptions
from tideserve.worker.timings import ExecutionTimings

from test_engine_loop import Clock, SlotBackend, pcm, run_until_idle, segments_of


class AheadBackend(SlotBackend):
    """A continuous backend that also encodes ahead, as the torch backend does: at most ``slots``
    windows a pass; a handle names its window's mark and is ready unless its mark is in
    ``unready``; ``admit`` records which tasks came with one."""

    def __init__(self, slots: int, steps_of, fail_ahead: bool = False) -> None:
        super().__init__(slots, steps_of)
        self.ahead_calls: list[list[int]] = []
        self.admitted_ahead: list[list[bool]] = []
        self.fail_ahead = fail_ahead
        self.unready: set[int] = set()

    def encode_ahead(self, tasks: list[WindowTask]):
        if not 0 < len(tasks) <= self.slots:
            raise ValueError(f"encode_ahead takes 1..{self.slots} windows, got {len(tasks)}")
        if self.fail_ahead:
            raise RuntimeError("CUDA out of memory")
        self.ahead_calls.append(_marks(tasks))
        return [("encoded", m) for m in _marks(tasks)], ExecutionTimings(0.0, 0.5)

    def ahead_ready(self, handle) -> bool:
        return handle[1] not in self.unready

    def admit(self, tasks):
        for t in tasks:
            assert t.ahead is None or t.ahead == ("encoded", int(t.samples[0]) // 100)
        self.admitted_ahead.append([t.ahead is not None for t in tasks])
        return super().admit(tasks)


def _marks(tasks) -> list[int]:
    return [int(t.samples[0]) // 100 for t in tasks]


def _loop(be, out, clock, n: int, max_batch: int) -> EngineLoop:
    return EngineLoop(be, Decoding(beam_size=1), max_batch_size=max_batch, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, chunk_steps=4, encode_ahead=n)


def test_windows_are_encoded_while_rows_decode_and_admitted_once_encoded() -> None:
    clock, out = Clock(), []
    be = AheadBackend(2, steps_of=lambda t: 8)
    loop = _loop(be, out, clock, 2, 2)
    for rid in range(1, 8):  # seven one-window requests, two slots
        loop.submit(rid, [(pcm(5, rid), 0.0)], RequestOptions())
    loop.run_once()  # nothing decoding and nothing encoded: encode the first two, admit nothing yet
    assert be.ahead_calls == [[1, 2]] and be.admitted == []
    loop.run_once()  # nothing decoding: admitted at once; the next two encoded beside their chunk
    assert [_marks(a) for a in be.admitted] == [[1, 2]] and be.ahead_calls[1] == [3, 4]
    assert all(p.ahead is None for p in loop.active.values())  # admitted: the handle is let go
    run_until_idle(loop, clock)
    assert [_marks(a) for a in be.admitted] == [[1, 2], [3, 4], [5, 6], [7]]
    assert be.ahead_calls == [[1, 2], [3, 4], [5, 6], [7]]
    assert all(all(a) for a in be.admitted_ahead)  # no admission encoded anything itself
    assert {rid: segments_of(out, rid) for rid in range(1, 8)} == {rid: {0: [f"w{rid}@0"]} for rid in range(1, 8)}
    stats = [m[1] for m in out if m[0] == "stats"]
    assert sum(s.encoder_s for s in stats) == pytest.approx(0.5 * 4 + 0.02 * 4)  # four passes ahead, four fills
    assert sum(s.windows for s in stats) == 7


def test_while_rows_decode_a_window_whose_pass_has_not_finished_waits() -> None:
    clock, out = Clock(), []
    be = AheadBackend(2, steps_of=lambda t: 400 if int(t.samples[0]) // 100 == 1 else 4)
    loop = _loop(be, out, clock, 2, 2)
    for rid in (1, 2, 3, 4):
        loop.submit(rid, [(pcm(5, rid), 0.0)], RequestOptions())
    loop.run_once()
    loop.run_once()  # 1 and 2 admitted; 3 and 4 encoded ahead
    be.unready = {3}
    loop.run_once()  # 2 ends (4 steps)
    loop.run_once()  # row 1 decodes: only the finished pass's window joins it
    assert [_marks(a) for a in be.admitted] == [[1, 2], [4]]
    be.unready = set()
    run_until_idle(loop, clock)
    assert [_marks(a) for a in be.admitted] == [[1, 2], [4], [3]]
    assert segments_of(out, 3) == {0: ["w3@0"]}


def _admission_order(n: int) -> list[list[int]]:
    clock, out = Clock(), []
    be = AheadBackend(2, steps_of=lambda t: 8)
    loop = _loop(be, out, clock, n, 2)
    loop.submit(1, [(pcm(30, m), 30.0 * k) for k, m in enumerate((1, 2, 3, 4, 5))], RequestOptions())
    loop.submit(7, [(pcm(5, 7), 0.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 7) == {0: ["w7@0"]}
    return [_marks(a) for a in be.admitted]


def test_encoding_ahead_keeps_the_round_robin_over_requests() -> None:
    """A short request beside a long file's five windows is admitted in the first admission, as
    without encoding ahead."""
    assert _admission_order(2) == _admission_order(0) == [[1, 7], [2, 3], [4, 5]]


def test_a_pass_takes_at_most_max_batch_size_windows() -> None:
    clock, out = Clock(), []
    be = AheadBackend(2, steps_of=lambda t: 8)
    loop = _loop(be, out, clock, 6, 2)
    for rid in range(1, 12):
        loop.submit(rid, [(pcm(5, rid), 0.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert max(len(c) for c in be.ahead_calls) == 2 and sum(map(len, be.ahead_calls)) == 11
    assert all(all(a) for a in be.admitted_ahead) and len(be.admitted) == 6


def test_a_cancelled_requests_windows_encoded_ahead_are_dropped() -> None:
    clock, out = Clock(), []
    be = AheadBackend(1, steps_of=lambda t: 8)
    loop = _loop(be, out, clock, 2, 1)
    loop.submit(1, [(pcm(5, 1), 0.0)], RequestOptions())
    loop.run_once()
    loop.run_once()  # 1 admitted
    loop.submit(2, [(pcm(30, 2), 0.0), (pcm(30, 3), 30.0)], RequestOptions())
    loop.submit(4, [(pcm(5, 4), 0.0)], RequestOptions())
    loop.run_once()
    assert be.ahead_calls[-1] == [2]  # one a pass (max_batch_size 1), the round-robin's first
    loop.cancel(2)
    assert [p.rid for p in loop.queue] == [4]
    run_until_idle(loop, clock)
    assert [_marks(a) for a in be.admitted] == [[1], [4]] and be.admitted_ahead[1] == [True]
    assert segments_of(out, 4) == {0: ["w4@0"]}


def test_when_encoding_ahead_fails_admissions_encode_then_it_is_tried_again(caplog) -> None:
    from tideserve.worker import engine

    clock, out = Clock(), []
    be = AheadBackend(1, steps_of=lambda t: 4, fail_ahead=True)
    loop = _loop(be, out, clock, 1, 1)
    for rid in (1, 2, 3):
        loop.submit(rid, [(pcm(5, rid), 0.0)], RequestOptions())
    with caplog.at_level("WARNING", logger="tideserve.worker.engine"):
        loop.run_once()
    assert "encoding 1 windows ahead failed (RuntimeError: CUDA out of memory); admissions encode their " \
           f"windows for {engine.AHEAD_RETRY_S:g} s" in caplog.text
    loop.run_once()
    assert [_marks(a) for a in be.admitted] == [[1]] and be.admitted_ahead == [[False]]
    be.fail_ahead = False
    clock.t += engine.AHEAD_RETRY_S
    run_until_idle(loop, clock)
    assert [_marks(a) for a in be.admitted] == [[1], [2], [3]] and be.ahead_calls and be.admitted_ahead[-1] == [True]
    assert all(segments_of(out, rid) == {0: [f"w{rid}@0"]} for rid in (1, 2, 3))


def test_encode_ahead_is_off_by_default_and_for_backends_without_it() -> None:
    be = AheadBackend(1, steps_of=lambda t: 4)
    assert EngineLoop(be, Decoding(beam_size=1), 1, 0.0, lambda m: None).encode_ahead == 0
    assert EngineLoop(SlotBackend(1, steps_of=lambda t: 4), Decoding(beam_size=1), 1, 0.0, lambda m: None,
                      encode_ahead=4).encode_ahead == 0
    with pytest.raises(ValueError, match="encode_ahead -1 must be >= 0"):
        EngineLoop(be, Decoding(beam_size=1), 1, 0.0, lambda m: None, encode_ahead=-1)


def test_the_torch_backend_writes_the_same_text_from_windows_encoded_ahead(tiny_en_hf_dir: Path) -> None:
    """tiny.en on the CPU: three clips admitted together, one encoded at admission and two ahead
    (in another order, and one pass for both), decode to the text of all three encoded at
    admission; a handle for no window or too many is refused."""
    import audio
    from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend

    clips = audio.load_en_clips()[:3]
    b = TorchWhisperBackend(tiny_en_hf_dir, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1), max_batch_size=4,
                            overlap_encoder=True)
    tasks = [WindowTask(samples=c.samples, timestamps=True) for c in clips]

    kept: list = []  # what the backend keeps of each admitted task: not the encoder output

    def decode(ts: list[WindowTask]) -> list[str]:
        slots, _ = b.admit(ts)
        kept.extend(b._rows[s][0].ahead for s in slots)
        got: dict[int, str] = {}
        while len(got) < len(slots):
            b.run(8)
            done, _ = b.finished()
            got.update((s, r.text) for s, r in done)
        return [got[s] for s in slots]

    want = decode(tasks)
    handles, timings = b.encode_ahead([tasks[2], tasks[1]])
    assert len(handles) == 2 and timings.infer_s > 0
    mixed = [tasks[0], WindowTask(samples=clips[1].samples, timestamps=True, ahead=handles[1]),
             WindowTask(samples=clips[2].samples, timestamps=True, ahead=handles[0])]
    assert decode(mixed) == want and all(want)
    assert kept == [None] * 6
    for bad in ([], tasks + tasks[:2]):
        with pytest.raises(ValueError, match=r"encode_ahead takes 1..4 windows"):
            b.encode_ahead(bad)


def test_the_endpoint_asks_for_it_only_with_continuous_batching() -> None:
    from pydantic import ValidationError

    from tideserve.spec.models import EndpointSpec

    def spec(backend: str, target: str, n: int) -> EndpointSpec:
        return EndpointSpec.model_validate({
            "model": {"name": "m", "backend": backend, "source": "file:///models/m", "decoding": {"beam_size": 1}},
            "batching": {"max_batch_size": 8, "encode_ahead": n},
            "pools": [{"name": "p", "accelerator": "h100" if target.startswith("cuda") else "cpu", "target": target}]})

    assert spec("torch", "cuda-sm90-bf16", 128).batching.encode_ahead == 128
    assert spec("torch", "cuda-sm90-bf16", 8).batching.encode_ahead == 8
    with pytest.raises(ValidationError, match=r"batching.encode_ahead 4 is below max_batch_size 8: admissions take "
                                              r"only windows encoded ahead"):
        spec("torch", "cuda-sm90-bf16", 4)
    assert spec("faster-whisper", "cpu-x86_64-int8", 0).batching.encode_ahead == 0
    with pytest.raises(ValidationError, match=r"batching.encode_ahead 8 needs continuous batching \(model.backend: "
                                              r"torch\); faster-whisper batches statically: set it to 0"):
        spec("faster-whisper", "cpu-x86_64-int8", 8)
    for bad in (-1, 513, "8"):
        with pytest.raises(ValidationError, match="encode_ahead"):
            spec("torch", "cuda-sm90-bf16", bad)


def test_the_engine_builds_the_backend_with_a_second_stream_when_asked(monkeypatch) -> None:
    from tideserve.spec.models import Decoding as D
    from tideserve.worker import backends
    from tideserve.worker.engine import EngineConfig, engine_main

    seen: list[dict] = []

    class Backend:
        def __init__(self, *args, **kwargs):
            seen.append(kwargs)
            raise RuntimeError("no model here")

    sent: list[tuple] = []
    monkeypatch.setattr(backends, "backend_class", lambda name: Backend)
    for n in (0, 64):
        engine_main(None, type("Out", (), {"send": staticmethod(sent.append)})(),
                    EngineConfig(backend="torch", model_dir="/nowhere", target=Target.parse("cuda-sm90-bf16"),
                                 decoding=D(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, encode_ahead=n))
    assert ["overlap_encoder" in kw for kw in seen] == [False, True] and seen[1]["overlap_encoder"] is True
    assert sent == [("failed", "RuntimeError", "no model here")] * 2

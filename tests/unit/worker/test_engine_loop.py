"""The engine loop (worker.engine.EngineLoop) with scripted backends and an injected clock:
static batches follow the dynamic-batching rule, continuous batching lets windows leave and join
independently, Whisper's fallback and seek re-enter the queue, results come back in audio order,
and a cancelled request's work is dropped."""

from __future__ import annotations

import numpy as np

from tideserve.protocol.types import Segment
from tideserve.spec.models import Decoding
from tideserve.worker.backends.base import WindowResult, WindowTask
from tideserve.worker.timings import ExecutionTimings
from tideserve.worker.engine import EngineLoop, RequestOptions

SR = 16_000


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t



def previous_text(t: WindowTask) -> str:
    """The text of a task's previous-text context (``WindowTask.previous``)."""
    return " ".join(seg.text for seg in t.previous)

def pcm(seconds: float, mark: int = 1) -> np.ndarray:
    """A 2 kHz square wave of amplitude ``mark * 100`` starting at its peak (so the first sample
    reads the mark, as in any slice starting at a multiple of 8 samples: every cut and seek
    here is): loud enough not to be digital silence, and sound in the speech band (a constant
    would be a DC offset, which ``windows.band_rms`` reads as quiet)."""
    return np.resize(np.array([1, 1, 1, 1, -1, -1, -1, -1], np.int16) * (mark * 100), int(seconds * SR))


def ok(task: WindowTask, text: str, **kw) -> WindowResult:
    return WindowResult(text=text, language="en", avg_logprob=-0.2, compression_ratio=1.0,
                        temperature=task.temperature, **kw)


class StaticBackend:
    """transcribe_batch only: text = 'w<mark>@<offset>'; records each batch."""

    languages = frozenset({"en"})

    def __init__(self) -> None:
        self.batches: list[list[WindowTask]] = []

    def transcribe_batch(self, tasks):
        self.batches.append(tasks)
        return [ok(t, f"w{int(t.samples[0]) // 100}@{t.offset_s:g}") for t in tasks], ExecutionTimings(0.1, 0.2, 0.0)


class SlotBackend:
    """A continuous backend: each admitted window decodes for ``steps_of(task)`` steps."""

    languages = frozenset({"en"})

    def __init__(self, slots: int, steps_of, result_of=None) -> None:
        self.slots = slots
        self.steps_of = steps_of
        self.result_of = result_of or (lambda t: ok(t, f"w{int(t.samples[0]) // 100}@{t.offset_s:g}"))
        self.rows: dict[int, list] = {}  # slot -> [task, steps left]
        self.admitted: list[list[WindowTask]] = []
        self.released: list[int] = []
        self.steps_run = 0

    @property
    def free_slots(self) -> int:
        return self.slots - len(self.rows)

    def admit(self, tasks):
        self.admitted.append(tasks)
        free = [s for s in range(self.slots) if s not in self.rows]
        for s, t in zip(free, tasks, strict=False):  # every free slot is listed; only len(tasks) are taken
            self.rows[s] = [t, self.steps_of(t)]
        return free[: len(tasks)], ExecutionTimings(0.01, 0.02)

    def run(self, steps):
        for _ in range(steps):
            self.steps_run += 1
            for row in self.rows.values():
                row[1] -= 1

    def finished(self):
        done = [s for s, (_, left) in self.rows.items() if left <= 0]
        return [(s, self.result_of(self.rows.pop(s)[0])) for s in done], 0.0

    def release(self, slots):
        for s in slots:
            self.rows.pop(s, None)
            self.released.append(s)


def run_until_idle(loop: EngineLoop, clock: Clock, limit: int = 1000) -> None:
    for _ in range(limit):
        if loop.idle:
            return
        if not loop.run_once():
            clock.t += loop.wait_s() or 0.0
    raise AssertionError("the engine did not become idle")


def segments_of(out: list[tuple], rid: int) -> dict[int, list[str]]:
    return {m[2]: [r.text for r in m[3]] for m in out if m[0] == "segment" and m[1] == rid}


def test_static_backend_batches_by_size_or_delay_and_round_robin_over_requests() -> None:
    clock, out, be = Clock(), [], StaticBackend()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=3, max_queue_delay_s=0.5, emit=out.append, clock=clock, stretch_s=0.0)
    loop.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 2), 30.0), (pcm(30, 3), 60.0)], RequestOptions())
    assert loop.wait_s() == 0.0  # three windows = max_batch_size: a batch now
    loop.submit(2, [(pcm(2, 9), 0.0)], RequestOptions())
    loop.run_once()
    # Round robin: request 2's only window goes in the first batch beside request 1's first two.
    assert [int(t.samples[0]) // 100 for t in be.batches[0]] == [1, 9, 2]
    assert loop.wait_s() == 0.5  # one window left: it waits for the delay
    clock.t += 0.5
    loop.run_once()
    assert [int(t.samples[0]) // 100 for t in be.batches[1]] == [3]
    assert segments_of(out, 1) == {0: ["w1@0"], 1: ["w2@30"], 2: ["w3@60"]}
    assert segments_of(out, 2) == {0: ["w9@0"]}
    stats = [m[1] for m in out if m[0] == "stats"]
    assert sum(s.executions for s in stats) == 2 and sum(s.windows for s in stats) == 4


def test_continuous_windows_leave_and_join_independently() -> None:
    clock, out = Clock(), []
    # Window "7" runs 400 steps (a loop to the token limit); the others 8 each.
    be = SlotBackend(2, steps_of=lambda t: 400 if int(t.samples[0]) // 100 == 7 else 8)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=2, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, chunk_steps=4)
    loop.submit(1, [(pcm(5, 7), 0.0)], RequestOptions())
    for rid in (2, 3, 4):
        loop.submit(rid, [(pcm(5, rid), 0.0)], RequestOptions())
    finished_at = {}
    while not loop.idle:
        loop.run_once()
        for m in out:
            if m[0] == "segment":
                finished_at.setdefault(m[1], be.steps_run)
    # The short requests went through the one free slot one after another while "7" ran.
    assert finished_at[2] == 8 and finished_at[3] == 16 and finished_at[4] == 24
    assert finished_at[1] == 400
    assert [len(a) for a in be.admitted] == [2, 1, 1]


def test_a_round_runs_the_backends_chunk_unless_the_loop_was_given_one() -> None:
    """The torch backend paces its chunk by its measured step time (``chunk_steps``); an explicit
    ``chunk_steps`` wins, and a backend without one (or None: not measured yet) gets 16."""
    runs = []
    for backend_chunk, loop_chunk, want in ((3, None, 3), (3, 5, 5), (None, None, 16), ("absent", None, 16)):
        be = SlotBackend(1, steps_of=lambda t: 40)
        if backend_chunk != "absent":
            be.chunk_steps = backend_chunk  # type: ignore[attr-defined]
        loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=1, max_queue_delay_s=0.0, emit=[].append,
                          clock=Clock(), chunk_steps=loop_chunk)
        loop.submit(1, [(pcm(5), 0.0)], RequestOptions())
        loop.run_once()
        runs.append(be.steps_run)
        assert loop.steps_per_round() == want
    assert runs == [3, 5, 16, 16]


def test_fallback_retries_at_the_next_temperature_and_keeps_the_passing_decode() -> None:
    clock, out = Clock(), []

    def result_of(t: WindowTask) -> WindowResult:
        if t.temperature < 0.4:  # a repetition loop at 0.0 and 0.2
            return WindowResult(text="la la la", language="en", avg_logprob=-0.3, compression_ratio=5.0,
                                temperature=t.temperature)
        return ok(t, f"good@{t.temperature}")

    be = SlotBackend(4, steps_of=lambda t: 3, result_of=result_of)
    loop = EngineLoop(be, Decoding(beam_size=1, temperatures=[0.0, 0.2, 0.4, 0.6]), max_batch_size=4,
                      max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(5), 0.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert [t.temperature for a in be.admitted for t in a] == [0.0, 0.2, 0.4]
    assert segments_of(out, 1) == {0: ["good@0.4"]}
    assert sum(m[1].fallbacks for m in out if m[0] == "stats") == 2


def test_seek_continues_a_window_from_its_last_segment_in_order() -> None:
    clock, out = Clock(), []

    def result_of(t: WindowTask) -> WindowResult:
        # The first part stops at 12 s of its 25 s: the rest is decoded as a second part.
        if t.offset_s == 100.0:
            return ok(t, "first", unfinished_from_s=12.0)
        return ok(t, f"rest@{t.offset_s:g}/{t.duration_s:g}s")

    be = SlotBackend(4, steps_of=lambda t: 2, result_of=result_of)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(3), 90.0), (pcm(25), 100.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: ["rest@90/3s"], 1: ["first", "rest@112/13s"]}
    assert sum(m[1].seeks for m in out if m[0] == "stats") == 1


def test_a_seek_into_a_rest_that_holds_no_speech_is_not_taken() -> None:
    """Found at beam 1 on a 5-minute file (bench/accuracy.py): a window's rest after its last
    segment held 60 ms of the last word and 0.9 s of a pause; decoded alone it came back as
    "And then we'll see you next time." The rest is decoded only when it holds 0.25 s of sound."""
    clock, out = Clock(), []
    rng = np.random.default_rng(0)
    speech = rng.normal(0, 3000, 25 * SR).astype(np.int16)
    room = rng.normal(0, 20, SR).astype(np.int16)  # about -64 dBFS
    quiet_rest = np.concatenate([speech, speech[: int(0.06 * SR)], room])
    spoken_rest = np.concatenate([speech, room, speech[: int(0.3 * SR)]])

    def result_of(t: WindowTask) -> WindowResult:
        if t.duration_s > 20:
            return ok(t, f"head@{t.offset_s:g}", unfinished_from_s=25.0)
        return ok(t, f"rest@{t.offset_s:g}")

    be = SlotBackend(4, steps_of=lambda t: 2, result_of=result_of)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(quiet_rest, 0.0), (spoken_rest, 30.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: ["head@0"], 1: ["head@30", "rest@55"]}
    assert sum(m[1].seeks for m in out if m[0] == "stats") == 1
    assert sum(m[1].quiet_rests for m in out if m[0] == "stats") == 1


def test_a_rest_after_a_seek_that_repeats_the_end_of_the_text_before_is_dropped() -> None:
    """Found on the H200 (bench/accuracy_gpu.py, 5-minute file): a counting clip's last segment
    closed early; the rest from there was decoded as "78910.", the clip's end written twice.
    A rest with other text is kept (the second window)."""
    clock, out = Clock(), []

    def result_of(t: WindowTask) -> WindowResult:
        if t.duration_s > 20:
            return ok(t, "One. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", unfinished_from_s=24.0,
                      last_segment_text="1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
                      segments=[Segment(t.offset_s, t.offset_s + 20.0, "One."),
                                Segment(t.offset_s + 20.0, t.offset_s + 24.0, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.")])
        text = "78910." if t.offset_s < 30 else "Hello world."
        return ok(t, text, segments=[Segment(t.offset_s, t.offset_s + 1.0, text)], text_end_s=1.0)

    be = SlotBackend(4, steps_of=lambda t: 2, result_of=result_of)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(25, 1), 0.0), (pcm(25, 2), 30.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    chains = {m[2]: m[3] for m in out if m[0] == "segment"}
    assert [r.text for r in chains[0]] == ["One. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", ""]
    assert chains[0][1].segments == []
    assert [r.text for r in chains[1]] == ["One. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", "Hello world."]
    assert sum(m[1].repeated_rests for m in out if m[0] == "stats") == 1


def test_a_dropped_repeated_rest_does_not_reach_the_next_windows_prompt() -> None:
    """Found in review: with conditioning on previous text, the dropped text still went into the
    prompt of the parts after it."""
    clock, out = Clock(), []

    def result_of(t: WindowTask) -> WindowResult:
        if t.duration_s > 20:
            return ok(t, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", unfinished_from_s=24.0,
                      last_segment_text="1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", text_end_s=24.0)
        return ok(t, "78910.", text_end_s=1.0)

    be = SlotBackend(4, steps_of=lambda t: 2, result_of=result_of)
    loop = EngineLoop(be, Decoding(beam_size=1, condition_on_previous_text=True), max_batch_size=4,
                      max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(25, 1), 0.0), (pcm(25, 2), 30.0)], RequestOptions())
    run_until_idle(loop, clock)
    prompts = {t.offset_s: previous_text(t) for b in be.admitted for t in b}
    assert prompts[30.0] == "1, 2, 3, 4, 5, 6, 7, 8, 9, 10."


def test_seek_parts_batched_together_each_complete_their_segment_on_a_static_backend() -> None:
    """Found on a 100 s file (three 30 s windows each seeking, one short window finishing first):
    the first seek part to finish ended the request, because the others, in the same static batch,
    were neither queued nor active, and their results were then thrown away (the client hung)."""
    clock, out = Clock(), []

    class Seeking(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            return [ok(t, "head", unfinished_from_s=26.0) if t.duration_s > 20 else ok(t, f"tail@{t.offset_s:g}")
                    for t in tasks], ExecutionTimings()

    be = Seeking()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append, clock=clock, stretch_s=0.0)
    loop.submit(1, [(pcm(30), 0.0), (pcm(30), 30.0), (pcm(30), 60.0), (pcm(10), 90.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: ["head", "tail@26"], 1: ["head", "tail@56"], 2: ["head", "tail@86"], 3: ["tail@90"]}
    assert [len(b) for b in be.batches] == [4, 3]
    assert not loop.requests


def test_cancel_drops_queued_windows_and_stops_decoding_rows() -> None:
    clock, out = Clock(), []
    be = SlotBackend(1, steps_of=lambda t: 50)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=1, max_queue_delay_s=0.0, emit=out.append, clock=clock, stretch_s=0.0)
    loop.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 2), 30.0)], RequestOptions())
    loop.submit(2, [(pcm(3, 5), 0.0)], RequestOptions())
    loop.run_once()  # request 1's first window decoding; its second and request 2's queued
    loop.cancel(1)
    assert be.released == [0] and [p.rid for p in loop.queue] == [2]
    assert loop.stats.dropped == 1  # request 1's second window, never computed
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {} and segments_of(out, 2) == {0: ["w5@0"]}


def test_a_window_that_fails_to_admit_fails_only_its_request() -> None:
    clock, out = Clock(), []
    be = SlotBackend(4, steps_of=lambda t: 2)
    real_admit = be.admit

    def admit(tasks):
        if any(int(t.samples[0]) // 100 == 66 for t in tasks):
            raise ValueError("bad prompt")
        return real_admit(tasks)

    be.admit = admit  # type: ignore[method-assign]
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(2, 66), 0.0)], RequestOptions())
    loop.submit(2, [(pcm(2, 3), 0.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert [m[:3] for m in out if m[0] == "error"] == [("error", 1, "ValueError")]
    assert segments_of(out, 2) == {0: ["w3@0"]}


def test_a_file_of_several_windows_is_decoded_with_timestamps_whatever_its_response_format() -> None:
    # Before: a json or text request (timestamps not asked) of a 1-minute file was decoded without
    # timestamp tokens, so no window could seek: bench/accuracy.py's 1-minute file came back with
    # WER 0.47 against 0.0 as verbose_json. One window, or an endpoint that sets
    # without_timestamps itself, keeps the request's choice.
    for explicit, long_file in ((None, True), (True, False), (False, False)):
        clock, out, be = Clock(), [], StaticBackend()
        loop = EngineLoop(be, Decoding(beam_size=1, without_timestamps=explicit), max_batch_size=4,
                          max_queue_delay_s=0.0, emit=out.append, clock=clock, stretch_s=0.0)
        loop.submit(1, [(pcm(30, 1), 0.0), (pcm(20, 2), 30.0)], RequestOptions())
        loop.submit(2, [(pcm(5, 3), 0.0)], RequestOptions())
        loop.submit(3, [(pcm(5, 4), 0.0)], RequestOptions(timestamps=True))
        run_until_idle(loop, clock)
        asked = {int(t.samples[0]) // 100: t.timestamps for b in be.batches for t in b}
        assert asked == {1: long_file, 2: long_file, 3: False, 4: True}, explicit
        assert segments_of(out, 1) == {0: ["w1@0"], 1: ["w2@30"]}


def test_digital_silence_is_answered_empty_without_the_model() -> None:
    # Before: 10 s of digital silence came back as "You" (the model's hallucination).
    clock, out = Clock(), []
    be = SlotBackend(4, steps_of=lambda t: 2)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    quiet = np.zeros(10 * SR, np.int16)
    quiet[::1000] = 20  # dither far below -60 dBFS
    loop.submit(1, [(quiet, 0.0)], RequestOptions())
    loop.submit(2, [(pcm(3, 5), 0.0), (np.zeros(SR, np.int16), 3.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: [""]}
    assert segments_of(out, 2) == {0: ["w5@0"], 1: [""]}
    assert [int(t.samples[0]) // 100 for a in be.admitted for t in a] == [5]  # only the speech reached the model


def test_prep_judges_digital_silence_per_window_and_the_engine_trusts_it() -> None:
    import io
    import wave

    from tideserve.protocol.types import TranscriptionRequest
    from tideserve.worker.prep import prepare_audio

    def prepared(x: np.ndarray):
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SR)
            w.writeframes(x.tobytes())
        return prepare_audio(TranscriptionRequest(audio=buf.getvalue()), None)

    # Silence after sound is left out of the windows (longer than 2 s; 0.4 s of it kept, after the
    # one frame the band filter's ring makes sound)...
    sound = prepared(np.concatenate([pcm(29.0, 40), np.zeros(int(11.5 * SR), np.int16)]))
    assert sound.cuts == ((0, int(29.5 * SR)),) and sound.silent == (False,) and sound.duration_s == 40.5
    # ...and audio of nothing but silence is cut whole, each window judged silent here.
    silence = prepared(np.zeros(40 * SR, np.int16))
    assert len(silence.cuts) == 2 and silence.silent == (True, True)
    assert [f for _, _, f in silence.segments()] == [True, True]
    clock, out = Clock(), []
    be = SlotBackend(4, steps_of=lambda t: 2)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, sound.segments(), RequestOptions())
    loop.submit(2, silence.segments(), RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: ["w40@0"]} and segments_of(out, 2) == {0: [""], 1: [""]}
    assert len([t for a in be.admitted for t in a]) == 1  # the silent windows never reach the model


def _handed(loop: EngineLoop, rid: int, marks: list[int]) -> None:
    """A prep process's ``("audio", ...)`` message: one array, a 5 s window per mark."""
    x = np.concatenate([pcm(5, m) for m in marks])
    cuts = tuple((k * 5 * SR, (k + 1) * 5 * SR) for k in range(len(marks)))
    assert loop.handle(("audio", rid, x, cuts, (False,) * len(marks)))


def test_audio_from_a_prep_process_joins_its_start_in_either_order() -> None:
    clock, out = Clock(), []
    be = SlotBackend(4, steps_of=lambda t: 2)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock, stretch_s=0.0)
    _handed(loop, 1, [3, 4])  # audio first
    assert loop.idle and loop.waiting_halves == 1
    loop.handle(("start", 1, RequestOptions()))
    loop.handle(("start", 2, RequestOptions()))  # start first
    assert loop.waiting_halves == 1
    _handed(loop, 2, [5])
    assert loop.waiting_halves == 0
    run_until_idle(loop, clock)
    # Windows keep their offsets within the one array the prep process sent.
    assert segments_of(out, 1) == {0: ["w3@0"], 1: ["w4@5"]}
    assert segments_of(out, 2) == {0: ["w5@0"]}


def test_a_dropped_or_cancelled_request_leaves_nothing_behind_whichever_half_comes_first() -> None:
    clock, out = Clock(), []
    be = SlotBackend(4, steps_of=lambda t: 2)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    _handed(loop, 1, [3])
    loop.handle(("drop", 1))  # refused after its audio arrived (the front's budget check)
    loop.handle(("drop", 2))  # refused before its audio arrived: remembered until it does
    assert loop.waiting_halves == 1
    _handed(loop, 2, [4])
    loop.handle(("start", 3, RequestOptions()))
    loop.handle(("cancel", 3))  # the client went away before the audio came
    _handed(loop, 3, [5])
    assert loop.waiting_halves == 0 and loop.idle
    run_until_idle(loop, clock)
    assert be.admitted == [] and [m for m in out if m[0] in ("segment", "error")] == []


class ManualStarter:
    """A ``Starter`` whose batches end when the test says (as model instances on threads would)."""

    def __init__(self) -> None:
        self.pending: list[tuple] = []
        self.lanes: list[bool] = []  # background or not, per batch started

    def __call__(self, run, done, background=False) -> None:
        self.pending.append((run, done))
        self.lanes.append(background)

    def end(self, i: int = 0) -> None:
        from tideserve.worker.engine import start_inline

        start_inline(*self.pending.pop(i))


class LaneBackend(StaticBackend):
    """A static backend with a background lane: records the lane of each batch."""

    background_lane = True

    def __init__(self) -> None:
        super().__init__()
        self.lanes: list[bool] = []

    def transcribe_batch(self, tasks, background=False):
        self.lanes.append(background)
        return super().transcribe_batch(tasks)


def test_instances_run_batches_at_once_and_keep_the_last_one_for_a_newcomer():
    # A long file (4 windows, more than a batch of 2) and three instances: it may take two
    # instances, not the third, in the background lane; a short request arriving while both run
    # starts at once on the third, in the foreground, and is answered first.
    be, out, clock = LaneBackend(), [], Clock()
    starter, woken = ManualStarter(), []
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=2, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, instances=3, start=starter, wake=lambda: woken.append(1), stretch_s=0.0)
    loop.submit(1, [(pcm(30, 1), 30.0 * k) for k in range(4)], RequestOptions())
    assert loop.run_once()
    assert len(starter.pending) == 2 and len(loop.executing) == 2
    assert loop.wait_s() is None  # nothing may start: the loop sleeps until a message or a wake
    assert not loop.run_once()
    loop.submit(2, [(pcm(1, 2), 0.0)], RequestOptions())
    assert loop.wait_s() == 0.0
    loop.run_once()
    assert len(starter.pending) == 3
    starter.end(2)  # the short request's batch (started last) ends first
    assert woken == [1] and loop.wait_s() == 0.0
    loop.run_once()
    assert segments_of(out, 2) == {0: ["w2@0"]}
    assert segments_of(out, 1) == {}
    starter.end(0)
    starter.end(0)
    loop.run_once()
    assert segments_of(out, 1) == {0: ["w1@0"], 1: ["w1@30"], 2: ["w1@60"], 3: ["w1@90"]}
    assert loop.idle
    assert [len(b) for b in be.batches] == [1, 2, 2]  # in the order they ran: the short one first
    assert starter.lanes == [True, True, False]  # in the order they started
    assert be.lanes == [False, True, True]


def test_a_backend_without_a_background_lane_is_called_as_before():
    be, out, clock, starter = StaticBackend(), [], Clock(), ManualStarter()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=1, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, instances=2, start=starter, stretch_s=0.0)
    loop.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 1), 30.0)], RequestOptions())
    loop.run_once()
    assert starter.lanes == [True]  # a long caller's batch, on the background thread
    starter.end()  # StaticBackend.transcribe_batch takes no ``background``: a TypeError would fail it
    loop.run_once()
    assert starter.lanes == [True, False]  # its last window fits one batch: a short caller now
    starter.end()
    loop.run_once()
    assert segments_of(out, 1) == {0: ["w1@0"], 1: ["w1@30"]} and loop.idle


def test_an_instance_failure_fails_only_its_own_request():
    class Failing(StaticBackend):
        def transcribe_batch(self, tasks):
            if any(int(t.samples[0]) == 300 for t in tasks):
                raise RuntimeError("bad window")
            return super().transcribe_batch(tasks)

    be, out, clock, starter = Failing(), [], Clock(), ManualStarter()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=1, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, instances=2, start=starter)
    loop.submit(1, [(pcm(2, 1), 0.0)], RequestOptions())
    loop.submit(3, [(pcm(2, 3), 0.0)], RequestOptions())
    loop.run_once()
    assert len(starter.pending) == 2
    starter.end(1)
    starter.end(0)
    loop.run_once()
    assert segments_of(out, 1) == {0: ["w1@0"]}
    assert [m[1:3] for m in out if m[0] == "error"] == [(3, "RuntimeError")]
    assert loop.idle


def test_a_failed_batch_runs_again_one_window_per_batch_scheduled_as_any_batch():
    """Found in review: a failed batch's windows ran again one by one on the engine loop's own
    thread, holding every other request meanwhile. Now each goes back to the queue to run in a
    batch of its own, within the instances, and a cancelled one never runs; only the bad
    window's request fails."""
    class Failing(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            if any(int(t.samples[0]) == 300 for t in tasks):
                raise RuntimeError("bad window")
            return [ok(t, f"w{int(t.samples[0]) // 100}@{t.offset_s:g}") for t in tasks], ExecutionTimings()

    be, out, clock, starter = Failing(), [], Clock(), ManualStarter()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, instances=2, start=starter)
    for rid in (1, 2, 3, 4):
        loop.submit(rid, [(pcm(2, rid), 0.0)], RequestOptions())
    loop.run_once()
    assert len(starter.pending) == 1
    starter.end()  # the batch of four fails
    loop.run_once()
    assert [len(b) for b in be.batches] == [4]  # nothing ran on the loop's thread
    assert len(starter.pending) == 2 and len(loop.queue) == 2  # one window per instance, two waiting
    loop.cancel(4)  # a window still waiting to run alone is dropped
    starter.end()
    starter.end()
    loop.run_once()
    starter.end()
    loop.run_once()
    assert [[int(t.samples[0]) // 100 for t in b] for b in be.batches] == [[1, 2, 3, 4], [1], [2], [3]]
    assert segments_of(out, 1) == {0: ["w1@0"]} and segments_of(out, 2) == {0: ["w2@0"]}
    assert [m[1:3] for m in out if m[0] == "error"] == [(3, "RuntimeError")]
    assert loop.idle and not starter.pending
    loop.submit(5, [(pcm(2, 5), 0.0)], RequestOptions())
    loop.submit(6, [(pcm(2, 6), 0.0)], RequestOptions())
    loop.run_once()
    starter.end()
    loop.run_once()
    assert [len(b) for b in be.batches][-1] == 2  # later batches are whole again


def test_a_cancelled_request_still_executing_is_answered_nothing():
    be, out, clock, starter = StaticBackend(), [], Clock(), ManualStarter()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, instances=2, start=starter)
    loop.submit(1, [(pcm(2, 1), 0.0)], RequestOptions())
    loop.run_once()
    loop.cancel(1)
    starter.end()
    loop.run_once()
    assert [m for m in out if m[0] in ("segment", "error")] == [] and loop.idle


def test_threaded_instances_answer_every_request():
    # The real ThreadStarter: the wake callback fires from the instance's thread.
    import threading

    be, out = StaticBackend(), []
    woke = threading.Event()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=2, max_queue_delay_s=0.0, emit=out.append,
                      instances=3, wake=woke.set)
    for rid in range(1, 6):
        loop.submit(rid, [(pcm(1, rid), 0.0)], RequestOptions())
    for _ in range(100):
        if loop.idle:
            break
        if loop.wait_s() is None:
            assert woke.wait(10)
        woke.clear()
        loop.run_once()
    loop.close()
    assert loop.idle
    assert {rid: segments_of(out, rid) for rid in range(1, 6)} == {rid: {0: [f"w{rid}@0"]} for rid in range(1, 6)}


def test_conditioning_on_previous_text_decodes_a_files_windows_in_order_each_prompted_with_the_text_so_far():
    # Three windows; the second seeks once (its first decode ends at 10 s). Each decode's prompt
    # is the client's prompt, then everything decoded before it, in audio order (here text
    # without segments: each decode's text is one piece of the context).
    class Seeking(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            out = []
            for t in tasks:
                mark = int(t.samples[0]) // 100
                seek = 10.0 if mark == 2 and t.offset_s == 30.0 else None
                out.append(ok(t, f"w{mark}@{t.offset_s:g}", unfinished_from_s=seek))
            return out, ExecutionTimings(0.1, 0.2, 0.0)

    be, out, clock = Seeking(), [], Clock()
    loop = EngineLoop(be, Decoding(beam_size=1, condition_on_previous_text=True), max_batch_size=8,
                      max_queue_delay_s=0.0, emit=out.append, clock=clock, stretch_s=0.0)
    loop.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 2), 30.0), (pcm(30, 3), 60.0)], RequestOptions(prompt="Glossary:"))
    loop.submit(2, [(pcm(5, 4), 0.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert [len(b) for b in be.batches] == [2, 1, 1, 1]  # request 1's windows one at a time; request 2 beside
    prompts = [(t.offset_s, t.prompt, previous_text(t)) for b in be.batches for t in b if int(t.samples[0]) // 100 != 4]
    assert prompts == [(0.0, "Glossary:", ""), (30.0, "Glossary:", "w1@0"), (40.0, "Glossary:", "w1@0 w2@30"),
                       (60.0, "Glossary:", "w1@0 w2@30 w2@40")]
    assert segments_of(out, 1) == {0: ["w1@0"], 1: ["w2@30", "w2@40"], 2: ["w3@60"]}
    assert segments_of(out, 2) == {0: ["w4@0"]}


def two_conditioned_windows(backend, out: list) -> None:
    """Decode two 30 s windows of one request on ``backend``, conditioning on previous text, with
    the temperatures 0.0 and 0.6; messages into ``out``."""
    clock = Clock()
    loop = EngineLoop(backend, Decoding(beam_size=1, condition_on_previous_text=True, temperatures=[0.0, 0.6]),
                      max_batch_size=8, max_queue_delay_s=0.0, emit=out.append, clock=clock, stretch_s=0.0)
    loop.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 2), 30.0)], RequestOptions())
    run_until_idle(loop, clock)


def test_conditioning_resets_after_a_decode_over_temperature_half():
    class Hot(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            # window 1 fails at 0.0 and is accepted at 0.6 (over 0.5: the prompt resets)
            return [WindowResult(text=f"w{int(t.samples[0]) // 100}t{t.temperature:g}", language="en",
                                 avg_logprob=-0.2, temperature=t.temperature,
                                 compression_ratio=3.0 if int(t.samples[0]) == 100 and t.temperature == 0 else 1.0)
                    for t in tasks], ExecutionTimings(0.1, 0.2, 0.0)

    be, out = Hot(), []
    two_conditioned_windows(be, out)
    assert [(t.temperature, t.prompt, t.previous) for b in be.batches for t in b] == [(0.0, None, ()), (0.6, None, ()),
                                                                                    (0.0, None, ())]
    assert segments_of(out, 1) == {0: ["w1t0.6"], 1: ["w2t0"]}


def test_conditioning_resets_when_every_temperature_failed_and_an_earlier_attempt_is_kept():
    """Found in review: the reset looked at the kept attempt's temperature (0.0 here: its mean
    log-probability is the best), not the last one tried, which faster-whisper uses."""
    class Failing(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            # Window 1 is under the log-probability threshold (-1.0) at both temperatures.
            return [WindowResult(text=f"w{int(t.samples[0]) // 100}t{t.temperature:g}", language="en",
                                 avg_logprob=(-1.2 if t.temperature == 0 else -1.5) if int(t.samples[0]) == 100
                                 else -0.2, temperature=t.temperature, compression_ratio=1.0)
                    for t in tasks], ExecutionTimings(0.1, 0.2, 0.0)

    be, out = Failing(), []
    two_conditioned_windows(be, out)
    assert segments_of(out, 1) == {0: ["w1t0"], 1: ["w2t0"]}  # the t=0 attempt of window 1 is kept
    assert [(t.temperature, previous_text(t)) for b in be.batches for t in b] == [(0.0, ""), (0.6, ""), (0.0, "")]


def test_a_window_that_loops_to_its_end_is_decoded_again_as_two_halves_cut_at_its_pause():
    # 24 s of speech with a 1 s pause at 12-13 s. The whole window "loops" (compression 7.6, no
    # seek: one segment repeating inside itself); each half decodes fine. The loop's text is
    # dropped and the halves' texts come back in order, in the same segment.
    speech = pcm(24, 5)
    speech[12 * SR: 13 * SR] = 0

    class Looping(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            return [WindowResult(text="loop" if t.duration_s > 20 else f"half@{t.offset_s:g}", language="en",
                                 avg_logprob=-0.2, temperature=t.temperature,
                                 compression_ratio=7.6 if t.duration_s > 20 else 1.2,
                                 looping_segment=t.duration_s > 20) for t in tasks], \
                ExecutionTimings(0.1, 0.2, 0.0)

    be, out, clock = Looping(), [], Clock()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(speech, 60.0)], RequestOptions())
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: ["half@60", "half@72.5"]}  # cut in the middle of the pause
    assert [[round(t.duration_s, 1) for t in b] for b in be.batches] == [[24.0], [12.5], [11.5]]
    assert sum(m[1].splits for m in out if m[0] == "stats") == 1


def test_a_short_window_or_a_twice_split_one_is_accepted_as_it_is():
    class AlwaysLoops(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            return [WindowResult(text=f"loop{t.duration_s:g}", language="en", avg_logprob=-0.2,
                                 temperature=t.temperature, compression_ratio=7.6, looping_segment=True)
                    for t in tasks], \
                ExecutionTimings(0.1, 0.2, 0.0)

    be, out, clock = AlwaysLoops(), [], Clock()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(9, 1), 0.0)], RequestOptions())  # under MIN_SPLIT_S: kept
    loop.submit(2, [(pcm(30, 2), 0.0)], RequestOptions())  # 30 s -> two halves -> four quarters, no deeper
    run_until_idle(loop, clock)
    assert segments_of(out, 1) == {0: ["loop9"]}
    assert len(segments_of(out, 2)[0]) == 4
    assert sum(m[1].splits for m in out if m[0] == "stats") == 3


class Resuming(StaticBackend):
    """A backend that ``resumes``: a first decode of a window over 20 s stops at 21 s and keeps
    its encoder output (a marker array); ``rest_of(task)`` answers the resumed task."""

    resumes = True

    def __init__(self, rest_of) -> None:
        super().__init__()
        self.rest_of = rest_of

    def transcribe_batch(self, tasks):
        self.batches.append(tasks)
        out = []
        for t in tasks:
            if t.resume is not None:
                out.append(self.rest_of(t))
            elif t.duration_s > 20:
                out.append(ok(t, "head", unfinished_from_s=21.0, text_end_s=21.0, encoded=np.full(4, t.offset_s),
                              last_segment_text="head"))
            else:
                out.append(ok(t, f"fresh@{t.offset_s:g}/{t.duration_s:g}s"))
        return out, ExecutionTimings()


def _resumed_run(rest_of, decoding: Decoding | None = None) -> tuple[list[tuple], Resuming]:
    clock, out = Clock(), []
    decoding = decoding or Decoding(beam_size=1)
    be = Resuming(rest_of)
    loop = EngineLoop(be, decoding, max_batch_size=4, max_queue_delay_s=0.0, emit=out.append, clock=clock)
    loop.submit(1, [(pcm(25), 100.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert not loop.requests
    return out, be


def test_a_rest_after_a_seek_is_decoded_over_the_windows_kept_encoder_output() -> None:
    out, be = _resumed_run(lambda t: ok(t, f"rest from {t.resume.from_s:g}", text_end_s=25.0, last_word_end_s=25.0))
    (resumed,) = [t for b in be.batches for t in b if t.resume is not None]
    # the whole window, at its own offset, from the seek point, over the first decode's encoder output
    assert (resumed.offset_s, resumed.duration_s, resumed.resume.from_s) == (100.0, 25.0, 21.0)
    assert resumed.resume.encoded.tolist() == [100.0] * 4
    chains = [m[3] for m in out if m[0] == "segment"]
    assert [r.text for r in chains[0]] == ["head", "rest from 21"]
    assert all(r.encoded is None for r in chains[0])  # the encoder output never leaves the engine
    stats = [m[1] for m in out if m[0] == "stats"]
    assert sum(s.resumed_rests for s in stats) == 1 and sum(s.seeks for s in stats) == 1


def test_a_resumed_rest_that_leaves_speech_untranscribed_is_decoded_again_from_its_own_audio() -> None:
    """Found on bench/accuracy.py's long files: resumed rests that stopped after "The Quick
    Brown Fox" or closed a segment over the next clip's "Hello world" lost words. A resumed rest
    is kept only when no speech follows its last word; otherwise the rest is decoded from its
    own audio, as without resuming."""
    out, be = _resumed_run(lambda t: ok(t, "rest", text_end_s=22.0))  # 3 s of sound left after it
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "fresh@121/4s"]
    # closed at the window's end, but its last word ends at 22 s (the alignment): speech left
    out, be = _resumed_run(lambda t: ok(t, "rest", text_end_s=25.0, last_word_end_s=22.0))
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "fresh@121/4s"]
    out, be = _resumed_run(lambda t: ok(t, "rest", text_end_s=22.0, last_word_end_s=24.9))
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "rest"]
    out, be = _resumed_run(lambda t: ok(t, ""))  # wrote nothing
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "fresh@121/4s"]
    assert sum(m[1].redone_rests for m in out if m[0] == "stats") == 1
    # a resumed rest that seeks on is kept, and its own rest resumed in turn
    out, be = _resumed_run(lambda t: ok(t, "rest", text_end_s=23.0, unfinished_from_s=23.0, last_word_end_s=22.9,
                                        encoded=np.zeros(4))
                           if t.resume.from_s == 21.0 else ok(t, "last", text_end_s=25.0, last_word_end_s=25.0))
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "rest", "last"]
    assert [t.resume.from_s for b in be.batches for t in b if t.resume is not None] == [21.0, 23.0]


def test_a_resumed_rest_that_writes_the_segment_before_it_again_is_decoded_from_its_own_audio() -> None:
    # The adversarial find (a sentence between ticks came back twice): the rest is compared with
    # the last segment of the decode that sought, letters and digits only.
    out, _ = _resumed_run(lambda t: ok(t, " Head.", text_end_s=25.0, last_word_end_s=25.0))
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "fresh@121/4s"]
    out, _ = _resumed_run(lambda t: ok(t, " Head, tail.", text_end_s=25.0, last_word_end_s=25.0))
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", " Head, tail."]


def test_a_resumed_rest_that_loops_is_decoded_again_from_its_own_audio() -> None:
    loop = lambda t: ok(t, "9 9 9 9", looping_segment=True, loop_free_text="", text_end_s=25.0)  # noqa: E731
    out, _ = _resumed_run(loop, Decoding(beam_size=1, compression_ratio_threshold=2.4))
    assert [r.text for m in out if m[0] == "segment" for r in m[3]] == ["head", "fresh@121/4s"]


def test_the_thread_starters_background_lane_runs_lowered():
    import os
    import threading

    from tideserve.worker.engine import ThreadStarter

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base, seen, done = nice(), [], threading.Event()
    starter = ThreadStarter(3, background_nice=4)
    try:
        for background in (False, True, False):
            done.clear()
            starter(nice, lambda v: (seen.append(v), done.set()), background)
            assert done.wait(10)
    finally:
        starter.close()
    assert seen == [base, min(19, base + 4), base]


# --- stretches: a file's windows as transcribe lays them (engine.STRETCH_S) ---------------------


class SeeksAt26(StaticBackend):
    """Every full 30 s window ends its decode at 26 s (an unfinished last segment: Whisper's seek);
    a shorter one is done."""

    def transcribe_batch(self, tasks):
        self.batches.append(tasks)
        # As the faster-whisper backend does, a decode that seeks keeps its encoder output for
        # a resumed rest (``encoded``); inside a stretch the next window is encoded afresh.
        return [ok(t, f"w@{t.offset_s:g}+{t.duration_s:g}", unfinished_from_s=26.0 if t.duration_s >= 30 else None,
                   encoded=object() if t.duration_s >= 30 else None)
                for t in tasks], ExecutionTimings(0.1, 0.2, 0.0)


def test_a_stretch_is_decoded_in_transcribes_windows_each_from_the_last_ones_seek_point() -> None:
    # Three contiguous 25 s segments (75 s): one stretch. transcribe's windows: 0-30, seek 26 ->
    # 26-56, seek 52 -> 52-75 (done). Apart, each segment would be decoded from its own start.
    clock, out, be = Clock(), [], SeeksAt26()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=75.0)
    loop.submit(1, [(pcm(25, 1), 0.0), (pcm(25, 1), 25.0), (pcm(25, 1), 50.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert [[(t.offset_s, t.duration_s) for t in b] for b in be.batches] == [[(0.0, 30.0)], [(26.0, 30.0)],
                                                                           [(52.0, 23.0)]]
    assert all(t.resume is None for b in be.batches for t in b)
    assert segments_of(out, 1) == {0: ["w@0+30", "w@26+30", "w@52+23"], 1: [""], 2: [""]}
    # The joined segments are answered when their stretch is complete, after it, not at submit.
    order = [m[2] for m in out if m[0] == "segment"]
    assert order == [0, 1, 2]
    assert sum(m[1].seeks for m in out if m[0] == "stats") == 2 and not loop.requests


def test_a_streamed_stretch_sends_its_chain_so_far_after_each_window_a_plain_request_does_not() -> None:
    # Found by the adversarial helper: a streamed 7-minute file sent its first delta at 16.2 s of
    # 16.9 s; a stretch's text came only with its last window.
    for stream in (True, False):
        clock, out, be = Clock(), [], SeeksAt26()
        loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append,
                          clock=clock, stretch_s=75.0)
        loop.submit(1, [(pcm(25, 1), 0.0), (pcm(25, 1), 25.0), (pcm(25, 1), 50.0)],
                    RequestOptions(timestamps=True, stream=stream))
        run_until_idle(loop, clock)
        sent = [(m[0], m[2], [r.text for r in m[3]]) for m in out if m[0] in ("partial", "segment")]
        chain = ["w@0+30", "w@26+30", "w@52+23"]
        partials = [("partial", 0, chain[:1]), ("partial", 0, chain[:2])] if stream else []
        assert sent == [*partials, ("segment", 0, chain), ("segment", 1, [""]), ("segment", 2, [""])]


def test_a_run_of_speech_up_to_the_stretch_length_is_one_stretch_a_longer_run_and_silence_are_not() -> None:
    clock, out, be = Clock(), [], StaticBackend()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=60.0)
    silent = np.zeros(2 * SR, np.int16)
    # Runs (windows.window_runs): 0-40 s (20+20, joined: 40 <= 60); after a gap 45-110 s (25+25+15:
    # 65 > 60, so decoded window by window); a silent segment; 112-117 s.
    loop.submit(1, [(pcm(20, 1), 0.0), (pcm(20, 2), 20.0), (pcm(25, 3), 45.0), (pcm(25, 4), 70.0),
                    (pcm(15, 5), 95.0), (silent, 110.0), (pcm(5, 6), 112.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    starts = sorted((t.offset_s, t.duration_s) for b in be.batches for t in b)
    assert starts == [(0.0, 30.0), (30.0, 10.0), (45.0, 25.0), (70.0, 25.0), (95.0, 15.0), (112.0, 5.0)]
    assert segments_of(out, 1) == {0: ["w1@0", "w2@30"], 1: [""], 2: ["w3@45"], 3: ["w4@70"], 4: ["w5@95"],
                                   5: [""], 6: ["w6@112"]}
    # Without timestamp tokens a window cannot seek: every segment is decoded apart, as cut.
    be2, out2 = StaticBackend(), []
    loop2 = EngineLoop(be2, Decoding(beam_size=1, without_timestamps=True), max_batch_size=8, max_queue_delay_s=0.0,
                       emit=out2.append, clock=clock, stretch_s=60.0)
    loop2.submit(1, [(pcm(20, 1), 0.0), (pcm(20, 2), 20.0)], RequestOptions(timestamps=False))
    run_until_idle(loop2, clock)
    assert sorted((t.offset_s, t.duration_s) for b in be2.batches for t in b) == [(0.0, 20.0), (20.0, 20.0)]


def test_a_segment_longer_than_a_window_is_decoded_to_its_end_not_cut_at_30_s() -> None:
    # Before stretches a part longer than 30 s went to the backend whole, which reads 30 s of it.
    clock, out, be = Clock(), [], StaticBackend()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=0.0)
    loop.submit(1, [(pcm(70, 1), 0.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert [(t.offset_s, t.duration_s) for b in be.batches for t in b] == [(0.0, 30.0), (30.0, 30.0), (60.0, 10.0)]
    assert segments_of(out, 1) == {0: ["w1@0", "w1@30", "w1@60"]}


def test_a_loop_split_inside_a_stretch_decodes_both_halves_then_goes_on_into_the_stretch() -> None:
    # The stretch's first window loops (compression 7.6, one segment repeating): it is decoded
    # again as two halves cut at its pause, and the stretch then continues from 30 s.
    speech = np.concatenate([pcm(12, 5), np.zeros(SR, np.int16), pcm(17, 5), pcm(20, 6)])

    class LoopsOnce(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            res = []
            for t in tasks:
                if t.offset_s == 0.0 and t.duration_s == 30.0:
                    res.append(WindowResult(text="loop", language="en", avg_logprob=-0.2, compression_ratio=7.6,
                                            temperature=t.temperature, looping_segment=True))
                else:
                    res.append(ok(t, f"w@{t.offset_s:g}+{t.duration_s:g}"))
            return res, ExecutionTimings(0.1, 0.2, 0.0)

    clock, out, be = Clock(), [], LoopsOnce()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=60.0)
    loop.submit(1, [(speech[: 30 * SR], 0.0), (speech[30 * SR:], 30.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    parts = [(t.offset_s, round(t.duration_s, 1)) for b in be.batches for t in b]
    assert parts == [(0.0, 30.0), (0.0, 12.5), (12.5, 17.5), (30.0, 20.0)]  # cut in the middle of the pause
    assert segments_of(out, 1) == {0: ["w@0+12.5", "w@12.5+17.5", "w@30+20"], 1: [""]}
    assert sum(m[1].splits for m in out if m[0] == "stats") == 1


def test_a_seek_whose_rest_to_the_stretchs_end_is_quiet_ends_the_stretch() -> None:
    # Found in review: inside a stretch the quiet-tail rule was skipped, so a seek 0.1 s before a
    # 5 s stretch end of low noise (after its speech) decoded that noise as a window of its own,
    # where Whisper invents a sentence. Now the stretch's last window, from a seek, must hold
    # speech (longform.tail_holds_speech), as the rest of a window decoded apart must.
    loud = pcm(30, 30)
    quiet = np.resize(np.array([1, 1, 1, 1, -1, -1, -1, -1], np.int16) * 40, 5 * SR)

    class SeeksLate(StaticBackend):
        def transcribe_batch(self, tasks):
            self.batches.append(tasks)
            return [ok(t, f"w@{t.offset_s:g}", unfinished_from_s=29.9 if t.duration_s == 30 else None)
                    for t in tasks], ExecutionTimings(0.1, 0.2, 0.0)

    clock, out, be = Clock(), [], SeeksLate()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=75.0)
    loop.submit(1, [(loud, 0.0), (quiet, 30.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert [(t.offset_s, t.duration_s) for b in be.batches for t in b] == [(0.0, 30.0)]
    assert segments_of(out, 1) == {0: ["w@0"], 1: [""]} and not loop.requests
    assert sum(m[1].quiet_rests for m in out if m[0] == "stats") == 1
    # With speech in it, the same seek decodes the stretch's last window from 29.9 s.
    be2, out2 = SeeksLate(), []
    loop2 = EngineLoop(be2, Decoding(beam_size=1), max_batch_size=8, max_queue_delay_s=0.0, emit=out2.append,
                       clock=clock, stretch_s=75.0)
    loop2.submit(1, [(loud, 0.0), (pcm(5, 30), 30.0)], RequestOptions(timestamps=True))
    run_until_idle(loop2, clock)
    assert [(t.offset_s, round(t.duration_s, 1)) for b in be2.batches for t in b] == [(0.0, 30.0), (29.9, 5.1)]


def test_a_stretch_on_a_continuous_backend_and_cancelled_in_its_middle() -> None:
    # The torch backend's path (admit/run/finished): a 60 s stretch decodes its two windows one
    # after another beside another request; cancelled after its first window, nothing of it is
    # answered and its second window never runs.
    def seeks_at_26(t: WindowTask) -> WindowResult:
        return ok(t, f"w@{t.offset_s:g}", unfinished_from_s=26.0 if t.duration_s >= 30 else None)

    clock, out = Clock(), []
    be = SlotBackend(4, steps_of=lambda t: 2, result_of=seeks_at_26)
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=75.0)
    loop.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 1), 30.0)], RequestOptions(timestamps=True))
    loop.submit(2, [(pcm(3, 5), 0.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert [(t.offset_s, t.duration_s) for b in be.admitted for t in b] == [(0.0, 30.0), (0.0, 3.0), (26.0, 30.0),
                                                                           (52.0, 8.0)]
    assert segments_of(out, 1) == {0: ["w@0", "w@26", "w@52"], 1: [""]} and segments_of(out, 2) == {0: ["w@0"]}

    clock2, out2 = Clock(), []
    be2 = SlotBackend(4, steps_of=lambda t: 2, result_of=seeks_at_26)
    loop2 = EngineLoop(be2, Decoding(beam_size=1), max_batch_size=4, max_queue_delay_s=0.0, emit=out2.append,
                       clock=clock2, stretch_s=75.0)
    loop2.submit(1, [(pcm(30, 1), 0.0), (pcm(30, 1), 30.0)], RequestOptions(timestamps=True))
    for _ in range(10):  # until the first window's result has queued the next one
        loop2.run_once()
        if loop2.queue:
            break
    assert [p.offset_s for p in loop2.queue] == [26.0]
    loop2.cancel(1)
    run_until_idle(loop2, clock2)
    assert [(t.offset_s, t.duration_s) for b in be2.admitted for t in b] == [(0.0, 30.0)]
    assert segments_of(out2, 1) == {} and not loop2.requests


def test_a_files_unstarted_stretches_go_before_the_continuations_of_started_ones() -> None:
    # Three 75 s stretches (three runs of three contiguous 25 s segments, 5 s apart), batches of 2
    # on one instance, every full window seeking at 26 s: each stretch is a chain of three decodes
    # (0-30, 26-56, 52-75).
    # The earliest unfinished stretch's part goes first, then the part whose chain holds the
    # most windows, ties in audio order: the third stretch starts in the second batch.
    # Continuations first had started it only in the fourth, and its chain of three then ran
    # alone: 6 batches instead of 5.
    clock, out, be = Clock(), [], SeeksAt26()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=2, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=75.0)
    loop.submit(1, [(pcm(25, 1), 80.0 * (i // 3) + 25.0 * (i % 3)) for i in range(9)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert [[t.offset_s for t in b] for b in be.batches] == [[0.0, 80.0], [26.0, 160.0], [52.0, 106.0],
                                                             [132.0, 186.0], [212.0]]
    assert segments_of(out, 1) == {
        **{3 * k: [f"w@{80 * k}+30", f"w@{80 * k + 26}+30", f"w@{80 * k + 52}+23"] for k in range(3)},
        **{3 * k + j: [""] for k in range(3) for j in (1, 2)}}
    # Stretches complete in audio order here (a stream's deltas come as early as before).
    assert [m[2] for m in out if m[0] == "segment"] == list(range(9))
    assert not loop.requests


def test_the_earliest_unfinished_stretch_goes_first_and_a_newer_request_after_the_started_ones_parts() -> None:
    # Request 1: two stretches (0-50 s, and 60-110 s after a gap), batches of 1. After its first
    # window (seek at 26) its queue holds the first stretch's continuation (one window left) and
    # the second stretch's head (two): the continuation goes first, its stretch being the
    # earliest unfinished. Request 2, submitted after request 1 started, waits for its parts.
    clock, out, be = Clock(), [], SeeksAt26()
    loop = EngineLoop(be, Decoding(beam_size=1), max_batch_size=1, max_queue_delay_s=0.0, emit=out.append,
                      clock=clock, stretch_s=75.0)
    loop.submit(1, [(pcm(25, 1), 0.0), (pcm(25, 1), 25.0), (pcm(25, 1), 60.0), (pcm(25, 1), 85.0)],
                RequestOptions(timestamps=True))
    assert loop.run_once()  # request 1's first window, inline: its continuation is queued
    loop.submit(2, [(pcm(5, 2), 0.0)], RequestOptions(timestamps=True))
    run_until_idle(loop, clock)
    assert [[(t.offset_s, t.duration_s) for t in b] for b in be.batches] == [
        [(0.0, 30.0)], [(26.0, 24.0)], [(60.0, 30.0)], [(86.0, 24.0)], [(0.0, 5.0)]]
    assert segments_of(out, 1) == {0: ["w@0+30", "w@26+24"], 1: [""], 2: ["w@60+30", "w@86+24"], 3: [""]}
    assert segments_of(out, 2) == {0: ["w@0+5"]}

from __future__ import annotations

import asyncio

import pytest
from settle import settle

from tideserve.errors import CapacityError
from tideserve.gateway.dispatch import Dispatcher
from tideserve.replicas import ReplicaEndpoint


class Source:
    def __init__(self, eps, accepting=True):
        self.eps = eps
        self.ok = accepting

    def endpoints(self):
        return self.eps

    def accepting(self):
        return self.ok

    def failure_reason(self):
        return "pool cpu failed: boom"


def ep(i, ready=True, mc=1):
    return ReplicaEndpoint(f"r{i}", "cpu", f"http://127.0.0.1:{9000 + i}", ready, mc)


async def held(d, n=1):
    """Let the loop run until ``n`` requests wait in ``d`` (no wall-clock sleep)."""
    for _ in range(100):
        if d.pending == n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{d.pending} requests held, expected {n}")


def test_slots_are_reserved_and_released():
    async def main():
        d = Dispatcher(Source([ep(0, mc=2)]), max_pending=10, hold_timeout_s=5)
        a = await d.acquire()
        b = await d.acquire()
        assert (a.id, b.id) == ("r0", "r0") and d.in_flight() == 2
        waiter = asyncio.ensure_future(d.acquire())
        await held(d)
        assert not waiter.done() and d.pending == 1
        d.release("r0")
        got = await asyncio.wait_for(waiter, 2)
        assert got.id == "r0" and d.pending == 0 and d.in_flight() == 2

    asyncio.run(main())


def test_requests_held_until_a_replica_is_ready():
    async def main():
        src = Source([ep(0, ready=False)])
        d = Dispatcher(src, max_pending=10, hold_timeout_s=5)
        waiter = asyncio.ensure_future(d.acquire())
        await held(d)
        assert not waiter.done()
        src.eps = [ep(0, ready=True)]
        d.notify()
        assert (await asyncio.wait_for(waiter, 2)).id == "r0"

    asyncio.run(main())


def test_max_pending_gives_503_with_retry_after():
    async def main():
        d = Dispatcher(Source([ep(0, ready=False)]), max_pending=1, hold_timeout_s=5)
        first = asyncio.ensure_future(d.acquire())
        await held(d)
        with pytest.raises(CapacityError, match="max_pending 1") as ei:
            await d.acquire()
        assert ei.value.http_status == 503 and ei.value.retry_after_s == 1
        first.cancel()

    asyncio.run(main())


def test_hold_timeout():
    """A held request waits until exactly hold_timeout_s on the dispatcher's clock, then 503s."""
    async def main():
        now = [100.0]
        d = Dispatcher(Source([]), max_pending=5, hold_timeout_s=30, clock=lambda: now[0])
        waiter = asyncio.ensure_future(d.acquire())
        await held(d)
        now[0] = 129.999  # just before the deadline: a wake-up finds it still waiting
        d.notify()
        for _ in range(20):  # ample turns of the loop for the waiter to re-check and give up
            await asyncio.sleep(0)
        assert not waiter.done() and d.pending == 1
        now[0] = 130.0
        d.notify()
        with pytest.raises(CapacityError, match="hold_timeout_s=30") as ei:
            await asyncio.wait_for(waiter, 10)
        assert ei.value.http_status == 503 and ei.value.retry_after_s == 1 and d.pending == 0

    asyncio.run(main())


def test_failed_endpoint_fails_fast_with_reason():
    async def main():
        d = Dispatcher(Source([], accepting=False), max_pending=5, hold_timeout_s=60)
        with pytest.raises(CapacityError, match="pool cpu failed: boom"):
            await asyncio.wait_for(d.acquire(), 1)

    asyncio.run(main())


def test_exclude_avoids_the_replica_that_failed_unless_it_is_the_only_one():
    async def main():
        d = Dispatcher(Source([ep(0, mc=4), ep(1, mc=4)]), max_pending=5, hold_timeout_s=1)
        assert (await d.acquire(frozenset({"r0"}))).id == "r1"
        d2 = Dispatcher(Source([ep(0, mc=4)]), max_pending=5, hold_timeout_s=1)
        assert (await d2.acquire(frozenset({"r0"}))).id == "r0"

    asyncio.run(main())


def test_held_requests_are_released_first_in_first_out_and_new_arrivals_do_not_overtake():
    """One slot; three requests held in order; when the slot frees, the oldest gets it, and a
    request arriving while others are held joins the queue instead of taking a free slot."""

    async def main():
        src = Source([ep(0, mc=1)])
        d = Dispatcher(src, max_pending=10, hold_timeout_s=5)
        first = await d.acquire()
        order = []

        async def req(name):
            r = await d.acquire(audio_s=1.0)
            order.append(name)
            return r

        waiters = []
        for i in range(3):
            waiters.append(asyncio.ensure_future(req(f"h{i}")))
            await settle(lambda n=i + 1: d.pending == n, f"h{i} held")
        assert d.pending == 3 and d.pending_audio_s() == 3.0
        d.release(first.id)
        await settle(lambda: len(order) == 1, "one held request released")
        assert order == ["h0"]
        late = asyncio.ensure_future(req("late"))  # arrives while h1, h2 are held
        await settle(lambda: d.pending == 3, "the late request held behind h1, h2")
        for n in range(3):
            d.release("r0", audio_s=1.0)
            await settle(lambda n=n: len(order) == n + 2, "the next held request released")
        assert order == ["h0", "h1", "h2", "late"]
        d.release("r0", audio_s=1.0)
        await asyncio.gather(*waiters, late)
        assert d.in_flight() == 0

    asyncio.run(main())


def test_audio_estimate_from_header_or_body_size():
    from tideserve.gateway.dispatch import estimate_audio_s

    assert estimate_audio_s(320_000) == 10.0
    assert estimate_audio_s(320_000, {"X-Audio-Seconds": "3.5"}) == 3.5
    assert estimate_audio_s(64_000, {"X-Audio-Seconds": "bad"}) == 2.0


def test_reserve_idle_offers_only_idle_ready_replicas_fastest_first_and_none_while_requests_are_held():
    async def main():
        src = Source([ep(0), ep(1), ep(2, ready=False), ep(3)])
        d = Dispatcher(src, max_pending=10, hold_timeout_s=5)
        d.record_service("cpu", 1.0)
        a = await d.acquire()  # r0, the first of equals
        helpers = d.reserve_idle(frozenset({a.id}), limit=5)
        assert [h.id for h in helpers] == ["r1", "r3"]  # r2 is not ready, r0 is busy
        assert d.outstanding == {"r0": 1, "r1": 1, "r3": 1} and d.work_of("r1") == 0.0
        assert d.reserve_idle(frozenset(), limit=5) == []  # nobody idle now
        waiter = asyncio.ensure_future(d.acquire())  # every slot taken: held
        await held(d)
        d.release("r1", served=False)
        got = await asyncio.wait_for(waiter, 2)  # the held request got r1's slot, not a helper
        assert got.id == "r1" and d.reserve_idle(frozenset(), limit=1) == []
        d.release("r3", served=False)
        assert [h.id for h in d.reserve_idle(frozenset(), limit=1)] == ["r3"]
        assert d.reserve_idle(frozenset(), limit=0) == []

    asyncio.run(main())


def test_reserve_idle_offers_none_while_a_request_is_held():
    async def main():
        src = Source([ep(0), ep(1, ready=False)])
        d = Dispatcher(src, max_pending=10, hold_timeout_s=5)
        await d.acquire()
        waiter = asyncio.ensure_future(d.acquire())
        await held(d)
        src.eps = [ep(0), ep(1)]  # r1 became ready, and nobody notified yet: the held request comes first
        assert d.reserve_idle(frozenset({"r0"}), limit=1) == []
        d.notify()
        assert (await asyncio.wait_for(waiter, 2)).id == "r1"

    asyncio.run(main())


def test_a_wav_files_duration_is_read_from_its_header_in_the_body_or_a_multipart_upload():
    import io
    import wave

    from tideserve.gateway.dispatch import estimate_audio_s, wav_duration_s

    def wav(rate: int, channels: int, seconds: float) -> bytes:
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(b"\0\0" * channels * int(rate * seconds))
        return buf.getvalue()

    stereo = wav(44_100, 2, 25.0)  # 4.4 MB: the body size alone reads as 138 s
    assert estimate_audio_s(stereo) == pytest.approx(25.0) and estimate_audio_s(len(stereo)) > 137
    upload = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n" + stereo + b"\r\n--b--\r\n"
    assert estimate_audio_s(upload) == pytest.approx(25.0, abs=0.01)
    assert estimate_audio_s(wav(16_000, 1, 3.0), {"X-Audio-Seconds": "9"}) == 9.0  # the client's word first
    cut = wav(16_000, 1, 10.0)[:16_044 + 44]  # cut short: the bytes present count
    assert wav_duration_s(cut) == pytest.approx(0.5, abs=0.01)
    assert wav_duration_s(b"ID3" + b"\0" * 100) is None and estimate_audio_s(b"x" * 64_000) == 2.0
    assert wav_duration_s(b"RIFF\0\0\0\0WAVEdata\0\0\0\0") is None  # no fmt chunk: not guessed

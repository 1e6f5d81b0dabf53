"""Continuous (in-flight) batching in the torch decoder, on the CPU: rows join a running decode
at any step and leave when they end, each with its own length and stop, and every row's tokens
equal the same window decoded alone. Self-contained like test_torch_backend (GPU runnable)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_torch_backend import DEVICES, DIMS, SPECIAL, make_model
from tideserve.worker.backends.torch_whisper.decode import MAX_AHEAD_STEPS, GreedyDecoder, StepTimes, decode_pace
from tideserve.worker.backends.torch_whisper.features import HOP, N_FFT, N_FRAMES, LogMel
from tideserve.worker.backends.torch_whisper.model import Whisper


def _alone(dec: GreedyDecoder, enc: torch.Tensor, prompt: list[int], cap: int, min_new: int = 0):
    return dec.decode(enc[None], [prompt], [False], max_new_tokens=cap, min_new_tokens=min_new)[0]


@pytest.mark.parametrize("device", DEVICES)
def test_rows_join_a_running_decode_and_equal_decoding_alone(device: str) -> None:
    m = make_model(device)
    dec = GreedyDecoder(m, SPECIAL, max_batch=4, max_prompt=16)
    torch.manual_seed(3)
    prompts = [[SPECIAL.sot, SPECIAL.no_timestamps], [50360, 11, 12, SPECIAL.sot, SPECIAL.no_timestamps],
               [SPECIAL.sot, SPECIAL.no_timestamps]]
    caps = [20, 6, 11]  # each row its own token limit
    with torch.inference_mode():
        enc = m.encode(torch.randn(3, 80, 3000, device=device))
        want = [_alone(dec, enc[i], prompts[i], caps[i], min_new=caps[i]) for i in range(3)]
        # Row 0 starts alone; row 1 joins after 5 steps, row 2 after 9: they meet it mid-decode.
        got = {}
        (s0,) = dec.admit(enc[0:1], [prompts[0]], [False], [caps[0]], min_new_tokens=caps[0])
        dec.run(5)
        got.update(dec.finished())
        (s1,) = dec.admit(enc[1:2], [prompts[1]], [False], [caps[1]], min_new_tokens=caps[1])
        dec.run(4)
        got.update(dec.finished())
        (s2,) = dec.admit(enc[2:3], [prompts[2]], [False], [caps[2]], min_new_tokens=caps[2])
        order = []
        while dec.busy_slots:
            dec.run(1)
            for slot, row in dec.finished():
                got[slot] = row
                order.append(slot)
    assert len({s0, s1, s2}) == 3
    assert [len(got[s].tokens) for s in (s0, s1, s2)] == caps
    assert [got[s].tokens for s in (s0, s1, s2)] == [w.tokens for w in want]
    for s, w in zip((s0, s1, s2), want, strict=True):
        assert got[s].sum_logprob == pytest.approx(w.sum_logprob, abs=1e-3)
        assert got[s].no_speech_prob == pytest.approx(w.no_speech_prob, abs=1e-4)
    # Each row left when it ended: the shortest (row 1, 6 tokens, joined at step 5) first.
    assert order[0] == s1


def test_a_row_at_the_token_limit_holds_only_its_own_slot() -> None:
    m = make_model("cpu")
    dec = GreedyDecoder(m, SPECIAL, max_batch=2, max_prompt=8)
    torch.manual_seed(4)
    p = [SPECIAL.sot, SPECIAL.no_timestamps]
    with torch.inference_mode():
        enc = m.encode(torch.randn(3, 80, 3000))
        (long_slot,) = dec.admit(enc[0:1], [p], [False], [60], min_new_tokens=60)  # the "looping" window
        (short,) = dec.admit(enc[1:2], [p], [False], [4], min_new_tokens=4)
        done_at: dict[str, int] = {}
        names = {long_slot: "long", short: "short"}
        step = 0
        while dec.busy_slots:
            dec.run(1)
            step += 1
            for slot, _ in dec.finished():
                done_at[names.pop(slot)] = step
                if "third" not in done_at and "short" in done_at and slot == short:
                    # Its slot is free at once: a third window takes it while the long row runs.
                    (third,) = dec.admit(enc[2:3], [p], [False], [4], min_new_tokens=4)
                    names[third] = "third"
                    done_at["third"] = -1
    assert done_at["short"] == 4 + 1  # prompt position + 4 tokens
    assert third == short and done_at["third"] == 5 + 5 and done_at["long"] == 61


def test_release_stops_a_row_and_frees_its_slot() -> None:
    dec = GreedyDecoder(make_model("cpu"), SPECIAL, max_batch=2, max_prompt=8)
    with torch.inference_mode():
        enc = torch.randn(2, 1500, DIMS.d_model)
        slots = dec.admit(enc, [[SPECIAL.sot]] * 2, [False, False], [30, 30], min_new_tokens=30)
        dec.run(3)
        dec.release([slots[0]])
        assert dec.free_slots == 1 and dec.busy_slots == (slots[1],)
        with pytest.raises(ValueError, match="idle decoder"):
            dec.decode(enc[:1], [[SPECIAL.sot]], [False])
        with pytest.raises(ValueError, match="free slots"):
            dec.admit(enc, [[SPECIAL.sot]] * 2, [False, False])


def test_steps_run_by_the_engine_loop_keep_no_autograd_history() -> None:
    # The engine loop calls run() outside inference mode, and a model built in code (like one
    # loaded before load_hf_dir turned gradients off) has weights that require gradients: each
    # step then recorded autograd, and the state carried across steps (the summed
    # log-probability) chained every step's [B, vocab] tensors (found by review).
    m = make_model("cpu")
    assert any(p.requires_grad for p in m.parameters())
    dec = GreedyDecoder(m, SPECIAL, max_batch=2, max_prompt=8)
    with torch.inference_mode():
        enc = torch.randn(2, 1500, DIMS.d_model)
    dec.admit(enc, [[SPECIAL.sot]] * 2, [False, False], [30, 30], min_new_tokens=30)
    dec.run(3)
    assert not dec.sum_logprob.requires_grad and dec.sum_logprob.grad_fn is None
    assert not dec.no_speech.requires_grad


def test_sampling_rows_beside_greedy_rows_leave_greedy_rows_unchanged() -> None:
    m = make_model("cpu")
    dec = GreedyDecoder(m, SPECIAL, max_batch=2, max_prompt=8)
    p = [SPECIAL.sot, SPECIAL.no_timestamps]
    torch.manual_seed(5)
    with torch.inference_mode():
        enc = m.encode(torch.randn(1, 80, 3000)).expand(2, -1, -1)
        want = _alone(dec, enc[0], p, 15, min_new=15)
        rows = dec.decode(enc, [p, p], [False, False], max_new_tokens=15, min_new_tokens=15, temperatures=[0.0, 1.0])
    assert rows[0].tokens == want.tokens
    assert len(rows[1].tokens) == 15 and rows[1].tokens != want.tokens  # sampled at T=1 over 51k tokens


def _per_window_log_mel(samples: np.ndarray, n_mels: int = 80) -> torch.Tensor:
    """The per-window reference (the computation before batching): faster-whisper's features."""
    mel = LogMel(n_mels, torch.device("cpu"))
    x = torch.from_numpy(samples.astype(np.float32))
    x = torch.nn.functional.pad(x, (0, max(HOP, N_FFT // 2 + 1 - x.shape[0])))
    spec = torch.stft(x, N_FFT, HOP, window=mel.window, center=True, pad_mode="reflect", return_complex=True)
    logmel = torch.clamp(mel.filters @ (spec[:, :-1].abs() ** 2), min=1e-10).log10()
    logmel = (torch.maximum(logmel, logmel.max() - 8.0) + 4.0) / 4.0
    logmel = logmel[:, :-1][:, :N_FRAMES]
    out = torch.zeros(n_mels, N_FRAMES)
    out[:, : logmel.shape[1]] = logmel
    return out


def test_batched_features_equal_per_window_features_from_int16() -> None:
    rng = np.random.default_rng(0)
    lengths = [1, 40, 16_000 * 3 + 7, 16_000 * 30]
    pcm = [(rng.standard_normal(n) * 3000).clip(-32768, 32767).astype(np.int16) for n in lengths]
    batched = LogMel(80, torch.device("cpu"))(pcm)
    for i, x in enumerate(pcm):
        want = _per_window_log_mel(x.astype(np.float32) / 32768.0)
        assert torch.allclose(batched[i], want, atol=1e-4), f"window {i} ({lengths[i]} samples)"


def test_consecutive_feature_calls_through_the_reused_host_buffer_equal_fresh_ones() -> None:
    # The samples are packed into one reused host buffer (page-locked on a GPU); a call must
    # neither see nor change another call's data: longer windows after shorter, int16 after
    # float32 and back (the buffer regrown and retyped).
    rng = np.random.default_rng(1)
    calls = [[(rng.standard_normal(n) * 0.1).astype(np.float32) for n in (16_000, 400)],
             [(rng.standard_normal(n) * 3000).astype(np.int16) for n in (16_000 * 30, 16_000 * 7, 41)],
             [(rng.standard_normal(n) * 0.2).astype(np.float32) for n in (16_000 * 2,)]]
    mel = LogMel(80, torch.device("cpu"))
    got = [mel(c) for c in calls]
    for c, g in zip(calls, got, strict=True):
        assert torch.equal(g, LogMel(80, torch.device("cpu"))(c))


def test_a_host_buffer_whose_copy_is_not_done_is_not_written_another_is_taken() -> None:
    """The features' page-locked buffers: a call takes one whose last copy to the device is done,
    else a new one, up to ``RING``; with all in use it waits for the least recently used."""

    class Copy:  # a CUDA event stand-in: done or not, and whether someone waited for it
        def __init__(self, done: bool) -> None:
            self.done, self.waited = done, False

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            self.waited = self.done = True

    mel = LogMel(80, torch.device("cpu"))
    first, entry = mel._host_buffer(100, torch.int16)
    entry[1] = Copy(done=False)
    second, entry2 = mel._host_buffer(100, torch.int16)
    assert second.data_ptr() != first.data_ptr() and len(mel._ring) == 2  # the first is still being copied
    entry2[1] = Copy(done=True)
    again, _ = mel._host_buffer(50, torch.int16)
    assert again.data_ptr() == second.data_ptr() and not entry[1].waited  # a done one is reused
    for e in mel._ring:
        e[1] = Copy(done=False)
    while len(mel._ring) < LogMel.RING:
        _, e = mel._host_buffer(10, torch.int16)
        e[1] = Copy(done=False)
    oldest = mel._ring[0]
    reused, _ = mel._host_buffer(10, torch.int16)
    assert len(mel._ring) == LogMel.RING and oldest[1].waited and reused.data_ptr() == oldest[0].data_ptr()
    assert sum(e[1].waited for e in mel._ring) == 1


def test_decode_pace_counts_the_steps_in_device_time() -> None:
    """Steps ahead cover about 8 ms of device time (1..8), a chunk is twice that."""
    assert decode_pace(0.00103) == (16, 8)  # tiny.en's step on an H100: its measured best
    assert decode_pace(0.0005) == (16, 8)  # at most 8 ahead
    assert decode_pace(0.00546) == (4, 2)  # large-v3's step (FP8 keys and values, batch 64)
    assert decode_pace(0.004) == (4, 2)
    assert decode_pace(0.008) == (2, 1)
    assert decode_pace(0.05) == (2, 1)  # at least 1
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            decode_pace(bad)


def test_step_times_keep_the_least_time_per_step_of_recent_chunks_per_bucket() -> None:
    """A chunk's events also count the device waiting for the host, which only lengthens it:
    the estimate is the least time per step over a bucket's last ``keep`` chunks."""
    t = StepTimes(keep=3)
    assert t.pace_for(64) is None
    t.observe(64, 4, 0.004)  # 1 ms a step
    t.observe(64, 2, 0.0)  # no time: ignored
    t.observe(64, 0, 0.5)  # no steps: ignored
    assert t.step_s == {64: pytest.approx(0.001)} and t.pace_for(64) == (16, 8)
    t.observe(64, 1, 0.005)  # a chunk held up by the host
    assert t.step_s[64] == pytest.approx(0.001)
    t.observe(64, 2, 0.008)
    t.observe(64, 2, 0.008)  # the 1 ms chunk is now older than the last 3
    assert t.step_s[64] == pytest.approx(0.004) and t.pace_for(64) == (4, 2)
    assert t.pace_for(32) is None


def _counting_steps(device: str, run_ahead: int | None) -> tuple[Whisper, GreedyDecoder, GreedyDecoder, list[int]]:
    """A test model, a reference decoder, a decoder with ``run_ahead`` whose steps are counted
    (the batch size of each appended to the returned list)."""
    m = make_model(device)
    ref = GreedyDecoder(m, SPECIAL, max_batch=4, max_prompt=8)
    dec = GreedyDecoder(m, SPECIAL, max_batch=4, max_prompt=8, run_ahead=run_ahead)
    steps: list[int] = []
    real = dec._run_step
    dec._run_step = lambda b, span, sampling=False: (steps.append(b), real(b, span, sampling))[1]  # type: ignore[method-assign]
    return m, ref, dec, steps


class _Event:
    """A CUDA event pair's stand-in: ``query`` says whether the device has passed it."""

    def __init__(self, at_ms: float, passed: bool = True) -> None:
        self.at_ms, self.passed = at_ms, passed

    def query(self) -> bool:
        return self.passed

    def elapsed_time(self, end: _Event) -> float:
        return end.at_ms - self.at_ms


def test_timed_chunks_are_read_once_passed_and_a_buckets_first_pace_is_logged(caplog) -> None:
    dec = GreedyDecoder(make_model("cpu"), SPECIAL, max_batch=4, max_prompt=8, run_ahead=None)
    later = _Event(30.0, passed=False)
    dec._timed.extend([(_Event(0.0), _Event(8.0), 4, 8),  # 1 ms a step
                       (_Event(8.0), _Event(12.0), 4, 2),  # 2 ms a step: the least stays 1 ms
                       (_Event(12.0), later, 4, 4)])  # not yet passed: left for the next read
    with caplog.at_level("DEBUG", logger="tideserve.worker.torch"):
        dec._read_timings()
        assert dec.step_times.step_s == {4: 0.001} and len(dec._timed) == 1
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("INFO", "decode pace for 4 rows: 1.00 ms a step -> chunks of 16 steps, 8 run ahead")]
        later.passed = True
        dec.step_times = StepTimes(keep=1)  # the newest chunk alone: its 4.5 ms a step changes the pace
        dec._read_timings()
        assert dec.step_times.step_s == {4: 0.0045} and not dec._timed
        assert caplog.records[-1].levelname == "DEBUG" and "chunks of 4 steps, 2 run ahead" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("device", DEVICES)
def test_a_paced_decoder_runs_ahead_by_its_step_time_and_changes_no_token(device: str) -> None:
    """``run_ahead=None``: before a bucket's step is measured the decoder runs 8 steps ahead and
    asks for no chunk; then both follow ``decode_pace``. On a GPU its chunks time themselves."""
    m, ref, dec, steps = _counting_steps(device, run_ahead=None)
    p = [SPECIAL.sot, SPECIAL.no_timestamps]
    torch.manual_seed(7)
    with torch.inference_mode():
        enc = m.encode(torch.randn(2, 80, 3000, device=device))
        want = [_alone(ref, enc[i], p, cap, min_new=3) for i, cap in enumerate((3, 30))]
        short, long_ = dec.admit(enc, [p, p], [False, False], [3, 30], min_new_tokens=3)
        assert dec.paced and dec.chunk_steps is None and dec.run_ahead == MAX_AHEAD_STEPS
        dec.step_times.observe(2, 1, 0.004)  # bucket 2 (slots 0 and 1): 4 ms a step
        assert (dec.chunk_steps, dec.run_ahead) == (4, 2)
        dec.run(4)  # on a GPU these steps capture the bucket's graph: not timed
        first = dec.finished()  # the 3-token row (1 prompt step + 3) has ended; 2 steps ahead for the other
        assert [s for s, _ in first] == [short] and len(steps) == 6
        assert dec.step_times.step_s == {2: 0.004}
        got = dict(first)
        while dec.busy_slots:
            dec.run(dec.chunk_steps or 16)
            got.update(dec.finished())
    assert [got[short].tokens, got[long_].tokens] == [w.tokens for w in want]
    if device == "cuda":  # the later chunks were timed: the test model's step is far under the 4 ms fed in
        assert dec.step_times.step_s[2] < 0.004
    else:  # no CUDA graphs, no timing
        assert dec.step_times.step_s == {2: 0.004}


def test_run_ahead_queues_the_next_chunks_first_steps_and_changes_no_token() -> None:
    """finished() runs ``run_ahead`` steps for the rows still decoding (the device keeps working
    while the host builds results and admits); the next run(n) runs n - run_ahead; no token moves."""
    m, ref, dec, steps = _counting_steps("cpu", run_ahead=3)
    p = [SPECIAL.sot, SPECIAL.no_timestamps]
    torch.manual_seed(6)
    with torch.inference_mode():
        enc = m.encode(torch.randn(3, 80, 3000))
        want = [_alone(ref, enc[i], p, cap, min_new=cap) for i, cap in enumerate((2, 12, 5))]
        short, long_ = dec.admit(enc[0:2], [p, p], [False, False], [2, 12], min_new_tokens=2)
        dec.run(4)
        assert len(steps) == 4
        first = dec.finished()  # the 2-token row has ended; 3 steps queued for the other
        assert [s for s, _ in first] == [short] and len(steps) == 7
        (third,) = dec.admit(enc[2:3], [p], [False], [5], min_new_tokens=5)  # joins after the 3 steps ahead
        assert third == short  # the freed slot
        dec.run(4)
        assert len(steps) == 8  # 4 - 3
        got = {}
        while dec.busy_slots:
            dec.run(4)
            got.update(dec.finished())
        assert dec.finished() == [] and dec._ahead == 0  # nothing busy: nothing run ahead
    assert [first[0][1].tokens, got[long_].tokens, got[third].tokens] == [w.tokens for w in want]
    with pytest.raises(ValueError, match="run_ahead"):
        GreedyDecoder(m, SPECIAL, max_batch=1, run_ahead=-1)

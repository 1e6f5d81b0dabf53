"""Seconds per audio minute on one long file, tideserve's pipeline against faster-whisper's
BatchedInferencePipeline (issue 13's speed goal), taking turns for several rounds so that the
host's drift falls on both sides (bench/accuracy.py runs each system once per file). Same model
(tiny.en int8), beam, timestamps and thresholds as bench/accuracy.py; the file is its generator's.

    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 3
    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 3 --cpu-threads 0,1
    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 3 --without-resume
    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 3 --encode-batch 1,8
    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 3 --as-json
    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 5 --lane-rounds 1,2
    .venv/bin/python bench/longfile_speed.py --beam 5 --minutes 20 --seed 15 --rounds 5 --blas-threads 1,0

``--cpu-threads``: tideserve's intra-op threads per model instance, one tideserve system per
value (0: the worker's default, ``worker.cores.intra_op_threads``, and for the background lane's
copy, which runs a long file's batches, ``worker.cores.lane_threads``; T > 0 sets both, as the
local config's ``cpu_threads_per_replica`` does), all taking turns with the batched pipeline. ``--without-resume``
adds, per value, tideserve with every rest after a seek encoded again from its own audio (the
backend's ``resumes`` off; the name ends ``-noresume``), to measure the resumed rest.
``--instances``: model instances per tideserve system, one system per value and threads value
(0: the worker's default, ``worker.engine.default_instances``; the name ends ``-instN``).
``--encode-batch``: windows per encoder pass (``worker.backends.faster_whisper.ENCODE_BATCH``),
one tideserve system per value (the name ends ``-encN``; the module constant is set before each
of its runs). ``--lane-rounds``: the rounds a long file's windows are divided in over the lane's
instances (``worker.batching.LANE_ROUNDS``), one tideserve system per value (``-laneN``, set the
same way). ``--blas-threads``: numpy's BLAS threads during tideserve's runs, one tideserve system
per value (``-blasN``; 0: the process's own count at start, as before the backend held it to one,
``worker.cores.one_blas_thread``); the batched pipeline always runs at that own count.
Prints one JSON line per run (with tideserve's decodes: the engine's parts decoded, seeks and
loop splits) and the median of the per-round ratios (tideserve / batched time) per system.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import accuracy as A  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker import batching  # noqa: E402
from tideserve.worker.backends import faster_whisper as fw  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--seed", type=int, default=15, help="bench/accuracy.py's third file has seed 15")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--cpu-threads", default="0", help="comma-separated; 0: the worker's default")
    ap.add_argument("--without-resume", action="store_true", help="also run tideserve without the resumed rest")
    ap.add_argument("--instances", default="0", help="comma-separated model instances; 0: the worker's default")
    ap.add_argument("--as-json", action="store_true",
                    help="tideserve as a json or text request at the endpoint's default (without_timestamps unset), "
                         "the batched pipeline at its own default (without timestamp tokens); named --without-timestamps "
                         "in the first results")
    ap.add_argument("--encode-batch", default="", help="comma-separated windows per encoder pass (default: the backend's)")
    ap.add_argument("--lane-rounds", default="", help="comma-separated batching.LANE_ROUNDS values (default: the module's)")
    ap.add_argument("--blas-threads", default="", help="comma-separated numpy BLAS threads for tideserve's runs "
                                                       "(0: the process's own; default: the backend's one)")
    a = ap.parse_args()
    without, asked = A.REQUEST_KINDS["json" if a.as_json else "verbose_json"]
    d = Decoding(beam_size=a.beam, without_timestamps=without)
    clips = A.audio.load_en_clips()
    samples, ref = A.long_file(clips, a.minutes, a.seed)
    minutes = len(samples) / A.SR / 60
    threads = [int(t) for t in a.cpu_threads.split(",")]
    ours = {}
    encode_batch: dict[str, int] = {}
    lane_rounds: dict[str, int] = {}
    blas: dict[str, int] = {}
    for t, inst in [(t, i) for t in threads for i in (int(x) for x in a.instances.split(","))]:
        for resume in (True, False) if a.without_resume else (True,):
            for e, lr, b in itertools.product([int(x) for x in a.encode_batch.split(",") if x] or [0],
                                              [int(x) for x in a.lane_rounds.split(",") if x] or [0],
                                              [int(x) for x in a.blas_threads.split(",") if x] or [-1]):
                name = (f"tideserve-fw-threads{t}" if t else "tideserve-fw") + ("" if resume else "-noresume") + \
                    (f"-enc{e}" if e else "") + (f"-inst{inst}" if inst else "") + (f"-lane{lr}" if lr else "") + \
                    (f"-blas{b}" if b >= 0 else "")
                ours[name] = A.Tideserve("faster-whisper", "cpu-x86_64-int8", d, a.batch_size, cpu_threads=t,
                                         instances=inst or None)
                ours[name].backend.resumes = resume
                if e:
                    encode_batch[name] = e
                if lr:
                    lane_rounds[name] = lr
                if b >= 0:
                    blas[name] = b or A.BLAS_THREADS
    systems: dict[str, Any] = {**ours, "fw-batched": A.FasterWhisper(d, True, a.batch_size)}
    for name, run in systems.items():
        # Warm-up; tideserve's on a piece long enough (more windows than a batch) for its batches
        # to run in the background lane, whose copy of the model loads at its first batch.
        run(samples[: A.SR * ((a.batch_size + 1) * 30 if name in ours else 2)])
    ratios: dict[str, list[float]] = {name: [] for name in ours}
    for r in range(a.rounds):
        order = list(systems) if r % 2 == 0 else list(reversed(systems))
        spm = {}
        for name in order:
            if name in encode_batch:
                fw.ENCODE_BATCH = encode_batch[name]
            if name in lane_rounds:
                batching.LANE_ROUNDS = lane_rounds[name]
            t0 = time.perf_counter()
            if name in blas:
                with threadpool_limits(blas[name], user_api="blas"):
                    segs = systems[name](samples, timestamps=asked)
            else:
                segs = systems[name](samples, timestamps=asked) if name in ours else systems[name](samples)
            spm[name] = (time.perf_counter() - t0) / minutes
            wer = A.audio.wer(ref, " ".join(x[2].strip() for x in segs))
            row = {"round": r, "system": name, "s_per_audio_min": round(spm[name], 3), "wer": round(wer, 4)}
            if name in ours:
                st = ours[name].last_stats
                row.update(decodes=st.windows, seeks=st.seeks, splits=st.splits, resumed=st.resumed_rests,
                           redone=st.redone_rests)
            print(json.dumps(row), flush=True)
        for name in ours:
            ratios[name].append(spm[name] / spm["fw-batched"])
    for name, rs in ratios.items():
        print(json.dumps({"system": name, "beam": a.beam, "minutes": round(minutes, 2), "timestamps": not a.as_json,
                          "ratios": [round(x, 3) for x in rs], "median_ratio": round(statistics.median(rs), 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

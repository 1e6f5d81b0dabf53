"""Where an engine admission spends its time on the GPU machine: log-mel features (host buffer
fill, copy to the device, transform), the encoder, and the decoder's slot writes, for admissions
of n windows, with torch's default CPU threads and with one.

    python bench/gpu_admit_probe.py --model-dir DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tideserve.spec.models import Decoding, Target
from tideserve.worker.backends.base import WindowTask
from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend


def timed(fn, repeats: int = 7) -> float:
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    a = ap.parse_args()
    be = TorchWhisperBackend(Path(a.model_dir), Target.parse("cuda-sm90-bf16"), Decoding(beam_size=1), max_batch_size=64)
    rng = np.random.default_rng(0)
    rows = []
    for threads in (torch.get_num_threads(), 1):
        torch.set_num_threads(threads)
        for n in (1, 4, 8, 16, 64):
            wins = [(rng.standard_normal(int(16000 * rng.uniform(3, 30))) * 2000).astype(np.int16) for _ in range(n)]
            tasks = [WindowTask(w) for w in wins]
            feats_ms = timed(lambda wins=wins: be.features(wins))
            f = be.features(wins).to(be.decoder.dtype)
            enc_ms = timed(lambda f=f: be.model.encode(f))

            def admit_release(tasks: list[WindowTask] = tasks) -> None:
                slots, _ = be.admit(tasks)
                be.release(slots)

            admit_ms = timed(admit_release)
            t0 = time.perf_counter()
            for _ in range(5):
                be.features(wins)
            host_ms = (time.perf_counter() - t0) / 5 * 1000  # without a sync: the host's share
            torch.cuda.synchronize()
            row = {"threads": threads, "n": n, "features_ms": feats_ms, "features_host_ms": host_ms,
                   "encoder_ms": enc_ms, "admit_ms": admit_ms}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

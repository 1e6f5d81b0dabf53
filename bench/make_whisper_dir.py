"""Write a Hugging Face-format Whisper directory with RANDOM weights (seeded), for serving and
benchmark runs where real weights cannot travel (the GPU machine has no internet and a 64 MiB
transfer limit). The transcripts such a model writes are meaningless; its compute is real.

    python bench/make_whisper_dir.py --size tiny --tokenizer path/to/tokenizer.json --out DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tideserve.worker.backends.torch_whisper.model import Whisper, WhisperDims


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "base", "large-v3"], default="tiny")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a Whisper tokenizer.json of the same vocabulary")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="override the size's vocabulary (e.g. 51864 to pair large-v3 shapes with tiny.en's tokenizer)")
    a = ap.parse_args()
    # base: 74 M parameters, multilingual (Radford et al. 2022, table 1), the language-ID model's size
    dims = {"tiny": WhisperDims.tiny(), "large-v3": WhisperDims.large_v3(),
            "base": WhisperDims(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
                                decoder_layers=6, decoder_attention_heads=8, decoder_ffn_dim=2048,
                                vocab_size=51865)}[a.size]
    if a.vocab_size:
        from dataclasses import replace
        dims = replace(dims, vocab_size=a.vocab_size)
    torch.manual_seed(a.seed)
    # Initialise on the GPU where there is one: 1.5 B parameters take minutes on a CPU.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Whisper(dims)
    with torch.no_grad():  # small weights keep random activations finite in fp16/bf16
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    from safetensors.torch import save_file

    a.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(a.out / "model.safetensors"), metadata={"format": "pt"})
    (a.out / "config.json").write_text(json.dumps({"model_type": "whisper", **asdict(dims),
                                                    "weights": f"random, seed {a.seed}"}, indent=2))
    shutil.copy2(a.tokenizer, a.out / "tokenizer.json")
    print(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

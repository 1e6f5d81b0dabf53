"""The torch Whisper backend's model and decoder on a tiny random configuration: shapes and
dtypes, the static KV cache against a full-sequence reference, per-row prompts in one batch,
the decode-length controls, the timestamp rules, and the target check. Runs on the CPU (CI)
and, where torch sees a GPU, on it too (the CUDA-graph path); self-contained (no conftest) so
the GPU machine can run it alone."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tideserve.errors import EngineMismatchError
from tideserve.spec.models import Target
from tideserve.worker.backends.torch_whisper import backend as backend_mod
from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder, SpecialTokens
from tideserve.worker.backends.torch_whisper.model import GraphedEncoder, KVCache, Whisper, WhisperDims

DIMS = WhisperDims(num_mel_bins=80, d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                   decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128, vocab_size=51864)
SPECIAL = SpecialTokens(eot=50256, sot=50257, no_timestamps=50362, timestamp_begin=50363, no_speech=50361,
                        blank=220, suppress=(1, 2, 3))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make_model(device: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Whisper:
    torch.manual_seed(seed)
    m = Whisper(DIMS)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.05)
    return m.to(device=device, dtype=dtype).eval()


def reference_logits(m: Whisper, encoded: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Decoder over a whole token sequence ``[B, T]`` with plain causal attention (no cache)."""
    dec = m.decoder
    t = tokens.shape[1]
    x = dec.embed_tokens(tokens) + dec.embed_positions.weight[:t]
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    for layer in dec.layers:
        a = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        att = F.scaled_dot_product_attention(a.split(a.q_proj(h)), a.split(a.k_proj(h)), a.split(a.v_proj(h)),
                                             attn_mask=causal)
        x = x + a.out_proj(a.merge(att))
        c = layer.encoder_attn
        h = layer.encoder_attn_layer_norm(x)
        att = F.scaled_dot_product_attention(c.split(c.q_proj(h)), c.split(c.k_proj(encoded)), c.split(c.v_proj(encoded)))
        x = x + c.out_proj(c.merge(att))
        x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
    return (dec.layer_norm(x) @ dec.embed_tokens.weight.T).float()


@pytest.mark.parametrize("device", DEVICES)
def test_encoder_and_step_shapes_and_dtypes(device: str) -> None:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    m = make_model(device, dtype)
    feats = torch.randn(3, 80, 3000, device=device, dtype=dtype)
    with torch.inference_mode():
        enc = m.encode(feats)
        assert enc.shape == (3, 1500, 64) and enc.dtype == dtype
        cache = KVCache(DIMS, max_batch=4, dtype=dtype, device=torch.device(device))
        assert cache.self_k[0].shape == (4, 4, 448, 16) and cache.cross_k[0].shape == (4, 4, 1500, 16)
        m.fill_cross(cache, enc)
        logits = m.step(cache, torch.tensor([SPECIAL.sot] * 3, device=device), torch.zeros(3, dtype=torch.long, device=device))
    assert logits.shape == (3, 51864) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_cached_steps_equal_full_sequence_decoding() -> None:
    m = make_model("cpu")
    tokens = torch.tensor([[SPECIAL.sot, 400, 401, 402, 403], [SPECIAL.sot, 7, 8, 9, 10]])
    with torch.inference_mode():
        enc = m.encode(torch.randn(2, 80, 3000))
        want = reference_logits(m, enc, tokens)
        cache = KVCache(DIMS, max_batch=2, dtype=torch.float32, device=torch.device("cpu"))
        m.fill_cross(cache, enc)
        for pos in range(tokens.shape[1]):
            got = m.step(cache, tokens[:, pos], torch.full((2,), pos), span=128)
            torch.testing.assert_close(got, want[:, pos], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_fixed_length_decode_and_rows_independent_of_batch(device: str) -> None:
    m = make_model(device)
    dec = GreedyDecoder(m, SPECIAL, max_batch=4, max_prompt=16)
    torch.manual_seed(1)
    with torch.inference_mode():
        enc = m.encode(torch.randn(3, 80, 3000, device=device))
        prompts = [[SPECIAL.sot, SPECIAL.no_timestamps],
                   [50360, 11, 12, 13, SPECIAL.sot, SPECIAL.no_timestamps],  # a previous-text prompt: longer
                   [SPECIAL.sot, SPECIAL.no_timestamps]]
        batch = dec.decode(enc, prompts, [False] * 3, max_new_tokens=12, min_new_tokens=12)
        alone = [dec.decode(enc[i:i + 1], [prompts[i]], [False], max_new_tokens=12, min_new_tokens=12)[0]
                 for i in range(3)]
    assert [len(r.tokens) for r in batch] == [12, 12, 12]
    assert all(t < SPECIAL.eot and t not in SPECIAL.suppress for r in batch for t in r.tokens)
    assert [r.tokens for r in batch] == [r.tokens for r in alone]
    assert all(not r.ended for r in batch)
    for r, a in zip(batch, alone, strict=True):
        assert r.sum_logprob == pytest.approx(a.sum_logprob, abs=1e-3)
        assert 0.0 <= r.no_speech_prob <= 1.0


class ScriptedModel(torch.nn.Module):
    """A stand-in model whose next-token logits are scripted per step (to test the rules)."""

    def __init__(self, script: list[dict[int, float]]) -> None:
        super().__init__()
        self.dims = DIMS
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.script = script
        self.calls = 0

    def fill_cross(self, cache, encoded, rows=None) -> None:
        pass

    def step(self, cache, tokens, positions, span=None):
        logits = torch.zeros(tokens.shape[0], DIMS.vocab_size)
        for tok, value in self.script[min(self.calls, len(self.script) - 1)].items():
            logits[:, tok] = value
        self.calls += 1
        return logits


def test_timestamp_rules_first_token_and_pairs() -> None:
    tb = SPECIAL.timestamp_begin
    # The prompt is <|sot|> alone, so step 0 already samples. Step 0: text is most likely, then a
    # timestamp past 1.0 s; the rules allow only timestamps <= 1.0 s (tb + 50): tb + 10.
    # Step 1: text. Step 2: a timestamp (closes "<|t|> text <|t|>"). Step 3: text would win, but
    # after "text <|t|>" text is suppressed, and timestamps may not go below the last one (tb + 20
    # is allowed only as the closing one of a pair): tb + 30.
    script = [{500: 9.0, tb + 200: 8.0, tb + 10: 5.0}, {600: 9.0}, {tb + 20: 9.0, 601: 1.0},
              {700: 9.0, tb + 20: 1.0, tb + 30: 2.0}, {SPECIAL.eot: 9.0}]
    model = ScriptedModel(script)
    dec = GreedyDecoder(model, SPECIAL, max_batch=1, max_prompt=8, use_cuda_graphs=False)
    [row] = dec.decode(torch.zeros(1, 1500, 64), [[SPECIAL.sot]], [True], max_new_tokens=10)
    assert row.tokens[0] == tb + 10  # first token a timestamp, at most 1.0 s
    assert row.tokens[1] == 600
    assert row.tokens[2] == tb + 20
    assert row.tokens[3] == tb + 30  # text suppressed after "text <|t|>"; never below tb + 20
    assert row.ended


def test_without_timestamps_never_samples_a_timestamp_and_suppresses_blank_first() -> None:
    # Step 0 consumes <|sot|>; step 1 samples the first token: timestamps are off, blank and
    # end-of-text are suppressed at the first sampled position, so 42 wins.
    script = [{}, {SPECIAL.timestamp_begin: 9.0, SPECIAL.blank: 8.0, SPECIAL.eot: 7.0, 42: 1.0}, {SPECIAL.eot: 9.0}]
    dec = GreedyDecoder(ScriptedModel(script), SPECIAL, max_batch=1, max_prompt=8, use_cuda_graphs=False)
    [row] = dec.decode(torch.zeros(1, 1500, 64), [[SPECIAL.sot, SPECIAL.no_timestamps]], [False])
    assert row.tokens == [42]
    assert row.ended


def test_bad_batches_are_refused() -> None:
    dec = GreedyDecoder(make_model("cpu"), SPECIAL, max_batch=2, max_prompt=4)
    enc = torch.zeros(3, 1500, 64)
    with pytest.raises(ValueError, match=re.escape("1..2 rows")):
        dec.decode(enc, [[SPECIAL.sot]] * 3, [False] * 3)
    with pytest.raises(ValueError, match="startoftranscript"):
        dec.decode(enc[:1], [[1, 2]], [False])
    with pytest.raises(ValueError, match="at most 4"):
        dec.decode(enc[:1], [[SPECIAL.sot] * 5], [False])


def test_cuda_target_is_refused_on_another_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_mod.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(backend_mod.torch.cuda, "get_device_capability", lambda i=0: (8, 9))
    with pytest.raises(EngineMismatchError, match=r"built for sm86, but this GPU is sm89.*cuda-sm89-fp16"):
        backend_mod._device_for(Target.parse("cuda-sm86-fp16"))
    monkeypatch.setattr(backend_mod.torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineMismatchError, match="needs a CUDA GPU"):
        backend_mod._device_for(Target.parse("cuda-sm90-bf16"))
    assert backend_mod._device_for(Target.parse("cpu-x86_64-fp32")).type == "cpu"


def test_dims_from_config_names_a_missing_key() -> None:
    cfg = {k: getattr(DIMS, k) for k in DIMS.__dataclass_fields__}
    assert WhisperDims.from_config(cfg) == DIMS
    del cfg["d_model"]
    with pytest.raises(ValueError, match="'d_model'"):
        WhisperDims.from_config(cfg)
    assert replace(DIMS, d_model=8).d_model == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (runs on the GPU machine)")
def test_every_graph_is_captured_up_front_and_decoding_then_captures_none() -> None:
    dec = GreedyDecoder(make_model("cuda"), SPECIAL, max_batch=8, max_prompt=8)
    assert dec.capture_all() == 4 * len(dec.spans)  # buckets 1, 2, 4, 8
    n = len(dec._graphs)
    with torch.inference_mode():
        enc = torch.randn(3, 1500, 64, device="cuda")
        rows = dec.decode(enc, [[SPECIAL.sot, SPECIAL.no_timestamps]] * 3, [False] * 3, max_new_tokens=5,
                          min_new_tokens=5)
    assert len(dec._graphs) == n and [len(r.tokens) for r in rows] == [5, 5, 5]


def test_capture_all_is_a_no_op_without_cuda_graphs() -> None:
    assert GreedyDecoder(make_model("cpu"), SPECIAL, max_batch=4, max_prompt=8).capture_all() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (runs on the GPU machine)")
def test_the_graphed_encoder_equals_the_encoder_for_every_row_count() -> None:
    m = make_model("cuda")
    enc = GraphedEncoder(m, max_batch=8)
    with torch.inference_mode():
        for n in (1, 3, 8, 5):  # buckets 1, 4, 8 (captured), then 8 again with other rows (replayed)
            feats = torch.randn(n, DIMS.num_mel_bins, 3000, device="cuda")
            torch.testing.assert_close(enc(feats), m.encode(feats), rtol=1e-4, atol=1e-4)
    assert sorted(enc._graphs) == [1, 4, 8]
    with pytest.raises(ValueError, match=re.escape("1..8 windows")):
        enc(torch.zeros(9, DIMS.num_mel_bins, 3000, device="cuda"))


def test_the_encoder_is_graphed_only_on_a_gpu_and_up_to_small_width() -> None:
    assert not GraphedEncoder.enabled_for(make_model("cpu"), torch.device("cpu"))
    assert GraphedEncoder.enabled_for(make_model("cpu"), torch.device("cuda"))  # width 64 <= 768
    wide = Whisper(replace(DIMS, d_model=1280, encoder_attention_heads=4, decoder_attention_heads=4))
    assert not GraphedEncoder.enabled_for(wide, torch.device("cuda"))

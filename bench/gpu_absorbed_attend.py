"""Cross-attention with the key and value projections absorbed, against the served FP8 keys and
values, at large-v3's shapes (32 layers, 20 heads of 64, width 1280, 1500 positions, bf16, random
weights; ``bench/absorbed_attention.py`` says what is absorbed and why).

Per row count, each replayed from a CUDA graph (``gpu_step_parts.graph_ms``), milliseconds a step:

- ``kernel``: the attention kernels alone over 32 layers: ``attend`` over each layer's FP8 keys and
  values (2 x 1500 x 1280 bytes a row and layer), against ``absorbed_attend`` over the one FP8
  encoder output (1500 x 1280 bytes a row, every layer), for each configuration in ``--configs``;
- ``block``: a step's whole cross-attention over 32 layers, query projection to output projection
  (the absorbed form adds each head's key projection to the query and value projection to the
  output, two batched products a layer), eager and compiled (``torch.compile``, the kernels as
  custom operators, as the served step is; only when the best absorbed kernel beats ``attend``);
- ``fill``: a window's cross-attention cache at encode time: 64 projections and their FP8 fill
  (``quantize_into``), against one FP8 copy of the encoder output (``quantize_positions``);
- ``error``: one layer's output of each form against float32 attention over the unquantized
  encoder output (largest difference over the largest value, and cosine).

    python3 bench/gpu_absorbed_attend.py --json $OUT/absorbed_attend.json [--rows 64,128]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_step_parts import graph_ms
from tideserve.worker.backends.torch_whisper import triton_kernels as tk
import absorbed_attention as ab
from tideserve.worker.backends.torch_whisper import cuda_kernels

D, H, T, LAYERS = 1280, 20, 1500, 32
HD = D // H
# kernel/block_t/num_warps/heads_per_program/num_stages: h = absorbed_attend ("heads"), p = the
# "positions" kernel (absorbed_attention's doc); the fastest of each measured on an H100 first
CONFIGS = "h/64/8/16/1,h/32/8/32/1,h/32/8/16/1,h/64/8/32/1,p/64/8/32/1,p/128/8/32/1,p/128/8/32/2"


def kernel(cfg: str):
    """A function ``(qa, e8, es) -> u`` for one configuration of ``CONFIGS``, or ``m/<split>``: the
    CUDA kernel of ``torch_whisper.cuda_kernels`` (both products on FP8 tensor cores), and
    ``m/<split>/<macros>`` a diagnostic build of it (macros joined by ``+``)."""
    if cfg.startswith("m/"):  # m/<split>[/<macro>+<macro>]: a build of cuda_kernels' (SKIP_SCORES, SKIP_OUTPUT,
        # FRAGMENTS_AHEAD, BULK_COPY)
        split, *diag = cfg.split("/")[1:]
        defines = diag[0].replace("+", ",") if diag else ""
        return lambda qa, e8, es: cuda_kernels.absorbed_attend(qa, e8, es, HD, split=int(split), diagnostic=defines)
    name, bt, nw, hb, st = cfg.split("/")
    kw = dict(block_t=int(bt), num_warps=int(nw), heads_per_program=int(hb), num_stages=int(st))
    attend = {"h": ab.absorbed_attend, "p": ab.absorbed_attend_positions}[name]
    return lambda qa, e8, es: attend(qa, e8, es, HD, **kw)


def weights() -> list[dict[str, torch.Tensor]]:
    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    def b() -> torch.Tensor:
        return torch.randn(D, device="cuda", dtype=torch.bfloat16) * 0.1
    out = []
    for _ in range(LAYERS):
        lw = {"wq": w(D, D), "bq": b(), "wk": w(D, D), "wv": w(D, D), "bv": b(), "wo": w(D, D), "bo": b()}
        lw["wk3"] = lw["wk"].view(H, HD, D)                         # q_h W_k,h: [H, hd, D]
        lw["wv3t"] = lw["wv"].view(H, HD, D).transpose(1, 2).contiguous()  # u_h W_v,h^T: [H, D, hd]
        out.append(lw)
    return out


def kv_cache(ws: list[dict[str, torch.Tensor]], enc: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's FP8 keys and values and their scales, as ``Whisper.fill_cross`` writes them."""
    m = enc.shape[0]
    caches = []
    for lw in ws:
        k8 = torch.empty(m, H, T, HD, dtype=torch.float8_e4m3fn, device="cuda")
        v8, ks, vs = torch.empty_like(k8), torch.ones(m, H, device="cuda"), torch.ones(m, H, device="cuda")
        tk.quantize_into(F.linear(enc, lw["wk"]).view(m, T, H, HD).transpose(1, 2), k8, ks)
        tk.quantize_into(F.linear(enc, lw["wv"], lw["bv"]).view(m, T, H, HD).transpose(1, 2), v8, vs)
        caches.append((k8, v8, ks, vs))
    return caches


@torch.library.custom_op("tideserve_bench::absorbed_attend", mutates_args=())
def absorbed_op(qa: torch.Tensor, e8: torch.Tensor, es: torch.Tensor, config: str) -> torch.Tensor:
    """``kernel(config)`` as a custom operator, opaque to Inductor (as the served kernels are)."""
    return kernel(config)(qa, e8, es)


@absorbed_op.register_fake
def _absorbed_shape(qa: torch.Tensor, e8: torch.Tensor, es: torch.Tensor, config: str) -> torch.Tensor:
    return qa.new_empty(qa.shape)


def old_layer(x: torch.Tensor, lw: dict[str, torch.Tensor], c: tuple[torch.Tensor, ...], attend=tk.attend) -> torch.Tensor:
    m = x.shape[0]
    q = F.linear(x, lw["wq"], lw["bq"]).view(m, H, HD)
    return F.linear(attend(q, *c).reshape(m, D), lw["wo"], lw["bo"])


def new_layer(x: torch.Tensor, lw: dict[str, torch.Tensor], e8: torch.Tensor, es: torch.Tensor,
              attend) -> torch.Tensor:
    m = x.shape[0]
    q = F.linear(x, lw["wq"], lw["bq"]).view(m, H, HD)
    qa = torch.matmul(q.transpose(0, 1), lw["wk3"]).transpose(0, 1)           # [m, H, D]
    u = attend(qa, e8, es)                                                    # [m, H, D]
    o = torch.matmul(u.transpose(0, 1), lw["wv3t"]).transpose(0, 1) + lw["bv"].view(H, HD)  # [m, H, hd]
    return F.linear(o.reshape(m, D), lw["wo"], lw["bo"])


def compare(a: torch.Tensor, ref: torch.Tensor) -> dict:
    a, ref = a.float().flatten(), ref.float().flatten()
    return {"max_err_over_max": round(((a - ref).abs().max() / ref.abs().max()).item(), 5),
            "cosine": round(F.cosine_similarity(a, ref, dim=0).item(), 6)}


def measure(m: int, ws: list[dict[str, torch.Tensor]], configs: str, compiled: bool) -> dict:
    """One row count's figures (the module doc's list)."""
    # an encoder output as ln_post leaves it: per position normalised, channels scaled unevenly
    enc = (torch.randn(m, T, D, device="cuda") * torch.linspace(0.2, 2.0, D, device="cuda")).to(torch.bfloat16)
    caches = kv_cache(ws, enc)
    e8, es = ab.quantize_positions(enc)
    x = torch.randn(m, D, device="cuda", dtype=torch.bfloat16)
    row: dict = {"rows": m, "kernel": {}, "block": {}}
    gb = m * T * D * LAYERS / 1e9
    qs = [F.linear(x, lw["wq"], lw["bq"]).view(m, H, HD) for lw in ws]
    qas = [torch.matmul(q.transpose(0, 1), lw["wk3"]).transpose(0, 1).contiguous() for q, lw in zip(qs, ws, strict=True)]
    t_old = graph_ms(lambda: [tk.attend(q, *c) for q, c in zip(qs, caches, strict=True)])
    row["kernel"]["attend_fp8_kv"] = {"ms": round(t_old, 3), "tb_s": round(2 * gb / t_old, 2)}
    print(m, "attend", row["kernel"]["attend_fp8_kv"], flush=True)
    # each configuration's u for one layer against float32 over the dequantized FP8 E
    ed = e8.float() * es[..., None]
    u_ref = torch.softmax(qas[0].float() @ ed.transpose(1, 2) * HD ** -0.5, dim=-1) @ ed
    del ed
    for cfg in configs.split(","):
        try:
            fn = kernel(cfg)
            t = graph_ms(lambda fn=fn: [fn(qa, e8, es) for qa in qas])
            row["kernel"][cfg] = {"ms": round(t, 3), "tb_s": round(gb / t, 2),
                                  "u_vs_float32": compare(fn(qas[0], e8, es), u_ref)}
        except Exception as exc:  # a configuration Triton cannot build (registers, shared memory)
            row["kernel"][cfg] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(m, cfg, row["kernel"][cfg], flush=True)
    # the best real build (a diagnostic one, with products or all but the loads left out, computes nothing)
    ok = {c: v["ms"] for c, v in row["kernel"].items() if "ms" in v and c != "attend_fp8_kv" and "SKIP" not in c and "LOADS_ONLY" not in c}
    if not ok:
        return row  # no configuration built: nothing more to measure
    best = min(ok, key=ok.get)
    best_fn = kernel(best)
    row["best_config"] = best
    # accuracy of one layer against float32 attention over the unquantized encoder output
    lw, ef = ws[0], enc.float()
    k = F.linear(ef, lw["wk"].float()).view(m, T, H, HD).transpose(1, 2)
    v = F.linear(ef, lw["wv"].float(), lw["bv"].float()).view(m, T, H, HD).transpose(1, 2)
    ref = F.scaled_dot_product_attention(qs[0].float()[:, :, None], k, v)[:, :, 0]
    u = best_fn(qas[0], e8, es)
    o_new = torch.matmul(u.transpose(0, 1), lw["wv3t"]).transpose(0, 1) + lw["bv"].view(H, HD)
    row["error"] = {"fp8_kv": compare(tk.attend(qs[0], *caches[0]), ref), "absorbed": compare(o_new, ref)}
    print(m, "error", row["error"], flush=True)
    del k, v, ef, ref
    row["block"]["eager_fp8_kv"] = round(graph_ms(lambda: [old_layer(x, lw, c) for lw, c in zip(ws, caches, strict=True)]), 3)
    row["block"]["eager_absorbed"] = round(graph_ms(lambda: [new_layer(x, lw, e8, es, best_fn) for lw in ws]), 3)
    print(m, "block", row["block"], flush=True)
    if compiled and ok[best] < t_old:  # compiled blocks only for a kernel faster than the served one
        def best_op(qa: torch.Tensor, e8: torch.Tensor, es: torch.Tensor) -> torch.Tensor:
            return absorbed_op(qa, e8, es, best)
        def old_all(x: torch.Tensor) -> torch.Tensor:
            for lw, c in zip(ws, caches, strict=True):
                x = x + old_layer(x, lw, c, attend=tk.attend_op)
            return x
        def new_all(x: torch.Tensor) -> torch.Tensor:
            for lw in ws:
                x = x + new_layer(x, lw, e8, es, best_op)
            return x
        for name, fn in (("compiled_fp8_kv", old_all), ("compiled_absorbed", new_all)):
            torch._dynamo.reset()
            cf = torch.compile(fn, dynamic=False)
            row["block"][name] = round(graph_ms(lambda cf=cf: cf(x)), 3)
            print(m, name, row["block"][name], flush=True)
    # a window's cache at encode time (per window, from a batch of up to 16 windows)
    few = enc[:16]
    n_few = few.shape[0]
    def fill_old() -> None:
        kv_cache(ws, few)
    def fill_new() -> None:
        ab.quantize_positions(few)
    row["fill_ms_per_window"] = {"fp8_kv": round(graph_ms(fill_old, replays=5) / n_few, 3),
                                 "absorbed": round(graph_ms(fill_new, replays=5) / n_few, 3)}
    print(m, "fill", row["fill_ms_per_window"], flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--rows", default="64,128")
    ap.add_argument("--configs", default=CONFIGS, help="comma list of kernel/block_t/num_warps/heads_per_program/num_stages (CONFIGS)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled blocks")
    a = ap.parse_args()
    torch.manual_seed(0)
    ws = weights()
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    for m in (int(r) for r in a.rows.split(",")):
        res["rows"].append(measure(m, ws, a.configs, not a.no_compile))
        torch.cuda.empty_cache()
        a.json.write_text(json.dumps(res, indent=2))
    a.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

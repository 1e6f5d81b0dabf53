"""Checks the absorbed cross-attention kernel (``tideserve.worker.backends.torch_whisper.cuda_kernels``,
whose doc says what it does and why) against float32 on a GPU: large-v3's width (1280, 20 heads)
and tiny's (384, 6 heads), first with qa = 0 (uniform probabilities: the output product alone),
then random; split 1 and 2; also against ``absorbed_attend_reference`` (the kernel's
roundings in PyTorch). ``bench/gpu_absorbed_attend.py --configs m/1,m/2`` times it.

    python3 bench/absorbed_mma.py [MACROS]   # e.g. WGMMA: the sm_90a kernel (cuda_kernels._compiled);
                                             # exits 1 above 0.05 of the largest value
"""

from __future__ import annotations

import sys

import torch

from tideserve.worker.backends.torch_whisper.cuda_kernels import E4M3_MAX, absorbed_attend, absorbed_attend_reference


def _check_on_gpu(build: str = "") -> float:
    """``python3 bench/absorbed_mma.py``: the kernel against float32 on small random inputs, first
    with qa = 0 (uniform probabilities: the output product alone), then random; split 1 and 2;
    also against ``absorbed_attend_reference`` (the kernel's roundings in PyTorch)."""
    torch.manual_seed(0)
    # 130 positions: three blocks (an odd count, the second stage's barrier used twice), the last
    # partial, and split 4 leaves one part without a block
    worst = 0.0
    for b, h, t, d, splits in ((3, 20, 1500, 1280, (1, 2)), (2, 6, 1500, 384, (1, 2)), (2, 20, 130, 1280, (1, 4)),
                               (2, 16, 1500, 1024, (1,)), (2, 8, 1500, 512, (1,))):
        worst = max(worst, _check_one(b, h, t, d, build, splits))
    return worst


def _check_one(b: int, h: int, t: int, d: int, build: str, splits: tuple[int, ...]) -> float:
    """The largest difference over the largest value against ``absorbed_attend_reference``, over
    both inputs and every split."""
    worst = 0.0
    enc = torch.randn(b, t, d, device="cuda") * torch.linspace(0.2, 2.0, d, device="cuda")
    es = torch.clamp(enc.abs().amax(dim=2) / E4M3_MAX, min=1e-12)
    e8 = (enc / es[..., None]).to(torch.float8_e4m3fn)
    ed = e8.float() * es[..., None]
    for name, qa in (("qa=0", torch.zeros(b, h, d, device="cuda")), ("random", torch.randn(b, h, d, device="cuda"))):
        qa = qa.to(torch.bfloat16)
        ref = torch.softmax(qa.float() @ ed.transpose(1, 2) * 64 ** -0.5, dim=-1) @ ed  # [b, h, d]
        for split in splits:
            u = absorbed_attend(qa, e8, es, 64, split=split, diagnostic=build).float()
            err = ((u - ref).abs().max() / ref.abs().max()).item()
            cos = torch.nn.functional.cosine_similarity(u.flatten(), ref.flatten(), dim=0).item()
            mirror = absorbed_attend_reference(qa.float(), e8, es, 64)
            err_m = ((u - mirror).abs().max() / mirror.abs().max()).item()
            print(f"width {d}, {t} positions, {name}, split {split}: against float32 max err / max {err:.5f}, cosine {cos:.6f}; "
                  f"against absorbed_attend_reference {err_m:.5f}", flush=True)
            worst = max(worst, err_m if err_m == err_m else float("inf"))  # NaN counts as the worst
            if not err_m <= 0.05:
                print("  " + where_wrong(u, mirror), flush=True)
    return worst


def where_wrong(u: torch.Tensor, ref: torch.Tensor, limit: float = 0.05) -> str:
    """Where ``u [B, H, D]`` differs from ``ref`` by more than ``limit`` of ref's largest value: the
    rows, heads and groups of 32 columns (an output tile's width; the warp-group kernel gives each of
    its two warp groups half the groups) with such a difference, and the share of wrong values;
    for localising a wrong build in one device call. E.g. ``rows [0, 1], heads [8..15] of 20, col
    groups [0..19] of 40, 20.0% of values``."""
    bad = (u - ref).abs() > limit * ref.abs().max()              # [B, H, D]
    bad = bad | ~torch.isfinite(u)

    def spans(idx: list[int]) -> str:
        out, start = [], None
        for i, k in enumerate(idx):
            if start is None:
                start = k
            if i + 1 == len(idx) or idx[i + 1] != k + 1:
                out.append(f"{start}" if start == k else f"{start}..{k}")
                start = None
        return "[" + ", ".join(out) + "]"

    b, h, d = bad.shape
    rows = bad.flatten(1).any(dim=1).nonzero().flatten().tolist()
    heads = bad.any(dim=2).any(dim=0).nonzero().flatten().tolist()
    groups = bad.reshape(b, h, d // 32, 32).any(dim=3).any(dim=1).any(dim=0).nonzero().flatten().tolist()
    return (f"rows {spans(rows)} of {b}, heads {spans(heads)} of {h}, col groups {spans(groups)} of {d // 32}, "
            f"{100.0 * bad.float().mean().item():.1f}% of values")


if __name__ == "__main__":
    # exit 1 where the build differs from its reference by more than 0.05 of the largest value (the
    # mma.sync kernel's worst is 0.025, random queries at width 1280)
    worst = _check_on_gpu(sys.argv[1] if len(sys.argv) > 1 else "")
    print(f"worst against absorbed_attend_reference: {worst:.5f}")
    sys.exit(0 if worst <= 0.05 else 1)

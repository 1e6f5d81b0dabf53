"""Launches the absorbed cross-attention kernel (``torch_whisper.cuda_kernels``) at large-v3's
shapes (width 1280, 20 heads, 1500 positions) a few times per build, for a profiler to read:

    ncu --clock-control none --kernel-name absorbed_mma --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \\
        python3 bench/absorbed_profile.py --rows 128 --builds ,BULK_COPY

Each build is launched ``--launches`` times (the first compiles it); ``--launch-skip`` and
``--launch-count`` pick which ncu reads. Prints each build's mean time a launch (CUDA events,
outside the profiler only meaningful without ncu)."""

from __future__ import annotations

import argparse

import torch

from tideserve.worker.backends.torch_whisper.cuda_kernels import E4M3_MAX, absorbed_attend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--builds", default=",BULK_COPY", help="comma list of builds; macros joined by +; empty = default")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--split", type=int, default=1)
    args = ap.parse_args()
    d, h, t = 1280, 20, 1500
    torch.manual_seed(0)
    enc = torch.randn(args.rows, t, d, device="cuda") * torch.linspace(0.2, 2.0, d, device="cuda")
    es = torch.clamp(enc.abs().amax(dim=2) / E4M3_MAX, min=1e-12)
    e8 = (enc / es[..., None]).to(torch.float8_e4m3fn)
    del enc
    qa = torch.randn(args.rows, h, d, device="cuda").to(torch.bfloat16)
    for build in args.builds.split(","):
        macros = build.replace("+", ",")
        absorbed_attend(qa, e8, es, 64, split=args.split, diagnostic=macros)  # compile
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.launches):
            absorbed_attend(qa, e8, es, 64, split=args.split, diagnostic=macros)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.launches
        gb = args.rows * t * d / 1e9
        print(f"build {build or 'default'}: {ms:.3f} ms a launch, {gb / ms:.2f} TB/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

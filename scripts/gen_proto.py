"""Regenerate the Python modules of tideserve's gRPC protocols: KEDA's external scaler and
the KServe v2 / Triton inference service.

    python scripts/gen_proto.py            # writes src/tideserve/gateway/{externalscaler,inference}_pb2{.py,.pyi,_grpc.py}
    python scripts/gen_proto.py --out DIR  # writes them under DIR/tideserve/gateway/ instead

Uses grpcio-tools (pinned in requirements/test.lock), so the output is reproducible;
tests/unit/gateway/test_externalscaler_proto.py checks the committed modules equal a fresh run.
The proto path is given relative to ``src`` so the generated ``_grpc`` module imports
``tideserve.gateway.externalscaler_pb2`` (an absolute package import, not a top-level one).
The ``.pyi`` stub (protoc's ``--pyi_out``) gives mypy the message classes, which the ``.py``
module only builds at run time from the serialized descriptor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

SRC = Path(__file__).resolve().parents[1] / "src"
#: (proto, has a service whose gRPC module is generated)
PROTOS = (("tideserve/gateway/externalscaler.proto", True), ("tideserve/gateway/inference.proto", False))


def generate(out: Path) -> list[Path]:
    """Run protoc on each of PROTOS into ``out``; return the generated files. Raises
    RuntimeError on failure."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for proto, service in PROTOS:
        grpc_out = [f"--grpc_python_out={out}"] if service else []
        code = protoc.main(["grpc_tools.protoc", f"-I{SRC}", f"--python_out={out}", f"--pyi_out={out}",
                            *grpc_out, str(SRC / proto)])
        if code != 0:
            raise RuntimeError(f"protoc failed on {SRC / proto} (exit {code})")
        stem = out / proto.removesuffix(".proto")
        files += [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi")] + ([Path(f"{stem}_pb2_grpc.py")] if service else [])
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SRC, help="output root (default: src)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

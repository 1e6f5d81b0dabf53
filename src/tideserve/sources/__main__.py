"""``python -m tideserve.sources URI [--cache-dir DIR]``: fetch a model source into the cache and
print its local directory. The Kubernetes worker pods run it as an init container (hf://), so
the model is on the pod's cache volume before the worker starts; exit 1 with the reason when
the source cannot be fetched."""

from __future__ import annotations

import argparse
import logging
import sys

from tideserve.errors import SourceError
from tideserve.sources import prefetch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tideserve.sources", description="Fetch a model source into the cache.")
    p.add_argument("uri", help="pkg://, file://, s3:// or hf:// model source")
    p.add_argument("--cache-dir", default=None, help="tideserve cache directory (s3://); hf:// uses $HF_HUB_CACHE")
    p.add_argument("--allowed-file-root", action="append", default=[], help="directory file:// sources may lie under")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        print(prefetch(args.uri, args.allowed_file_root, args.cache_dir))
    except SourceError as exc:
        print(f"cannot fetch {args.uri}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

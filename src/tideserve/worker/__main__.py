import time

# Wall-clock time the interpreter reached our code, before the heavy imports (cold-start phases).
STARTED_AT = time.time()

from tideserve.worker.server import main  # noqa: E402

raise SystemExit(main(started_at=STARTED_AT))

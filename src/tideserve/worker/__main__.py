from tideserve.worker.server import main

raise SystemExit(main())

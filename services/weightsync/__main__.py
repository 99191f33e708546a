"""``python -m nibble.weightsync --config FILE``."""

from nibble.weightsync.main import main

raise SystemExit(main())

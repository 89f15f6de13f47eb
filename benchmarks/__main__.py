"""`python -m benchmarks ...` from the source checkout (what `agent-sandbox bench ...` runs)."""

from __future__ import annotations

import sys

from .cli import main
from .interrupt import stop_cleanly_on_sigterm

stop_cleanly_on_sigterm()
sys.exit(main())

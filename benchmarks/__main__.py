"""`python -m benchmarks ...` from the source checkout (what `agent-sandbox bench ...` runs)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())

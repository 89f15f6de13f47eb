"""`python -m benchmarks.router`: see `benchmarks.router.run`."""

from __future__ import annotations

import sys

from .run import main

sys.exit(main())

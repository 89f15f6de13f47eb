"""`python -m benchmarks.router`: see `benchmarks.router.run`."""

from __future__ import annotations

import sys

from ..interrupt import stop_cleanly_on_sigterm
from .run import main

stop_cleanly_on_sigterm()
sys.exit(main())

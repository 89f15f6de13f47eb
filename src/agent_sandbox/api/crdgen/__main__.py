"""``python -m agent_sandbox.api.crdgen [--check]``."""

from __future__ import annotations

import sys

from agent_sandbox.api.crdgen import main

sys.exit(main())

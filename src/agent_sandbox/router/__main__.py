"""`python -m agent_sandbox.router`: same as the `agent-sandbox-router` console script."""

from ._main import main

main()

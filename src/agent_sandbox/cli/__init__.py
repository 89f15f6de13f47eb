"""agent_sandbox.cli."""

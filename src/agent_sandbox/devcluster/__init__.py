"""agent_sandbox.devcluster."""

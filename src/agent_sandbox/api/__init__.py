"""agent_sandbox.api."""

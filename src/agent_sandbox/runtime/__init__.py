"""agent_sandbox.runtime."""

"""agent_sandbox.router."""

"""agent_sandbox.sdk."""

"""agent_sandbox.controllers."""

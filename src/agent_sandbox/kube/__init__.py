"""agent_sandbox.kube."""

"""agent-sandbox: Kubernetes sandboxes for agents (agents.x-k8s.io), in Python."""

__version__ = "0.1.0"

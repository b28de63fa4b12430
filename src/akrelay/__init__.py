"""akrelay: a federated relay and KIP gateway for agent-knowledge/1.0 capsules."""

__version__ = "0.1.0"

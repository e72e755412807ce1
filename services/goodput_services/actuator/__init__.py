"""Actuator: executes commands on a backend (local processes or Kubernetes)."""

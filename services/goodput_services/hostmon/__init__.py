"""Host monitor: per-node GPU and host health, fault injection."""

"""Checkpoint tier (replicator): per-node replication, backup and restore of checkpoints."""

"""Policy scripts for the simulator's intermediate strategies (loaded by path, like a user's)."""

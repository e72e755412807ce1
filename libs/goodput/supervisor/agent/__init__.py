"""The node agent (``goodput agent --node NAME``): one per host, it announces the host on the
bus and starts, signals and reports that host's ranks on the actuator's commands (the
actuator's ``agent`` backend drives it). ``host.py``: the host's address and GPUs;
``registry.py``: the agent's record in ``gp_agents`` (claim, refresh, read); ``ranks.py``:
the rank processes and standby ranks; ``node.py``: the agent itself; ``slurm.py``: Slurm's environment."""

"""The supervisor's decisions and its host side: what the sensor, controller and actuator
services run.

- ``detect``: the sensor's pure detector (events in, signals with reasons out, the clock an
  argument);
- ``control``: the controller's pure engine (signals in, decisions out; the job's state folded
  from the bus, the checkpoint interval, crash loops, policy scripts);
- ``membership``: which nodes and ranks form the job, as the actuator observes them;
- ``standby_pool`` and ``agent``: a host's pre-warmed standby ranks, and the node agent that
  launches ranks where no kubelet does (Slurm, bare hosts).

The remediation policy itself is public API: :mod:`goodput.policy`.
"""

"""What a process and whoever starts it agree on, each contract in one module: a rank's
environment (``rank_env``), a standby's channel (``standby_channel``), where a rank's output
goes (``rank_logs``) and how a service says why it exited (``exit_reason``). No torch, no bus
at import: the actuator, a node agent and the rank itself all import these."""

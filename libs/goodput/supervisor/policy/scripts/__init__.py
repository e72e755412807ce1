"""Example remediation policy scripts, passed to the controller by path (``--policy FILE``).

See :mod:`goodput.supervisor.policy` for the interface: a file defining
``decide(signal, state)`` that returns a ``Plan`` or a list of commands.
"""

"""The remediation policy API, under its public name: what a policy script imports.

``from goodput.policy import JobState, Plan, default_policy``: the names of
:mod:`goodput.supervisor.policy`, where the controller's built-in policy and the state it
decides on live (see there for the script interface).
"""

from goodput.supervisor.policy import *  # noqa: F403
from goodput.supervisor.policy import __all__  # noqa: F401

"""Fault injection against the project's own job: one fault from the CLI, or a scenario of them.

``spec`` says what each fault is (msgspec structs shared by the CLI and scenario files),
``targets`` finds the job's ranks, services and volumes, ``actions`` applies a fault,
``scenario`` parses, plans and runs a schedule of faults.
"""

from goodput.tools.chaos.actions import FaultOutcome, fire
from goodput.tools.chaos.scenario import (
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
    plan,
)
from goodput.tools.chaos.targets import ChaosContext, ChaosError

__all__ = [
    "ChaosContext",
    "ChaosError",
    "FaultOutcome",
    "Scenario",
    "ScenarioError",
    "fire",
    "load_scenario",
    "parse_scenario",
    "plan",
]

"""The controller's logic, pure: signals and actuator facts in, decisions and commands out.

The engine (``engine.Controller``) folds what it observes into a ``JobState``
(``state``), asks the policy (built-in, or a user's script through ``script_policy``) for a
plan, validates it, and returns an ``Outcome`` with the decisions, commands and their reasons;
it reads no clock (``now`` is an argument) and does no I/O. The controller service executes the
outcome; ``goodput simulate`` drives the same engine on a simulated clock.
"""

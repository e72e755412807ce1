"""``JobState``, the one owner: what the controller knows of a job and a policy decides on.

``model``: the state and its records (msgspec Structs, kept in the ``gp_state`` KV bucket, a
copy handed to each policy call); ``folds``: every pure function that changes it (the start,
each signal, status, result and command, and the view a policy reads). The policy API
re-exports the state's names (:mod:`goodput.policy`); the controller's engine, the service and
the simulator fold it with the same functions.
"""

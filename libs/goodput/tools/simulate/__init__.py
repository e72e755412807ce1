"""`goodput simulate`: a discrete-event SIMULATOR of one training job on a fleet.

Nothing trains here. Seeded failures are priced by a cost profile, and goodput's real
decision code decides: the sensor's Detector, the controller engine with the built-in policy
or a policy script, and Young's checkpoint interval. See :mod:`goodput.tools.simulate.world`.
"""

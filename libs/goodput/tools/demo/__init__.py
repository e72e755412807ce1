"""`goodput demo`: the whole system on embedded defaults, driven through a fault scenario.

``scenarios`` says which faults a demo injects and when, ``driver`` injects them into a
running job through the chaos tool, ``session`` runs one configuration (goodput's remediation
or the baseline) from stack start to goodput report.
"""

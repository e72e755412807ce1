"""Goodput measurement: the calculator and its report (``accounting``), the live job view
(``jobview``) and the trainer's OpenTelemetry metrics (``metrics``)."""

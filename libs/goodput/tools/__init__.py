"""What a user runs around the system: the ``goodput`` command (``cli``), the embedded stack
(``stack``), the demo (``demo``), fault injection (``chaos``), benchmarks (``bench``) and the
fleet simulator (``simulate``)."""

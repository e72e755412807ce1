"""The checkpoint index (``gp_ckpt_index``): which node and tier holds which step's files.

The replicators write it; the replicators and ``goodput ckpt`` read it. Records and keys
(:mod:`~goodput.checkpoint.index.records`), reading a consistent snapshot and deciding what is
complete (:mod:`~goodput.checkpoint.index.index`), following it by its changes after one
complete read (:mod:`~goodput.checkpoint.index.follower`: the replicators), retention as a
pure decision (:mod:`~goodput.checkpoint.index.retention`, which the checkpoint engine asks
too) and carrying it out (:mod:`~goodput.checkpoint.index.gc`).
"""

"""Asynchronous multi-tier checkpointing.

- ``format``: the on-disk format, alone (layout, manifest, digests, retention record): the one
  owner every writer and reader imports;
- ``engine``: saving (snapshot to host memory, persist in the background) and restoring, in
  the training process, full or sharded, with ``torch.save``/DCP compatibility;
- ``index``: which step each node and tier holds, and the retention rule;
- ``tiers``: where copies go beyond the node's volume: host memory, peers, an object store.

The trainer reaches it through :mod:`goodput.shim`; the replicator service drives the tiers.
"""

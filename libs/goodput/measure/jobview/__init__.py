"""The job as an operator watches it: a pure model folded from events (``model``) into a
snapshot (``snapshot``), a feed from the bus (``feed``) and rich panels (``render``);
`goodput status` puts them together."""

from goodput.measure.jobview.model import JobModel
from goodput.measure.jobview.snapshot import JobSnapshot

__all__ = ["JobModel", "JobSnapshot"]

"""The sensor's options (``[options]`` of its config file, ``--set KEY=VALUE``)."""

from __future__ import annotations

import msgspec

from goodput.detect.thresholds import Thresholds, updated


class SensorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: the detection thresholds to start with (a SetThresholds command changes them later)
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)

    def __post_init__(self) -> None:
        # the same rules as a SetThresholds command: positive values, decay at most 1
        updated(Thresholds(), msgspec.structs.asdict(self.thresholds))

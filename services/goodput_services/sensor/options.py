"""The sensor's options (``[options]`` of its config file, ``--set KEY=VALUE``)."""

from __future__ import annotations

import msgspec

from goodput.supervisor.detect.thresholds import Thresholds


class SensorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: the detection thresholds to start with (a SetThresholds command changes them later);
    #: ``Thresholds`` validates itself, so decoding refuses a bad value as a command would
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)

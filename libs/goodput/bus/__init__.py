"""The event backbone every goodput part shares: NATS JetStream with msgspec messages."""

from goodput.bus.client import Bus, BusUnavailableError
from goodput.bus.commands import CommandRunner, DoneLog
from goodput.bus.consumer import DurableConsumer
from goodput.bus.credentials import BusCredentialsError, BusSettingsError
from goodput.bus.embedded import EmbeddedNats
from goodput.bus.settings import BusSettings, InsecureBusError

__all__ = [
    "Bus",
    "BusCredentialsError",
    "BusSettings",
    "BusSettingsError",
    "BusUnavailableError",
    "CommandRunner",
    "DoneLog",
    "DurableConsumer",
    "EmbeddedNats",
    "InsecureBusError",
]

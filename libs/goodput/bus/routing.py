"""Events taken from core-NATS subscriptions and stream reads, checked against their subject.

A subscription filters by subject and its handler trusts the message's fields; an event
that names another job, kind, node or rank than the subject it came on is refused here as
an undecodable one is (``subjects.mismatch``), so the caller's existing path for bad input
(counted, skipped, dead-lettered by the durable consumer) takes it.
"""

from __future__ import annotations

from goodput import schemas, subjects


def decode_event_on(subject: str, payload: bytes) -> schemas.Event:
    """The event ``payload`` carries, if it is valid and belongs on ``subject``; else
    :class:`~goodput.schemas.SchemaError` saying why."""
    event = schemas.decode_event(payload)
    misrouted = subjects.mismatch(subject, event)
    if misrouted:
        raise schemas.SchemaError(f"wrong subject: {misrouted}")
    return event

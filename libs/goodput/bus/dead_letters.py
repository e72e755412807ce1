"""A dead letter that always fits: the payload is cut so letter and headers stay under the
server's max payload (a max-size message can always be dead-lettered)."""

from __future__ import annotations

from goodput import schemas

#: room left in a dead letter for its headers (message id, trace context)
DEAD_LETTER_HEADROOM = 4096


def dead_letter_entry(
    *,
    job: str,
    service: str,
    subject: str,
    reason: str,
    payload: bytes,
    stream_seq: int,
    max_payload: int,
) -> schemas.DeadLetter:
    """The dead letter of ``payload``, cut so that letter and headers fit in ``max_payload``."""
    letter = schemas.DeadLetter(
        job=job,
        service=service,
        subject=subject[:1024],
        reason=reason[:2000],
        payload=b"",
        size=len(payload),
        stream_seq=stream_seq,
    )
    # +5: the largest msgpack bin header the payload can add
    room = max(0, max_payload - DEAD_LETTER_HEADROOM - len(schemas.encode(letter)) - 5)
    letter.payload = payload[:room]
    return letter

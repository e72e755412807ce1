"""Whether a job name is free for a new run: a run that is really going blocks it.

A job's stored status can outlive the actuator that wrote it (a stack stopped hard, a host
rebooted), so "running" counts only when the actuator is healthy now and was already up
when it wrote that status.
"""

from __future__ import annotations

import datetime
import time

import nats.js.errors

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import newest_run
from goodput.bus.service_health import read_records, record_is_fresh


def running_clash(
    job: str,
    status: schemas.JobStatus | None,
    run: schemas.RunStarted | None,
    actuator: schemas.ServiceHealth | None,
    now_ns: int,
) -> str | None:
    """One line saying why ``job`` cannot start a new run now, or None if it can."""
    if status is None or status.state not in schemas.LIVE_JOB_STATES:
        return None
    if actuator is None or not actuator.healthy or not record_is_fresh(actuator, now_ns):
        return None  # nobody is running it: the status is what a gone actuator left
    if actuator.started_ts > status.ts:
        return None  # written by an earlier actuator, whose ranks went with it
    started_ns = run.ts if run is not None and run.run_id == status.run_id else status.ts
    started = datetime.datetime.fromtimestamp(started_ns / 1e9, datetime.UTC)
    return (
        f"job {job} is already {status.state} (attempt {status.attempt}, started "
        f"{started:%Y-%m-%d %H:%M:%S} UTC); stop it with goodput down or pick --job"
    )


async def _stored(bus: Bus, bucket: str, key: str) -> schemas.Event | None:
    try:
        kv = await bus.kv(bucket)
        entry = await kv.get(key)
    except nats.js.errors.BucketNotFoundError:
        return None  # a bus no service has provisioned yet
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None
    try:
        return schemas.decode_event(entry.value or b"")
    except schemas.SchemaError:
        return None  # an unreadable record proves nothing is running


async def find_clash(bus: Bus, job: str) -> str | None:
    """:func:`running_clash` on what the bus holds now about ``job``."""
    status = await _stored(bus, subjects.STATE_BUCKET, subjects.kv_key(job, "job_status"))
    run = await newest_run(bus, job)
    return running_clash(
        job,
        status if isinstance(status, schemas.JobStatus) else None,
        run[1] if run is not None else None,
        await _newest_actuator(bus, job),
        time.time_ns(),
    )


async def _newest_actuator(bus: Bus, job: str) -> schemas.ServiceHealth | None:
    """The actuator record refreshed last: the running one's, if any runs (a replaced
    actuator's record stays behind, stale)."""
    actuators, _ = await read_records(bus, job, subjects.ACTUATOR)
    return max(actuators, key=lambda record: record.ts, default=None)


async def missing_actuator(bus: Bus, job: str) -> str | None:
    """One line saying why no actuator would run ``job``'s StartJob now, or None if one would.

    A remote stack (the cluster's services) serves the job named in its own configuration: a
    StartJob for another job name would wait in the stream for an actuator that never comes.
    """
    record = await _newest_actuator(bus, job)
    if record is None or not record_is_fresh(record, time.time_ns()):
        return (
            f"no actuator of job {job} reports on this bus; the cluster's services serve the "
            "job named in their goodput.toml (job = …): pass that name with --job"
        )
    if not record.healthy:
        return f"the actuator of job {job} reports unhealthy: {record.detail}"
    return None

"""A cost profile from this project's own benchmarks, measured on the machine at hand.

``goodput simulate calibrate --from-bench DIR`` reads ``ckpt.json``, ``restore.json`` and
``recovery.json`` (what ``goodput bench ckpt|restore|recovery --json`` print) and writes a
profile TOML in which every number names the benchmark field it came from. What no benchmark
measures is said so in its comment. Restart figures are the cold path's (``recovery.json``
``cold``: every rank started again), the one a profile prices; the header names the machine,
the date and the command. The machine is noisy: given several directories (the benches
repeated), each field is their median, its range in the comment. A save is priced as the
shim makes it, a blocking snapshot: its bandwidth from ``bench ckpt``'s ``goodput_blocking``
method, its fixed part (walking and planning the state's tensors, which a state of hundreds
of small tensors pays more than its bytes) from the example job's own saves in ``bench
recovery``, as are the fixed part of its persist (``latency_s``) and the job's shutdown.
The example job's median step in both of ``bench recovery``'s modes, stepping undisturbed, is
the profile's pace: the load it was measured at, against which a prediction prices a run that
met more or less.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
from pathlib import Path

import msgspec

from goodput.tools.simulate.profile import CostProfile, SimulateError

FILES = ("ckpt.json", "restore.json", "recovery.json")


def _load(directory: Path, name: str) -> dict:
    path = directory / name
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SimulateError(
            f"{path}: {exc.strerror or exc} (write it with `goodput bench "
            f"{name.removesuffix('.json')} --json > {path}`)"
        ) from None
    except json.JSONDecodeError as exc:
        raise SimulateError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SimulateError(f"{path}: not a benchmark result")
    return data


def _get(data: dict, name: str, *keys: str) -> float:
    value: object = data
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise SimulateError(f"{name}: no field {'.'.join(keys)}")
        value = value[key]
    if not isinstance(value, int | float) or value < 0:
        raise SimulateError(f"{name}: {'.'.join(keys)} is not a non-negative number")
    return float(value)


def _machine() -> str:
    """This machine in words: CPU model and count, memory."""
    model = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        model = next(
            (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
            model,
        )
    memory = ""
    with contextlib.suppress(ValueError, OSError):
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    return f"{platform.node() or 'this host'}: {os.cpu_count()} x {model}{memory}"


def _warm(whole: dict, cold: dict) -> list[tuple[str, float, str]]:
    """The warm-restart figures: from ``bench recovery --mode warm`` (``warm``) where it ran,
    else the cold path's, said so (a profile without them would price warm as cold anyway)."""
    startup = round(
        _get(cold, "recovery.json", "startup_s") + _get(cold, "recovery.json", "first_step_s"), 4
    )
    ready = (startup, "not measured apart: a cold rank's start-up (cold startup_s + first_step_s)")
    warm = whole.get("warm")
    if not isinstance(warm, dict):
        why = "no warm mode in recovery.json (bench recovery --mode warm): the cold figure"
        return [
            ("rejoin_s", _get(cold, "recovery.json", "relaunch_s"), why),
            ("warm_startup_s", startup, why),
            ("standby_ready_s", *ready),
        ]
    return [
        ("rejoin_s", _get(warm, "recovery.json", "relaunch_s"), "recovery.json warm.relaunch_s"),
        (
            "warm_startup_s",
            round(
                _get(warm, "recovery.json", "startup_s")
                + _get(warm, "recovery.json", "first_step_s"),
                4,
            ),
            "recovery.json warm.startup_s + first_step_s",
        ),
        ("standby_ready_s", *ready),
    ]


#: one profile field as calibrated: its key, its value and where the value came from; a
#: section header has neither value nor source
Field = tuple[str, float | int | None, str | None]


def calibrate(directories: str | list[str], name: str = "local-bench") -> str:
    """The profile TOML text (checked by loading it back). Several ``directories`` (bench
    runs repeated on the machine, which is noisy) give each field their median, its range
    in the comment."""
    dirs = [directories] if isinstance(directories, str) else list(directories)
    if not dirs:
        raise SimulateError("no benchmark directory to calibrate from")
    runs = [_fields(d) for d in dirs]
    # a pace only where every run has one: a median over some runs would misstate the load
    paced = all(run[1] for run in runs)
    fields = [run[0] + (run[1] if paced else []) for run in runs]
    values = [_median(field) for field in zip(*fields, strict=True)]
    loads = [run[2] for run in runs if run[2] is not None]
    sources = " ".join(dirs)
    lines = [
        f"# Generated by `goodput simulate calibrate --from-bench {sources}` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d} (UTC)",
        "# from `goodput bench ckpt|restore|recovery --json` run on the machine at hand:",
        f"# {_machine()}"
        + (
            f"; 1-minute load average {', '.join(map(str, loads))} before recovery."
            if loads
            else "."
        ),
        f'name = "{name}"',
        'description = "calibrated from goodput bench ckpt, restore and recovery on this machine"',
    ]
    for key, value, source in values:
        if value is None:
            lines += ["", f"[{key}]"]
        else:
            lines.append(f"{key} = {value!r}  # {source}")
    text = "\n".join(lines) + "\n"
    try:
        import tomllib

        msgspec.convert(tomllib.loads(text), CostProfile)
    except (msgspec.ValidationError, ValueError) as exc:
        raise SimulateError(f"the benchmarks in {sources} make no valid profile: {exc}") from None
    return text


def _median(fields: tuple[Field, ...]) -> Field:
    """One field over every run: the median, and the runs' range where they differ."""
    key, value, source = fields[0]
    if value is None:
        return fields[0]
    # a section header is one in every run (the fields' order is this module's)
    every = sorted(float(v) for _, v, _ in fields if v is not None)
    if every[0] == every[-1]:
        return fields[0]
    middle = statistics.median(every)
    median = round(middle) if isinstance(value, int) else round(middle, 4)
    return key, median, f"{source}; median of {len(every)}: {every[0]:g}-{every[-1]:g}"


def _pace(whole: dict) -> list[Field]:
    """The example job's median step, stepping undisturbed, in each mode of ``bench recovery``
    (the profile's pace); none where it ran cold only (a goodput run's steps, beside its
    standbys, have no reference then) or did not measure it (a bench of before)."""
    modes = [
        m
        for m in (whole.get("warm"), whole.get("cold"))
        if isinstance(m, dict) and "pace_step_s" in m
    ]
    if len(modes) < 2:
        return []
    return [
        ("pace", None, None),
        (
            "warm_median_step_s",
            _get(modes[0], "recovery.json", "pace_step_s"),
            "recovery.json warm.pace_step_s (the example job's median step beside a ready "
            "standby per node)",
        ),
        (
            "cold_median_step_s",
            _get(modes[1], "recovery.json", "pace_step_s"),
            "recovery.json cold.pace_step_s (the example job's median step, no standby)",
        ),
    ]


def _fields(directory: str) -> tuple[list[Field], list[Field], object]:
    """One bench run's fields, its pace's (:func:`_pace`) and its load average before
    recovery (None: not reported)."""
    where = Path(directory)
    ckpt, restore, whole_recovery = (_load(where, f) for f in FILES)
    # `goodput bench recovery` reports each mode it ran under its name; the cold one is priced
    recovery = whole_recovery.get("cold", whole_recovery)
    if not isinstance(recovery, dict):
        raise SimulateError("recovery.json: 'cold' is not a benchmark result")
    size = _get(ckpt, "ckpt.json", "size_gb")
    # the shim saves with blocking snapshots (it holds no optimizer to guard an overlap with)
    stall = max(_get(ckpt, "ckpt.json", "methods", "goodput_blocking", "stall_s"), 1e-6)
    peer_size = _get(restore, "restore.json", "size_gb")

    def per_s(gb: float, seconds: float) -> float:
        return round(gb / max(seconds, 1e-6), 4)

    snapshot_gbps = per_s(size, stall)
    job_stall = _get(recovery, "recovery.json", "checkpoint_stall_s")
    job_persist = _get(recovery, "recovery.json", "checkpoint_persist_s")
    job_gb = _get(recovery, "recovery.json", "checkpoint_gb")
    local_write = _get(ckpt, "ckpt.json", "methods", "goodput", "write_gbps")

    object_write = (
        per_s(peer_size, _get(restore, "restore.json", "object_store_backup_s"))
        if "object_store_backup_s" in restore
        else _get(ckpt, "ckpt.json", "methods", "torch_save", "write_gbps")
    )
    object_write_source = (
        "restore.json size_gb / object_store_backup_s"
        if "object_store_backup_s" in restore
        else "ckpt.json methods.torch_save.write_gbps (no object-store backup measured)"
    )
    values: list[Field] = [
        ("checkpoint", None, None),
        (
            "snapshot_gbps",
            snapshot_gbps,
            "ckpt.json size_gb / methods.goodput_blocking.stall_s (the shim's blocking save)",
        ),
        (
            "local_write_gbps",
            local_write,
            "ckpt.json methods.goodput.write_gbps (size / durable_s)",
        ),
        (
            "local_read_gbps",
            _get(ckpt, "ckpt.json", "methods", "goodput", "restore_gbps"),
            "ckpt.json methods.goodput.restore_gbps",
        ),
        (
            "peer_gbps",
            _get(restore, "restore.json", "replication_gbps"),
            "restore.json replication_gbps",
        ),
        (
            "peer_read_gbps",
            per_s(peer_size, _get(restore, "restore.json", "peer_s")),
            "restore.json size_gb / peer_s",
        ),
        ("object_write_gbps", object_write, object_write_source),
        (
            "object_read_gbps",
            per_s(peer_size, _get(restore, "restore.json", "object_store_s")),
            "restore.json size_gb / object_store_s",
        ),
        (
            "latency_s",
            round(max(0.0, job_persist - job_gb / local_write), 4),
            "recovery.json cold.checkpoint_persist_s less the state's write at local_write_gbps:"
            " a save's fixed part to durable (fsync, manifest, commit), 0 in 1 GB bandwidths",
        ),
        ("object_every", 6, "a choice, not a measurement: every 6th checkpoint to the store"),
        (
            "snapshot_latency_s",
            round(max(0.0, job_stall - job_gb / snapshot_gbps), 4),
            f"recovery.json cold.checkpoint_stall_s (the example job's {job_gb:.4f} GB state)"
            " less its copy at snapshot_gbps: walking and planning its tensors",
        ),
        ("restart", None, None),
        ("stop_s", 0.0, "inside recovery.json relaunch_s (SIGKILL of the group)"),
        (
            "launch_s",
            _get(recovery, "recovery.json", "relaunch_s"),
            "recovery.json cold.relaunch_s (decision -> new group spawned)",
        ),
        (
            "startup_s",
            round(
                _get(recovery, "recovery.json", "startup_s")
                + _get(recovery, "recovery.json", "first_step_s"),
                4,
            ),
            "recovery.json cold.startup_s + first_step_s",
        ),
        ("hot_swap_provision_s", 0.0, "not measured: local spares are already running hosts"),
        ("gpu_reset_s", 0.0, "not measured: no GPU to reset on a machine without one"),
        *_warm(whole_recovery, recovery),
        (
            "shutdown_s",
            _get(recovery, "recovery.json", "shutdown_s"),
            "recovery.json cold.shutdown_s (the job's last step -> its ranks saved and exited)",
        ),
        ("detection", None, None),
        (
            "event_latency_s",
            _get(recovery, "recovery.json", "detect_s"),
            "recovery.json cold.detect_s (kill -9 -> crash signal)",
        ),
        ("decision_s", _get(recovery, "recovery.json", "decide_s"), "recovery.json cold.decide_s"),
        ("host_probe_s", 1.0, "not measured: the host monitor's probe period (assumption)"),
    ]
    return values, _pace(whole_recovery), whole_recovery.get("load_1m_before")

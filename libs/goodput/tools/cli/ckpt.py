"""`goodput ckpt ls|verify|restore|gc|export`: the checkpoint tiers as the replicators index
them, and a checkpoint as a DCP checkpoint (`ckpt_export`, no bus)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.js.api import DeliverPolicy
from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.routing import decode_event_on
from goodput.checkpoint.format import ManifestError, node_dir, step_dir_name
from goodput.checkpoint.format.job_key import (
    KEY_FILE_ENV,
    JobKeyError,
    adopt_stack_key,
    configured_key,
    key_file_from_env,
)
from goodput.checkpoint.index.gc import collect_garbage, volumes_clean_through
from goodput.checkpoint.index.index import (
    DEFAULT_NODE_TTL_S,
    CheckpointIndex,
    IndexSnapshot,
    StepView,
)
from goodput.checkpoint.index.records import CopyRecord
from goodput.checkpoint.index.retention import DEFAULT_KEEP, DEFAULT_REQUIRE, Retention, plan_gc
from goodput.checkpoint.tiers.backup import DEFAULT_PREFIX, blob_key, read_listing
from goodput.checkpoint.tiers.object_store import ObjectNotFound, ObjectStore
from goodput.checkpoint.tiers.open_store import open_object_store
from goodput.checkpoint.tiers.peer import PeerClient, PeerError
from goodput.checkpoint.tiers.store_uri import StoreUri, StoreUriError, parse_store_uri
from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    bus_settings_from_args,
    job_name,
    node_name,
)
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, STORAGE_TIERS, TIERS, StorageTier
from goodput.state_dir import StateDir
from goodput.subjects import DEFAULT_JOB
from goodput.tools.cli.ckpt_export import register_export
from goodput.tools.stack.launcher import resolve_url


async def _connect(args: argparse.Namespace) -> Bus:
    url, _ = resolve_url(args, Path(args.state_dir).resolve())
    if not url:
        raise SystemExit(
            f"no bus: pass --nats-url, or start a stack with `goodput up --state-dir {args.state_dir}`"
        )
    settings = msgspec.structs.replace(bus_settings_from_args(args), url=url)
    return await Bus.connect(settings, name="goodput-ckpt", initial_timeout_s=10)


def _copy_json(copy: CopyRecord) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "tier": copy.tier,
        "holder": copy.holder,
        "owner": copy.owner,
        "root": copy.root,
        "bytes": copy.total_bytes,
    }
    if copy.is_part:
        entry |= {"part": copy.part, "parts": copy.parts, "commit": copy.commit}
    return entry


def _view_json(view: StepView, with_files: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "step": view.step,
        "complete": view.complete,
        "bytes": view.bytes,
        "complete_in": [t for t in STORAGE_TIERS if view.complete_in(t)],
        "parts": view.part_count,
        "copies": [_copy_json(c) for c in view.copies],
    }
    owners = view.complete_owners()
    if with_files and owners:
        entry["files"] = [
            {
                "name": loc.file.name,
                "size": loc.file.size,
                "xxh3_128": loc.file.xxh3_128,
                "locations": [f"{c.tier}:{c.holder}/{c.root}" for c in loc.copies],
            }
            for loc in view.owners[owners[0]]
        ]
    return entry


def _where(view: StepView, tier: StorageTier) -> str:
    """Who holds the step on ``tier``: nodes (local), holder←owner (peer), owners (store)."""
    copies = [c for c in view.copies if c.tier == tier]
    labels = {
        LOCAL: lambda c: c.holder,
        PEER: lambda c: f"{c.holder}←{c.owner}",
        OBJECT_STORE: lambda c: c.owner,
    }[tier]
    return ", ".join(sorted({labels(c) + _part_label(c) for c in copies}))


def _part_label(copy: CopyRecord) -> str:
    return f" #{copy.part}/{copy.parts}" if copy.is_part else ""


async def _ls(args: argparse.Namespace, bus: Bus) -> int:
    snapshot = await CheckpointIndex(bus, args.job).snapshot(args.node_ttl)
    newest = snapshot.newest_complete()
    views = snapshot.views()
    if args.json:
        print(
            json.dumps(
                {
                    "job": args.job,
                    "newest_complete": newest.step if newest else None,
                    "nodes": [
                        {**msgspec.to_builtins(n), "alive": snapshot.alive(n.node)}
                        for n in snapshot.nodes.values()
                    ],
                    "steps": [
                        _view_json(v, newest is not None and v.step == newest.step) for v in views
                    ],
                },
                indent=2,
            )
        )
        return 0
    table = Table(
        title=f"checkpoints of job {args.job} (newest complete: {newest.step if newest else '-'})"
    )
    for column in ("step", "complete", "MB", "local", "peer (holder←owner)", "object store"):
        table.add_column(column)
    for view in views:
        table.add_row(
            str(view.step),
            "[green]yes[/]" if view.complete else "[red]no[/]",
            f"{view.bytes / 1e6:.1f}",
            *(_where(view, tier) for tier in STORAGE_TIERS),
        )
    Console().print(table)
    return 0


def announced_store(snapshot: IndexSnapshot) -> StoreUri | None:
    """The store the live nodes announce, None if none does. Records come from the bus and
    may be forged, so one is followed only when every live node names it (a forger would
    otherwise steer `gc` to delete in, or `verify` to read from, a store of its choosing)."""
    uris = set()
    for node in snapshot.live_nodes():
        try:
            uris.add(node.store())
        except StoreUriError as exc:
            raise StoreUriError(f"node {node.node} announces an unusable store: {exc}") from None
    uris.discard(None)
    if len(uris) > 1:
        named = ", ".join(sorted(str(u) for u in uris))
        raise StoreUriError(f"the live nodes announce different object stores ({named})")
    return uris.pop() if uris else None


def _store_for(snapshot: IndexSnapshot, named: str) -> ObjectStore | None:
    """The store named on the command line, else the one the live nodes agree on."""
    try:
        uri = parse_store_uri(named) if named else announced_store(snapshot)
        return open_object_store(uri, retry_s=10) if uri else None
    except StoreUriError as exc:
        raise SystemExit(f"goodput ckpt: {exc}: name one with --object-store") from None


async def _verify_copy(
    copy: CopyRecord, snapshot: IndexSnapshot, store: ObjectStore | None, deep: bool
) -> list[str]:
    """Problems with one copy; the holder's peer server hashes its own files."""
    directory = f"{copy.root}/{step_dir_name(copy.step)}"
    if not TIERS[copy.tier].on_node:  # the object store's listing
        if store is None:
            return ["no object store known"]
        return await asyncio.to_thread(_verify_in_store, store, copy, deep)
    if not snapshot.alive(copy.holder):
        return [f"holder {copy.holder} is not alive"]
    holder = snapshot.nodes[copy.holder]
    problems = []
    try:
        async with await PeerClient.connect(holder.host, holder.port, timeout_s=5) as client:
            try:  # its seal, and with the job's key its MAC: a forged manifest is refused
                await client.fetch_manifest(directory)
            except (ManifestError, PeerError) as exc:
                problems.append(f"manifest: {exc}")
            for f in copy.files:
                stat = await client.stat(f"{directory}/{f.name}")
                if not stat.exists:
                    problems.append(f"{f.name}: missing")
                elif (stat.size, stat.xxh3_128) != (f.size, f.xxh3_128):
                    problems.append(f"{f.name}: xxh3_128 {stat.xxh3_128}, indexed {f.xxh3_128}")
    except OSError as exc:
        problems.append(f"holder {copy.holder} unreachable: {exc}")
    return problems


def _verify_in_store(store: ObjectStore, copy: CopyRecord, deep: bool) -> list[str]:
    problems = []
    try:
        read_listing(store, copy.root, copy.step)
    except ObjectNotFound as exc:  # a listing the index names but the store lacks
        problems.append(f"manifest: no listing {exc} in the store")
    except (OSError, ValueError) as exc:  # ManifestError included
        problems.append(f"manifest: {exc}")
    with tempfile.TemporaryDirectory(prefix="goodput-verify-") as scratch:
        for f in copy.files:
            key = blob_key(f.xxh3_128, DEFAULT_PREFIX)
            try:
                info = store.stat(key)
                if info is None or info.size != f.size:
                    problems.append(f"{f.name}: blob {key} missing or of the wrong size")
                elif deep:
                    store.get_file(key, Path(scratch) / "blob", f.xxh3_128)
            except (OSError, ValueError) as exc:
                problems.append(f"{f.name}: {type(exc).__name__}: {exc}")
    return problems


async def _verify(args: argparse.Namespace, bus: Bus) -> int:
    snapshot = await CheckpointIndex(bus, args.job).snapshot(args.node_ttl)
    if args.step is not None:
        steps = [args.step]
    elif args.all:
        steps = snapshot.steps()
    else:
        newest = snapshot.newest_complete()
        steps = [newest.step] if newest else []
    store = _store_for(snapshot, args.object_store)
    results = []
    for step in steps:
        for copy in snapshot.view(step).copies:
            problems = await _verify_copy(copy, snapshot, store, args.deep)
            results.append(
                {**_copy_json(copy), "step": step, "ok": not problems, "problems": problems}
            )
    authenticated = key_file_from_env() is not None
    if args.json:
        report = {"job": args.job, "authenticated": authenticated, "steps": steps}
        print(json.dumps({**report, "copies": results}, indent=2))
    elif not results:
        print("no checkpoint copies to verify", file=sys.stderr)
    else:
        for r in results:
            mark = "ok " if r["ok"] else "BAD"
            print(
                f"{mark} step {r['step']} {r['tier']}:{r['holder']} (of {r['owner']}) {'; '.join(r['problems'])}"
            )
    if not authenticated:
        print(
            f"unauthenticated: no checkpoint key ({KEY_FILE_ENV}, or {StateDir(Path()).ckpt_key.name} in the state"
            " directory): manifests were checked for damage, not for forgery",
            file=sys.stderr,
        )
    return 0 if results and all(r["ok"] for r in results) else 1


def _part_spec(text: str) -> tuple[int, int]:
    """``K/N`` (part K of N, 0 <= K < N) for ``--part``."""
    part, _, parts = text.partition("/")
    try:
        spec = int(part), int(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected K/N, e.g. 1/3") from None
    if not 0 <= spec[0] < spec[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: part K of N needs 0 <= K < N")
    return spec


async def _restore(args: argparse.Namespace, bus: Bus) -> int:
    part, parts = args.part or (None, None)
    command = schemas.RestoreToNode(
        job=args.job,
        node=args.node,
        step=args.step,
        part=part,
        parts=parts,
        reason="goodput ckpt restore",
    )
    subscription = await bus.js.subscribe(
        subjects.event(args.job, schemas.kind_of(schemas.ActionResult)),
        stream=subjects.EVENTS_STREAM,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
    )
    try:
        await bus.send_command(subjects.command_target(command), command)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                msg = await subscription.next_msg(timeout=max(deadline - time.monotonic(), 0.1))
            except TimeoutError:
                break
            try:
                result = decode_event_on(msg.subject, msg.data)
            except schemas.SchemaError:
                continue  # not an answer: forged, or another build's
            if isinstance(result, schemas.ActionResult) and result.command_id == command.command_id:
                if args.json:
                    print(json.dumps(msgspec.to_builtins(result), indent=2))
                else:
                    print(("restored: " if result.ok else "restore failed: ") + result.detail)
                return 0 if result.ok else 1
    finally:
        await subscription.unsubscribe()
    print(
        f"no answer from the replicator of {args.node} within {args.timeout:.0f} s", file=sys.stderr
    )
    return 1


def _keep_option(tier: StorageTier) -> str:
    """The ``gc`` option (its argparse name) that sets how many checkpoints ``tier`` keeps."""
    return f"keep_{tier}"


async def _gc(args: argparse.Namespace, bus: Bus) -> int:
    index = CheckpointIndex(bus, args.job)
    snapshot = await index.snapshot(args.node_ttl)
    retention = Retention(
        keep={tier: getattr(args, _keep_option(tier)) for tier in STORAGE_TIERS},
        require=tuple(args.require),
    )
    state_dir = Path(args.state_dir).resolve()
    disks = {n for n in snapshot.nodes if node_dir(state_dir, n).is_dir()}
    if args.dry_run:
        report_copies = plan_gc(
            snapshot, retention, volumes_clean_through(state_dir, snapshot, disks)
        )
        blobs = 0
    else:
        report = await collect_garbage(
            index,
            snapshot,
            retention,
            state_dir=state_dir,
            disks_of=disks,
            store=_store_for(snapshot, args.object_store),
        )
        report_copies, blobs = report.deleted, report.blobs_deleted
    if args.json:
        print(
            json.dumps(
                {
                    "dry_run": args.dry_run,
                    "deleted": [{**_copy_json(c), "step": c.step} for c in report_copies],
                    "blobs_deleted": blobs,
                },
                indent=2,
            )
        )
    else:
        verb = "would delete" if args.dry_run else "deleted"
        for c in report_copies:
            print(f"{verb} step {c.step} {c.tier}:{c.holder} (of {c.owner})")
        print(f"{verb} {len(report_copies)} copies, {blobs} blob(s)")
    return 0


ACTIONS = {"ls": _ls, "verify": _verify, "restore": _restore, "gc": _gc}


def cmd_ckpt(args: argparse.Namespace) -> int:
    adopt_stack_key(args.state_dir)  # the stack's own key, unless one is configured
    try:
        configured_key()
    except JobKeyError as exc:
        raise SystemExit(f"goodput ckpt: {exc}") from None

    async def run() -> int:
        bus = await _connect(args)
        try:
            return await ACTIONS[args.action](args, bus)
        finally:
            await bus.close()

    return asyncio.run(run())


def _common(parser: argparse.ArgumentParser) -> None:
    add_state_dir_argument(parser, "stack state directory")
    parser.add_argument("--job", type=job_name, default=DEFAULT_JOB, help="job name")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--node-ttl",
        type=float,
        default=DEFAULT_NODE_TTL_S,
        help="a node whose address record is older than this many seconds holds nothing (the"
        " replicators' node_ttl_s; they refresh an unchanged record every third of it, and a"
        " stopped or failed node's is withdrawn at once; default %(default)g)",
    )
    add_bus_arguments(parser)
    parser.set_defaults(func=cmd_ckpt)


def _store_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--object-store",
        default="",
        metavar="URI",
        help="the store's URI: file:///<path>, gs://<bucket>[/<prefix>][?endpoint=<url>] or"
        " s3://<bucket>[/<prefix>][?endpoint=<url>][&region=<r>] (default: the one every live"
        " replicator announces)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ckpt",
        help="inspect, verify, restore, garbage-collect and export checkpoints across tiers",
        description=(
            "The checkpoint tiers as the replicators index them: each node's local volume, the "
            "copies peers keep, and the object store. A step is complete when every file of a "
            "node's checkpoint is held, verified, by a live copy somewhere."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="list steps, where their copies are, which are complete")
    _common(ls)

    verify = actions.add_parser(
        "verify", help="re-check copies' checksums (the holders hash their own files)"
    )
    verify.add_argument("--step", type=int, help="this step (default: the newest complete one)")
    verify.add_argument("--all", action="store_true", help="every indexed step")
    verify.add_argument(
        "--deep", action="store_true", help="download object-store blobs and hash them"
    )
    _store_args(verify)
    _common(verify)

    restore = actions.add_parser(
        "restore", help="fill a node's local volume from the nearest tier (via its replicator)"
    )
    restore.add_argument(
        "--node", type=node_name, required=True, help="the node whose volume to fill"
    )
    restore.add_argument("--step", type=int, help="this step (default: the newest complete one)")
    restore.add_argument(
        "--part",
        type=_part_spec,
        help="K/N: a checkpoint sharded across nodes: the node holds part K of N nodes"
        " (N other than the checkpoint's part count also stages the parts its new ranks read,"
        " for a reshard)",
    )
    restore.add_argument("--timeout", type=float, default=300.0, help="seconds to wait")
    _common(restore)

    gc = actions.add_parser("gc", help="delete old checkpoints the retention policy allows")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    for tier in STORAGE_TIERS:  # --keep-local, --keep-peer, --keep-object-store
        gc.add_argument(
            f"--{_keep_option(tier).replace('_', '-')}",
            type=int,
            default=DEFAULT_KEEP[tier],
            help=f"complete checkpoints the {TIERS[tier].title} tier keeps (below 1: every one)",
        )
    gc.add_argument(
        "--require",
        nargs="*",
        default=list(DEFAULT_REQUIRE),
        choices=STORAGE_TIERS,
        help="tiers a newer step must be complete in before older ones go",
    )
    _store_args(gc)
    _common(gc)

    register_export(actions)

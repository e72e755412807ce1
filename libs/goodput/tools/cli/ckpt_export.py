"""`goodput ckpt export --dcp DIR PATH…`: a goodput checkpoint as a DCP checkpoint, no bus needed."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from goodput.checkpoint.format import ManifestError
from goodput.checkpoint.format.job_key import (
    KEY_FILE_ENV,
    JobKeyError,
    adopt_stack_key,
    configured_key,
)
from goodput.config import add_state_dir_argument

if TYPE_CHECKING:
    from goodput.checkpoint.export.dcp import ExportReport
    from goodput.checkpoint.export.sources import Checkpoint

DESCRIPTION = """\
Write a goodput checkpoint as a torch.distributed.checkpoint (DCP) checkpoint, readable by
torch.distributed.checkpoint.load into any mesh (FSDP2, HSDP, a single process) and by
torch.distributed.checkpoint.format_utils.dcp_to_torch_save.

PATH is a step directory (step-N, holding manifest.json) or a volume holding step-N
directories; for a checkpoint sharded across nodes, give the directory of every part of one
commit (one per node, from their volumes), or a volume where the other parts are staged
beside its own. Without --step the newest step that is complete among the paths is taken.

Keys are those dcp.save writes for the same state ("model.0.weight",
"optim.state.0.weight.exp_avg"). Every byte is checked against the checkpoint's digests as it
is read; the export is written into a hidden directory beside DIR and renamed to DIR only once
all of it verified, so a failed export leaves nothing. One saved shard is in memory at a time.
With the job's key configured (GOODPUT_CKPT_KEY_FILE, or ckpt.key in --state-dir) a manifest
without its MAC is refused.
"""


def run_export(args: argparse.Namespace) -> int:
    from goodput.checkpoint.export.sources import ExportError, find_checkpoint  # torch-free

    adopt_stack_key(args.state_dir)
    try:
        configured_key()
        checkpoint = find_checkpoint([Path(p) for p in args.paths], args.step)
        report = _with_progress(args, checkpoint)
    except (JobKeyError, ManifestError, ExportError) as exc:
        raise SystemExit(f"goodput ckpt export: {exc}") from None
    if args.json:
        print(json.dumps({**asdict(report), "authenticated": configured_key() is not None}))
    else:
        parts = f", {report.parts} parts of commit {report.commit}" if report.commit else ""
        print(
            f"exported step {report.step} ({report.kind}{parts}): {report.tensors} tensors in"
            f" {report.chunks} chunks, {report.values} plain values, {report.bytes / 1e6:.1f} MB"
            f" verified, to {report.out} in {report.seconds:.1f}s"
        )
    if configured_key() is None:
        print(
            f"unauthenticated: no checkpoint key ({KEY_FILE_ENV}): manifests were checked for"
            " damage, not for forgery",
            file=sys.stderr,
        )
    return 0


def _with_progress(args: argparse.Namespace, checkpoint: Checkpoint) -> ExportReport:
    """The export, with a progress bar on stderr (none with --json or off a terminal)."""
    from goodput.checkpoint.export.dcp import export_dcp  # imports torch: only when exporting

    console = Console(stderr=True)
    if args.json or not console.is_terminal:
        return export_dcp(checkpoint, Path(args.dcp))
    columns = (*Progress.get_default_columns()[:1], BarColumn(), DownloadColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task(f"step {checkpoint.step} → {args.dcp}", total=None)
        return export_dcp(
            checkpoint,
            Path(args.dcp),
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )


def register_export(actions: argparse._SubParsersAction) -> None:
    parser = actions.add_parser(
        "export",
        help="write a checkpoint (sharded across nodes or not) as a DCP checkpoint",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="step directories or volumes (every part of a sharded checkpoint)",
    )
    parser.add_argument(
        "--dcp", required=True, metavar="DIR", help="the DCP checkpoint to write (must not exist)"
    )
    parser.add_argument("--step", type=int, help="this step (default: the newest complete one)")
    add_state_dir_argument(parser, "a stack's state directory (its ckpt.key, if any)")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")
    parser.set_defaults(func=run_export)

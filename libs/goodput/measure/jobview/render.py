"""Rich renderables of a :class:`JobSnapshot` and of the stack's service health.

One function per panel, all from plain data, so the live view, `--once` and tests draw the
same thing.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from goodput.measure.jobview.snapshot import TIER_TITLES, JobSnapshot

_STATE_STYLE = {
    "running": "green",
    "starting": "cyan",
    "restarting": "yellow",
    "finished": "blue",
    "failed": "red",
    "stopped": "magenta",
}
_ROLE_STYLE = {"active": "green", "spare": "cyan", "failed": "red", "unknown": "dim"}


def age(seconds: float | None) -> str:
    """``4.2 s``, ``3 m 05 s``, ``2 h 07 m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def _number(value: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value)


def services_table(report: list[dict], title: str) -> Table:
    """Health of every service replica (``goodput.tools.stack.health``'s rows)."""
    table = Table(title=escape(title), title_justify="left")
    for column in ("service", "healthy", "instance", "pid", "uptime s", "detail"):
        table.add_column(column)
    for entry in report:
        table.add_row(
            escape(entry["name"]),
            "[green]yes[/]" if entry["healthy"] else "[red]no[/]",
            escape(entry.get("instance", "")),
            str(entry.get("pid", "")),
            str(entry.get("uptime_s", "")),
            escape(entry.get("detail", "")),
        )
    return table


def job_panel(snap: JobSnapshot) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    style = _STATE_STYLE.get(snap.state, "white")
    grid.add_row("state", Text(snap.state, style=style) + Text(f"  attempt {snap.attempt}"))
    grid.add_row(
        "world size",
        f"{snap.world_size}"
        + (f" ({snap.procs_per_node} per node)" if snap.procs_per_node else ""),
    )
    step = snap.step
    grid.add_row(
        "step",
        "-"
        if step.step is None
        else f"{step.step}  (last {age(step.last_step_age_s)} ago, loss {_number(step.loss, '{:.4f}')})",
    )
    grid.add_row(
        "step rate",
        f"{_number(step.steps_per_s)} steps/s  ·  {_number(step.step_time_s)} s/step  ·  "
        f"{_number(step.tokens_per_s, '{:,.0f}')} tokens/s",
    )
    if snap.plan is not None:
        plan = snap.plan
        grid.add_row(
            "batch",
            f"{plan.global_batch} per step = {plan.micro_batch} × {plan.accumulation_steps} "
            f"accumulation × {plan.dp_size} data-parallel ranks  ·  lr {plan.lr:.3g}",
        )
        if plan.rescaled_from_dp:
            grid.add_row(
                "rescaled",
                escape(
                    f"from {plan.rescaled_from_dp} to {plan.dp_size} data-parallel ranks at "
                    f"step {plan.step} ({age(plan.age_s)} ago) by "
                    + (", ".join(plan.callbacks) or "no callback")
                ),
            )
    if snap.detail:
        grid.add_row("detail", escape(snap.detail))
    grid.add_row("events", str(snap.events))
    return Panel(grid, title=escape(f"job {snap.job}"), title_align="left")


def nodes_table(snap: JobSnapshot) -> Table:
    table = Table(title="nodes", title_justify="left")
    for column in ("node", "role", "ranks", "pids", "last heard", "host", "faults / detail"):
        table.add_column(column)
    for node in snap.nodes:
        if node.host_healthy is None:
            host = "[dim]no report[/]"
        else:
            host = "[green]healthy[/]" if node.host_healthy else "[red]unhealthy[/]"
            host += "" if node.gpu_available else " [dim](no GPU)[/]"
        table.add_row(
            escape(node.name),
            f"[{_ROLE_STYLE[node.role]}]{node.role}[/]",
            ", ".join(map(str, node.ranks)) or "-",
            ", ".join(map(str, node.pids)) or "-",
            age(node.last_heard_age_s),
            host,
            escape(", ".join(node.host_faults) or node.host_detail),
        )
    return table


def checkpoints_table(snap: JobSnapshot) -> Table:
    table = Table(title="last checkpoint per tier", title_justify="left")
    for column in ("tier", "step", "age", "held by"):
        table.add_column(column)
    by_tier = {view.tier: view for view in snap.checkpoints}
    for tier, title in TIER_TITLES.items():
        view = by_tier.get(tier)
        if view is None:
            table.add_row(title, "-", "-", "")
            continue
        holders = ", ".join(view.holders[:4]) + (" …" if len(view.holders) > 4 else "")
        table.add_row(title, str(view.step), age(view.age_s), escape(holders))
    if snap.last_restore is not None:
        restore = snap.last_restore
        table.add_row(
            "[bold]last restore[/]",
            str(restore.step),
            age(restore.age_s),
            escape(
                f"from {restore.tier} on {restore.node}"
                + (
                    f", {restore.pinned_bytes / 2**20:.0f} MiB pinned"
                    if restore.pinned_bytes
                    else ""
                )
                + (f" (fell back: {', '.join(restore.fallbacks)})" if restore.fallbacks else "")
            ),
        )
    if snap.last_checkpoint_failure:
        table.add_row("[red]last failure[/]", "", "", escape(snap.last_checkpoint_failure))
    return table


def incidents_table(snap: JobSnapshot) -> Table:
    """Recent signals, decisions and action results, newest first."""
    table = Table(title="recent signals · decisions · actions", title_justify="left")
    for column in ("age", "what", "where / rule", "detail"):
        table.add_column(column)
    rows: list[tuple[float, str, str, str]] = []
    for signal in snap.signals:
        where = signal.node or "job"
        if signal.rank is not None:
            where += f" rank {signal.rank}"
        what = f"[yellow]signal[/] {signal.signal} ({signal.severity})"
        rows.append((signal.age_s, what, escape(where), escape(signal.detail)))
    for decision in snap.decisions:
        detail = (
            escape(decision.reason)
            + (f" [red]error: {escape(decision.error)}[/]" if decision.error else "")
            + (f" ({decision.commands} command(s))" if decision.commands else "")
        )
        rows.append(
            (
                decision.age_s,
                f"[magenta]decision[/] {escape(decision.policy)}",
                escape(decision.rule),
                detail,
            )
        )
    for action in snap.actions:
        what = ("[green]done[/] " if action.ok else "[red]failed[/] ") + escape(action.action)
        rows.append((action.age_s, what, f"{action.duration_s:.2f} s", escape(action.detail)))
    for seconds, what, where, detail in sorted(rows, key=lambda row: row[0]):
        table.add_row(age(seconds), what, where, detail)
    if not rows:
        table.add_row("-", "[dim]nothing yet[/]", "", "")
    return table


def goodput_panel(snap: JobSnapshot) -> Panel:
    goodput = snap.goodput
    if goodput is None:
        return Panel(
            Text(snap.goodput_note or "-", style="dim"), title="goodput", title_align="left"
        )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row(
        "goodput",
        f"[bold]{goodput.goodput_pct:.1f} %[/]  ({goodput.productive_s:.0f} s productive of "
        f"{goodput.total_s:.0f} s; ETTR {goodput.ettr:.3f})",
    )
    grid.add_row(
        "interruptions",
        f"{goodput.interruptions}" + (f", MTTR {age(goodput.mttr_s)}" if goodput.mttr_s else ""),
    )
    for title, seconds in goodput.top_badput.items():
        grid.add_row(f"  {title}", f"{seconds:.1f} s")
    grid.add_row("[dim]computed[/]", f"[dim]{age(goodput.computed_age_s)} ago[/]")
    return Panel(grid, title="goodput (running)", title_align="left")


def job_view(snap: JobSnapshot, services: RenderableType | None = None) -> Group:
    """Every panel, top to bottom: services (if any), job, nodes, checkpoints, incidents."""
    top = Table.grid(padding=(0, 2))
    top.add_row(job_panel(snap), goodput_panel(snap))
    parts: list[RenderableType] = [] if services is None else [services]
    parts += [top, nodes_table(snap), checkpoints_table(snap), incidents_table(snap)]
    return Group(*parts)

"""Human-readable rendering of the CLI's results (plain text): a Plan (a verdict table, the actions and the
savings) and an off-hours report (one block per node group)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from rightsizer.domain.plan import Plan

if TYPE_CHECKING:
    from rightsizer.services.offhours_report import OffhoursReport

REASON_WIDTH = 60
WHY_WIDTH = 100


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [
        max([len(h), *(len(line) for r in rows for line in r[i].splitlines() or [""])])
        for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = [c.splitlines() or [""] for c in row]
        for k in range(max(len(c) for c in cells)):
            parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _reasons(reasons: list[str], limit: int) -> str:
    shown = [r if len(r) <= REASON_WIDTH else r[: REASON_WIDTH - 1] + "…" for r in reasons[:limit]]
    if len(reasons) > limit:
        shown.append(f"(+{len(reasons) - limit} more, see --json)")
    return "\n".join(shown)


def render_plan(plan: Plan, *, max_reasons: int = 4) -> str:
    """The plan as text: one row per GPU node (node, node group, type, verdict, reasons one per line,
    USD/h), then each action with its reason wrapped below it, its manifests, and the savings of the
    executable actions (USD per hour and per month)."""
    rows = [
        [
            n.node,
            n.node_group or "-",
            n.instance_type or "-",
            n.verdict,
            _reasons(n.reasons, max_reasons),
            _money(n.hourly_usd),
        ]
        for n in plan.nodes
    ]
    out = [
        f"Plan at {plan.at} (snapshot {plan.taken_at}){'  [dry run]' if plan.dry_run else ''}",
        "",
        _table(rows, ["NODE", "NODE GROUP", "TYPE", "VERDICT", "REASONS", "USD/H"]),
        "",
    ]
    if plan.actions:
        out.append("Actions:")
        for a in plan.actions:
            target = a.node or a.node_group or "-"
            out.append(
                f"  {a.kind:<16} {target}  {a.from_} -> {_short(a.to)}  saves {_money(a.hourly_savings_usd)} USD/h"
            )
            out.extend(
                textwrap.wrap(
                    a.reason, WHY_WIDTH, initial_indent="      why: ", subsequent_indent="           "
                )
            )
            if a.why_safe:
                safe = f"slowdown {a.expected_slowdown_pct:g}%: {a.why_safe}"
                out.extend(
                    textwrap.wrap(
                        safe, WHY_WIDTH, initial_indent="      safe: ", subsequent_indent="           "
                    )
                )
            for manifest in a.manifests:
                out.append("      manifest:")
                out.extend("        " + line for line in manifest.rstrip().splitlines())
    else:
        out.append("No actions.")
    out.extend(_reservations([r.model_dump(mode="json") for r in plan.reservations]))
    if plan.unmapped:
        out.append(f"\n{len(plan.unmapped)} series could not be joined to a node (see --json 'unmapped').")
    if plan.showback is not None and plan.showback.holders:
        out += ["", *render_showback(plan.showback.model_dump(mode="json"))]
    if plan.workloads:
        out += ["", "GPU workloads (scale_to_zero or keep:<reason>; docs/workloads.md):"]
        out += [
            f"  {w.workload.text:<40} {w.decision:<40} {w.gpus:>3} GPU(s) {_money(w.hourly_usd):>8} USD/h"
            for w in plan.workloads
        ]
    out.append(
        f"\nSavings of executable actions: {plan.savings.hourly_usd:,.2f} USD/hour, "
        f"{plan.savings.monthly_usd:,.2f} USD/month"
    )
    return "\n".join(out)


def _reservations(reservations: list[dict[str, Any]]) -> list[str]:
    """Lines for the capacity reservations (``Plan.reservations``): unused USD/h, end, advice."""
    if not reservations:
        return []
    out = ["", "Capacity reservations (kept unless release_reserved_capacity):"]
    for r in reservations:
        ends = f", ends {r['end']}" if r["end"] else ""
        idle = ", ".join(r["idle_nodes"]) or "none"
        out.append(
            f"  {r['reservation_id']} ({r['kind']}, {r['instance_type'] or '?'}{ends}): unused "
            f"{_money(r['unused_usd_per_hour'])} USD/h — idle nodes {idle}, {r['available']} empty slot(s); "
            f"{r['advice']}"
        )
    return out


def render_showback(showback: dict[str, Any]) -> list[str]:
    """Lines of a showback (``domain.showback.Showback`` as JSON, with or without ``holders``): idle
    GPU-hours and USD per team (label ``team_label``) and per namespace over the idle window."""
    hours = showback["window_hours"]
    out = [
        f"Idle GPU holders (showback over the {hours:g} h idle window): {showback['gpu_hours']:,.2f} GPU-h, "
        f"{showback['usd']:,.2f} USD"
    ]
    for title, key in ((f"team (label {showback['team_label']})", "by_team"), ("namespace", "by_namespace")):
        out.append(f"  per {title}:")
        for r in showback[key]:
            unpriced = f", {r['unpriced']} unpriced" if r["unpriced"] else ""
            out.append(
                f"    {r['key']:<24} {r['pods']:>3} pod(s) {r['gpus']:>6.2f} GPUs {r['gpu_hours']:>8.2f} GPU-h "
                f"{r['usd']:>9,.2f} USD  ({r['hourly_usd']:,.2f} USD/h{unpriced})"
            )
    return out


def _short(to: object) -> str:
    if isinstance(to, dict):
        parts = [f"{k}={v}" for k, v in to.items() if v is not None]
        return ", ".join(parts) or "(see why)"
    return str(to)


def render_offhours(report: OffhoursReport) -> str:
    """Human-readable lines of an off-hours report: one block per node group."""
    mode = "DRY RUN (nothing changed)" if report.dry_run else "LIVE"
    lines = [f"off-hours {report.cluster} at {report.at.isoformat()} — {mode}"]
    for g in report.groups:
        until = g.next_transition.isoformat() if g.next_transition else "-"
        lines.append(
            f"{g.node_group} [{g.source}: {g.schedule}] schedule says {g.state} until {until}: {g.outcome}"
        )
        if g.saved is not None:
            s = g.saved.sizes
            lines.append(
                f"  saved   min {s.min} desired {s.desired} max {s.max} ({g.saved.saved_at.isoformat()})"
            )
        if g.current is not None:
            c = g.current
            lines.append(f"  current min {c.min} desired {c.desired} max {c.max}")
        lines.extend(f"  - {action}" for action in g.actions)
        lines.extend(f"  reason: {reason}" for reason in g.reasons)
        lines.extend(f"  node {node}: {', '.join(rs)}" for node, rs in sorted(g.node_reasons.items()))
        lines.extend(
            f"  failed activity {f['code'] or 'unknown'}: {f['message']}" for f in g.failed_activities
        )
        if g.error:
            lines.append(f"  error: {g.error}")
    lines.extend(f"error: {e}" for e in report.errors)
    lines.extend(f"ALARM RestoreOverdue: {name}" for name in report.alarms)
    return "\n".join(lines)


def render_window(w: dict[str, Any]) -> str:
    """The recommended window recorded by a backtest on the cluster's own history, as one line."""
    warm = " with a warm pool" if w.get("warm_pool") else ""
    net = w.get("net_usd")
    return (
        f"Recommended {w['parameter']} from this cluster's history: {w['value']}{warm} (net USD "
        f"{net if net is None else f'{net:,.2f}'} at USD {w.get('unserved_gpu_minute_usd')}/unserved GPU-min; "
        f"backtest of {w.get('from')} .. {w.get('to')}, recorded {w.get('at')})"
    )


def render_status(report: dict[str, Any]) -> str:
    """``rightsizer status`` as text, from :meth:`rightsizer.services.status.StatusReport.to_json`: the
    latest decision records (one row per GPU node), drains in flight, off-hours saved sizes, realized
    savings and the last failures."""
    out = [f"Cluster {report['cluster']} — status at {report['at']}", ""]
    plan = report["plan"]
    if plan is None:
        out.append(
            "Latest assessment: none recorded yet (the assess function has not run, or has no state table)"
        )
    else:
        mode = "dry run" if plan["dry_run"] else "live"
        out.append(f"Latest assessment: {plan['at']} ({mode})")
        rows = [
            [
                r["node"],
                r["node_group"] or "-",
                r["verdict"],
                _reasons(r["reasons"], 3),
                r["action"] if r["action"] != "none" else "none: " + textwrap.shorten(r["why_not"] or "", 60),
                _money(r["hourly_usd"]),
            ]
            for r in plan["records"]
        ]
        out.append(_table(rows, ["NODE", "GROUP", "VERDICT", "REASONS", "ACTION", "USD/H"]))
        showback = (plan.get("summary") or {}).get("showback")
        if showback and showback["by_namespace"]:
            out += ["", *render_showback(showback)]
    out += ["", "Drains in flight:"]
    if not report["in_flight"]:
        out.append("  none")
    for d in report["in_flight"]:
        out.append(
            f"  {d['node']} ({d['node_group']}): step {d['step']}, {d['status']}, since {d['since']}, "
            f"deadline {d['deadline']} — {d['execution_id']}"
        )
    out += ["", "Off-hours node groups with saved sizes:"]
    if not report["offhours"]:
        out.append("  none")
    for g in report["offhours"]:
        s = g["saved"]
        restoring = f", restore started {g['restore_started_at']}" if g["restore_started_at"] else ""
        out.append(
            f"  {g['node_group']}: min {s['min']} / desired {s['desired']} / max {s['max']} "
            f"saved {g['saved_at']}{restoring}"
        )
    out.extend(_reservations(report.get("reservations") or []))
    savings = report["savings"]
    out += ["", "Realized savings (ledger):"]
    for r in savings["by_day_and_node_group"]:
        out.append(
            f"  {r['day']}  {r['node_group']:<24} {r.get('kind', 'scale_in'):<18} {r['instance_hours']:>8.2f} "
            f"instance-hours  {r['usd']:>9,.2f} USD  ({r['removals']} action(s))"
        )
    for k in savings["by_action_kind"]:
        out.append(f"  {k['kind']}: {k['applied']} applied, {k['hourly_usd']:,.2f} USD/hour")
    out.append(f"  total: {savings['total_usd']:,.2f} USD")
    out += ["", "Measured restore delays (desired-size change -> p50 / p95 s):"]
    if not report.get("restore_delays"):
        out.append("  none measured yet")
    for d in report.get("restore_delays") or []:
        steps = ", ".join(
            f"{m.replace('_', ' ')} {d['p50_seconds'][m]:.0f} / {d['p95_seconds'][m]:.0f}"
            for m in ("instance_running", "node_ready", "gpu_allocatable", "first_gpu_pod_ready")
            if m in d["p50_seconds"]
        )
        out.append(
            f"  {d['node_group']}: serving {d['serving_p50_seconds']:.0f} / {d['serving_p95_seconds']:.0f} "
            f"({d['measured']} node(s), {d['warm']} warm): {steps}"
        )
    window = report.get("recommended_window")
    if window:
        out += ["", render_window(window)]
    out += ["", "Last failures:"]
    if not report["failures"]:
        out.append("  none")
    for f in report["failures"]:
        out.append(
            f"  {f['at']}  {f['node'] or f['node_group']}  {f['kind']}/{f['step']} {f['result']}: {f['reason']}"
        )
    return "\n".join(out)


def render_history(rows: list[dict[str, Any]]) -> str:
    """``rightsizer history`` as a table (oldest first), from :func:`rightsizer.services.status.history_rows`."""
    table = [
        [
            r["at"] or "",
            r["node"] or r["node_group"] or "-",
            r["kind"],
            r["step"],
            r["result"],
            textwrap.shorten(r["reason"] or "", 60),
            _money(r["hourly_savings_usd"]),
            r["execution_id"],
        ]
        for r in rows
    ]
    return _table(table, ["AT", "NODE/GROUP", "KIND", "STEP", "RESULT", "REASON", "USD/H", "EXECUTION"])

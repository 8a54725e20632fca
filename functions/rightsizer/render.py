"""Human-readable rendering of a Plan: a verdict table, the actions and the savings (plain text)."""

from __future__ import annotations

from rightsizer.domain.plan import Plan


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return "\n".join(lines)


def render_plan(plan: Plan, *, max_reasons: int = 4) -> str:
    """The plan as text: one row per GPU node (node, node group, type, verdict, reasons, USD/h),
    then the actions, then the total savings of executable actions.
    """
    rows = []
    for n in plan.nodes:
        reasons = ", ".join(n.reasons[:max_reasons]) + (
            f" (+{len(n.reasons) - max_reasons})" if len(n.reasons) > max_reasons else ""
        )
        rows.append(
            [n.node, n.node_group or "-", n.instance_type or "-", n.verdict, reasons, _money(n.hourly_usd)]
        )
    out = [
        f"Plan at {plan.at} (snapshot {plan.taken_at}){'  [dry run]' if plan.dry_run else ''}",
        "",
        _table(rows, ["NODE", "NODE GROUP", "TYPE", "VERDICT", "REASONS", "USD/H"]),
        "",
    ]
    if plan.actions:
        arows = [
            [
                a.kind,
                a.node or a.node_group or "-",
                f"{a.from_} -> {_short(a.to)}",
                _money(a.hourly_savings_usd),
                a.reason,
            ]
            for a in plan.actions
        ]
        out.append(_table(arows, ["ACTION", "TARGET", "CHANGE", "USD/H SAVED", "WHY"]))
        manifests = [(a, m) for a in plan.actions for m in a.manifests]
        for a, m in manifests:
            out.append(f"\n# manifest for {a.kind} {a.node}:\n{m.rstrip()}")
    else:
        out.append("No actions.")
    if plan.unmapped:
        out.append(f"\n{len(plan.unmapped)} series could not be joined to a node (see --json 'unmapped').")
    out.append(
        f"\nSavings of executable actions: {plan.savings.hourly_usd:,.2f} USD/hour, "
        f"{plan.savings.monthly_usd:,.2f} USD/month"
    )
    return "\n".join(out)


def _short(to: object) -> str:
    if isinstance(to, dict):
        parts = [f"{k}={v}" for k, v in to.items() if v is not None]
        return ", ".join(parts) or "(see reason)"
    return str(to)

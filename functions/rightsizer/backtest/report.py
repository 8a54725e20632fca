"""Use case: price policies on history before turning them on (``rightsizer backtest``).

Runs the pure simulation (``rightsizer.backtest.simulate``) for every requested policy, the two baselines
(request-based, naive threshold) and the oracle on one prepared history, optionally sweeps one policy key,
and renders the result as a table or one JSON document. Reads no files and talks to no server: the CLI
hands it a ``Source`` built by ``rightsizer.backtest.sources``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rightsizer.backtest import simulate as bt
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import ALL_SIGNALS
from rightsizer.domain.policy import Policy, load_policy, parse_duration

__all__ = [
    "SCALE_TO_ZERO",
    "WORKLOAD_SCALE_TO_ZERO",
    "BacktestReport",
    "BacktestRequest",
    "NamedPolicy",
    "Row",
    "Sweep",
    "render_report",
    "report_json",
    "run_backtest",
    "scale_to_zero_policy",
    "workload_scale_to_zero_policy",
]

ACTIVITY_ONLY = "activity-only"
ALL_SIGNALS_BASIS = "all-signals"
SCALE_TO_ZERO = "scale-to-zero"
WORKLOAD_SCALE_TO_ZERO = "workload-scale-to-zero"


def scale_to_zero_policy(base: Policy | None = None) -> Policy:
    """``base`` (default ``Policy()``) for workloads that scale to zero when idle: idle GPU holders may be
    evicted (``evict_idle_gpu_holders: true``) and the per-run budget does not throttle removals
    (``max_nodes_per_run: 1000``)."""
    data = (base or Policy()).model_dump()
    data.update(evict_idle_gpu_holders=True, max_nodes_per_run=1000)
    return Policy.model_validate(data)


def workload_scale_to_zero_policy(base: Policy | None = None) -> Policy:
    """What ``workloads.scale_to_zero`` does to a trace of GPU-holding pods (issue 32): a workload is
    scaled to zero only after its own idle window (``workloads.idle_window``, default 2 h, longer than the
    node's), its node then leaves through the node path — so :func:`scale_to_zero_policy` with the idle
    window raised to the workload's. Savings count from the node's removal (billed accounting); when
    demand returns, the workload is restored and its node provisioned (``provision_delay``), the active
    GPU-minutes until then unserved."""
    s2z = scale_to_zero_policy(base)
    data = s2z.model_dump()
    data["idle_window"] = max(s2z.idle_window, s2z.workloads.idle_window)
    return Policy.model_validate(data)


@dataclass(frozen=True)
class NamedPolicy:
    """A policy and its label in the report (file stem, ``default``, ``scale-to-zero``…)."""

    name: str
    policy: Policy


@dataclass(frozen=True)
class Sweep:
    """One policy key and the values to try, e.g. ``idle_window=10m,20m,30m,60m``."""

    key: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Sweep:
        """Parse ``KEY=V1,V2,...``.

        Raises:
            ConfigError: no ``=``, an empty key, or no values (field ``--sweep``).
        """
        key, sep, rest = text.partition("=")
        values = tuple(v.strip() for v in rest.split(",") if v.strip())
        if not sep or not key.strip() or not values:
            raise ConfigError(f"{text!r} is not KEY=V1,V2,... (e.g. idle_window=10m,30m)", field="--sweep")
        return cls(key.strip(), values)

    def variant(self, base: Policy, value: str) -> Policy:
        """``base`` with ``key`` set to ``value`` (validated like a policy file).

        Raises:
            ConfigError: an unknown key or a value the policy rejects.
        """
        data = base.model_dump()
        data[self.key] = value
        if self.key not in Policy.model_fields:
            raise ConfigError(f"unknown policy key {self.key!r}", field="--sweep")
        return load_policy(data, source="--sweep")


@dataclass(frozen=True)
class BacktestRequest:
    """What to run: policies (at least one), the simulation model, an optional sweep of the policy named
    ``sweep_base`` (default: the last policy), and whether to run the two baselines."""

    policies: tuple[NamedPolicy, ...]
    model: bt.SimModel = field(default_factory=bt.SimModel)
    sweep: Sweep | None = None
    sweep_base: str | None = None
    baselines: bool = True
    warm_pool: bt.WarmPoolModel | None = None
    """When set, every sweep point is also run with this warm pool (the frontier's second curve)."""


@dataclass(frozen=True)
class Row:
    """One line of the report: a strategy's ``Figures``, its policy (None for baselines/oracle), the idle
    run ceiling of its idle window (policies only), and the wall time it took (seconds)."""

    figures: bt.Figures
    policy: Policy | None
    ceiling: bt.Ceiling | None
    wall_seconds: float
    sweep_value: str | None = None

    @property
    def share_of_ceiling(self) -> float | None:
        """share_of_oracle ÷ ceiling share (how close the policy came to what its window allows)."""
        if self.ceiling is None or self.figures.share_of_oracle is None or self.ceiling.share <= 0:
            return None
        return self.figures.share_of_oracle / self.ceiling.share


@dataclass
class BacktestReport:
    """Everything ``rightsizer backtest`` prints, and the prepared history for ``--plot``."""

    source: bt.Source
    prepared: bt.Prepared
    rows: list[Row]
    sweep: Sweep | None
    sweep_base: str | None
    sweep_rows: list[Row]
    prepare_seconds: float
    wall_seconds: float
    warm_rows: list[Row] = field(default_factory=list)
    """The sweep points run with the request's warm pool (same order as ``sweep_rows``); empty without."""

    @property
    def basis(self) -> str:
        """``activity-only`` when the source lacks framebuffer, power or liveness signals."""
        return ALL_SIGNALS_BASIS if self.source.history.signal_set >= ALL_SIGNALS else ACTIVITY_ONLY

    @property
    def oracle(self) -> bt.Figures:
        """The oracle's figures (always the last row)."""
        return self.rows[-1].figures


def run_backtest(
    source: bt.Source, request: BacktestRequest, *, clock: Callable[[], float] = time.perf_counter
) -> BacktestReport:
    """Simulate every policy of ``request`` (and the baselines, the oracle, the sweep) on ``source``.

    Args:
        source: the history and its description.
        request: policies, model, sweep.
        clock: a monotonic clock in seconds (wall time per run is reported).

    Returns:
        A ``BacktestReport``: rows = policies in request order, then ``request-based`` and
        ``naive-threshold`` (when requested), then ``oracle``; ``sweep_rows`` one per sweep value.

    Raises:
        ConfigError: no policy, an unknown sweep base, or a sweep value the policy rejects.
    """
    if not request.policies:
        raise ConfigError("at least one policy is needed", field="--policy")
    started = clock()
    prepared = bt.prepare(source.history, request.model)
    prepare_seconds = clock() - started
    done: list[tuple[Policy, bt.Figures, float]] = []
    ceilings: dict[int, bt.Ceiling] = {}

    def ceiling(policy: Policy) -> bt.Ceiling:
        if policy.idle_window not in ceilings:
            ceilings[policy.idle_window] = bt.ceilings(prepared, [policy.idle_window])[0]
        return ceilings[policy.idle_window]

    def run(policy: Policy, name: str) -> tuple[bt.Figures, float]:
        # Identical policies give identical runs (the simulation is deterministic): reuse, don't redo.
        for seen, figures, _ in done:
            if seen == policy:
                return dataclasses.replace(figures, name=name), 0.0
        t0 = clock()
        figures = bt.run_policy(prepared, policy, name)
        spent = clock() - t0
        done.append((policy, figures, spent))
        return figures, spent

    warm_rows: list[Row] = []
    # The same prepared history with a warm pool behind every removal (the model only sets the pool).
    warm = (
        None
        if request.warm_pool is None
        else dataclasses.replace(
            prepared, model=dataclasses.replace(prepared.model, warm_pool=request.warm_pool)
        )
    )

    rows: list[Row] = []
    for named in request.policies:
        figures, spent = run(named.policy, named.name)
        rows.append(Row(figures, named.policy, ceiling(named.policy), spent))
    sweep_rows: list[Row] = []
    base_name = None
    if request.sweep is not None:
        base_name = request.sweep_base or request.policies[-1].name
        base = next((p.policy for p in request.policies if p.name == base_name), None)
        if base is None:
            raise ConfigError(f"no policy named {base_name!r} to sweep", field="--sweep")
        for value in request.sweep.values:
            policy = request.sweep.variant(base, value)
            figures, spent = run(policy, f"{request.sweep.key}={value}")
            sweep_rows.append(Row(figures, policy, ceiling(policy), spent, sweep_value=value))
            if warm is not None:
                t0 = clock()
                figures = bt.run_policy(warm, policy, f"{request.sweep.key}={value} warm")
                warm_rows.append(Row(figures, policy, ceiling(policy), clock() - t0, sweep_value=value))
    if request.baselines:
        # Without any pod in the history the request-based rule would call every node unused: leave it out.
        with_pods = any(f.pods for f in source.history.frames)
        for fn in (bt.run_request_based, bt.run_naive) if with_pods else (bt.run_naive,):
            t0 = clock()
            figures = fn(prepared)
            rows.append(Row(figures, None, None, clock() - t0))
    t0 = clock()
    rows.append(Row(bt.run_oracle(prepared), None, None, clock() - t0))
    return BacktestReport(
        source=source,
        prepared=prepared,
        rows=rows,
        sweep=request.sweep,
        sweep_base=base_name,
        sweep_rows=sweep_rows,
        prepare_seconds=prepare_seconds,
        wall_seconds=clock() - started,
        warm_rows=warm_rows,
    )


def _rfc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _row_json(row: Row, basis: str) -> dict[str, Any]:
    f = row.figures
    out: dict[str, Any] = {
        "name": f.name,
        "kind": f.kind,
        "basis": basis,
        "gpu_hours_paid": f.gpu_hours_paid,
        "idle_gpu_hours": f.idle_gpu_hours,
        "gpu_hours_saved": f.gpu_hours_saved,
        "share_of_oracle": f.share_of_oracle,
        "usd_saved": f.usd_saved,
        "unpriced_gpu_hours_saved": f.unpriced_gpu_hours_saved,
        "removals": f.removals,
        "regrets": f.regrets,
        "unserved_gpu_minutes": f.unserved_gpu_minutes,
        "readds": f.readds,
        "plan_evaluations": f.plan_evaluations,
        "wall_seconds": row.wall_seconds,
    }
    if row.sweep_value is not None:
        out["value"] = row.sweep_value
    if row.policy is not None:
        out["policy"] = row.policy.model_dump(mode="json")
    if row.ceiling is not None:
        out["ceiling"] = {
            "idle_window_seconds": row.ceiling.window,
            "share": row.ceiling.share,
            "reachable": row.ceiling.reachable,
        }
        out["share_of_ceiling"] = row.share_of_ceiling
    return out


def report_json(report: BacktestReport) -> dict[str, Any]:
    """The report as one JSON document (``rightsizer backtest --json``).

    Units: GPU-hours, USD, GPU-minutes, seconds; shares 0..1 (null when the oracle saves nothing). Every
    row carries ``basis`` (``activity-only`` or ``all-signals``).
    """
    h = report.source.history
    p = report.prepared
    m = p.model
    basis = report.basis
    return {
        "source": {
            "kind": report.source.kind,
            "description": report.source.description,
            "inventory": report.source.inventory,
            "signals": sorted(h.signal_set),
            "basis": basis,
            "notes": list(report.source.notes) + p.notes,
            "from": _rfc(h.start),
            "to": _rfc(h.end),
            "hours": (h.end - h.start) / 3600,
            "resolution_seconds": h.resolution,
            "nodes": len(p.tracks),
            "gpus": sum(t.gpus for t in p.tracks.values()),
        },
        "model": {
            "step_seconds": m.step,
            "provision_delay_seconds": m.provision_delay,
            "regret_horizon_seconds": m.regret_horizon,
            "activity_threshold_pct": m.activity_threshold_pct,
            "request_unneeded_seconds": m.request_unneeded,
        },
        "do_nothing": {
            "gpu_hours_paid": p.paid_gpu_hours,
            "idle_gpu_hours": p.oracle_gpu_hours,
            "basis": basis,
        },
        "runs": [_row_json(r, basis) for r in report.rows],
        "sweep": None
        if report.sweep is None
        else {
            "parameter": report.sweep.key,
            "base": report.sweep_base,
            "points": [_row_json(r, basis) for r in report.sweep_rows],
        },
        "prepare_seconds": report.prepare_seconds,
        "wall_seconds": report.wall_seconds,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    ]
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return lines


def _figures_cells(row: Row) -> list[str]:
    f = row.figures
    regrets = (
        f"{f.regrets}"
        if f.kind == "oracle"
        else f"{f.regrets} ({_pct(f.regrets / f.removals if f.removals else None)})"
    )
    return [
        f"{f.gpu_hours_paid:.1f}",
        f"{f.idle_gpu_hours:.1f}",
        f"{f.gpu_hours_saved:.1f}",
        _pct(f.share_of_oracle),
        f"{f.usd_saved:,.2f}",
        str(f.removals),
        regrets,
        f"{f.unserved_gpu_minutes:.0f}",
    ]


def render_report(report: BacktestReport) -> str:
    """The report as text: source and model, one row per strategy, then the sweep frontier with the idle
    run ceiling per window. Figures are labelled with their basis (``activity-only`` for a trace)."""
    h = report.source.history
    p = report.prepared
    m = p.model
    basis = report.basis
    lines = [
        f"Backtest [{basis}] — {report.source.description}",
        f"  {_rfc(h.start)} .. {_rfc(h.end)} ({(h.end - h.start) / 3600:.1f} h), {len(p.tracks)} GPU nodes, "
        f"{sum(t.gpus for t in p.tracks.values())} GPUs, samples every {h.resolution} s, inventory: "
        f"{report.source.inventory}",
        f"  model: decide every {m.step // 60} min, node back {m.provision_delay // 60} min after demand, "
        f"regret if demand returns within {m.regret_horizon // 60} min, active above "
        f"{m.activity_threshold_pct:g}% GPU activity",
        f"  do nothing: {p.paid_gpu_hours:.1f} GPU-h paid, {p.oracle_gpu_hours:.1f} idle",
    ]
    lines += [f"  note: {n}" for n in (*report.source.notes, *p.notes)]
    lines.append("")
    headers = [
        f"run [{basis}]",
        "GPU-h paid",
        "idle GPU-h",
        "GPU-h saved",
        "of oracle",
        "USD saved",
        "removals",
        "regrets",
        "unserved GPU-min",
    ]
    lines += _table(headers, [[r.figures.name, *_figures_cells(r)] for r in report.rows])
    if report.sweep is not None and report.sweep_rows:
        lines += ["", f"Sweep of {report.sweep.key} on {report.sweep_base!r} [{basis}]"]
        sweep_headers = [
            report.sweep.key,
            "GPU-h saved",
            "of oracle",
            "ceiling",
            "of ceiling",
            "USD saved",
            "removals",
            "regrets",
            "unserved GPU-min",
            "wall s",
        ]
        cells = []
        for r in report.sweep_rows:
            c = _figures_cells(r)
            cells.append(
                [
                    r.sweep_value or "",
                    c[2],
                    c[3],
                    _pct(r.ceiling.share if r.ceiling else None),
                    _pct(r.share_of_ceiling),
                    c[4],
                    c[5],
                    c[6],
                    c[7],
                    f"{r.wall_seconds:.1f}",
                ]
            )
        lines += _table(sweep_headers, cells)
        lines.append(
            "  ceiling = share of idle GPU time inside idle runs longer than the idle window; "
            "a policy with window W cannot remove the first W of any run"
        )
    lines.append("")
    lines.append(f"wall time {report.wall_seconds:.1f} s (history indexed in {report.prepare_seconds:.1f} s)")
    return "\n".join(lines)


def parse_seconds(text: str, field: str) -> int:
    """A duration flag (``"5m"``, ``"300"``) in seconds.

    Raises:
        ConfigError: naming ``field`` when the text is not a duration.
    """
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(str(exc), field=field) from exc

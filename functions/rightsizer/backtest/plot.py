"""``rightsizer backtest --plot FILE.png``: activity, removals and cumulative savings over time, and with a
sweep the frontier (billed USD saved vs unserved GPU-minutes per window, cold and with a warm pool, the
oracle as the ceiling) and the regrets per window.

matplotlib is an optional extra (``pip install 'gpu-rightsizer[plot]'``); it is imported only here and only
when a plot is asked for, with the non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rightsizer.backtest.frontier import Frontier, FrontierPoint
from rightsizer.backtest.report import BacktestReport
from rightsizer.domain.errors import ConfigError

#: Line colours per run kind; policies cycle through the tab10 palette.
POLICY_COLOURS = (1, 2, 4, 5, 6, 8, 9)
BASELINE_STYLE: dict[str, tuple[object, str]] = {
    "request-based": ("tab:gray", "--"),
    "naive-threshold": ("tab:red", ":"),
    "oracle": ("black", "-"),
}


def check_plot_target(path: str | Path) -> None:
    """Fail before any replay when ``--plot`` could not be written at its end (a backtest can take
    minutes): matplotlib must be importable and ``path``'s directory must exist.

    Raises:
        ConfigError: matplotlib is not installed, or the directory is missing (field ``--plot``).
    """
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot needs matplotlib: pip install 'gpu-rightsizer[plot]'", field="--plot")
    folder = Path(path).parent
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a directory: create it, or plot elsewhere", field="--plot")


def plot_report(report: BacktestReport, path: str | Path, frontier: Frontier | None = None) -> Path:
    """Draw three panels sharing the time axis (hours from the history's start) and save a PNG.

    1. GPUs present and GPUs above the activity threshold, per decision step (do-nothing run);
    2. nodes removed at each step, per policy and baseline (markers);
    3. cumulative GPU-hours saved per policy, baseline and the oracle.

    With a ``frontier`` (a sweep), two more panels on the right: billed USD saved against unserved
    GPU-minutes per sweep value (cold, and with the warm pool when it was run), the oracle's USD as a
    horizontal ceiling and the best point at the frontier's price circled; and removals / regrets per
    sweep value (bars).

    The title carries the basis (``activity-only`` for a trace). Sweep points are drawn like policies.

    Returns:
        The written path.

    Raises:
        ConfigError: matplotlib is not installed (field ``--plot``), or the file cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'gpu-rightsizer[plot]'", field="--plot"
        ) from exc
    prep = report.prepared
    h = prep.history
    hours = [(t - h.start) / 3600 for t in prep.steps]
    if frontier is None:
        fig, (ax_act, ax_rm, ax_sav) = plt.subplots(
            3, 1, figsize=(12, 9), sharex=True, gridspec_kw={"height_ratios": [2, 1.4, 2]}
        )
    else:
        fig = plt.figure(figsize=(20, 9))
        grid = fig.add_gridspec(3, 2, width_ratios=[3, 2], height_ratios=[2, 1.4, 2])
        ax_act = fig.add_subplot(grid[0, 0])
        ax_rm = fig.add_subplot(grid[1, 0], sharex=ax_act)
        ax_sav = fig.add_subplot(grid[2, 0], sharex=ax_act)
        _frontier_panels(fig.add_subplot(grid[0:2, 1]), fig.add_subplot(grid[2, 1]), frontier)
    ax_act.fill_between(
        hours, prep.present_gpus, step="post", color="tab:blue", alpha=0.15, label="GPUs present"
    )
    ax_act.step(hours, prep.active_gpus, where="post", color="tab:blue", lw=0.9, label="GPUs active")
    ax_act.set_ylabel("GPUs")
    ax_act.legend(loc="upper right", fontsize=8)
    ax_act.set_title(
        f"Backtest [{report.basis}] — {report.source.description}\n"
        f"active = GPU activity > {prep.model.activity_threshold_pct:g}% at the decision step",
        fontsize=10,
    )

    rows = [r for r in report.rows if r.figures.kind != "oracle"]
    names = [r.figures.name for r in report.rows]
    extra = [r for r in report.sweep_rows if r.figures.name not in names]
    palette = plt.get_cmap("tab10")
    styles: dict[str, tuple[object, str]] = {}
    k = 0
    for r in [*rows, *extra, report.rows[-1]]:
        name = r.figures.name
        if name in BASELINE_STYLE:
            styles[name] = BASELINE_STYLE[name]
        else:
            # tab10 without red (3), gray (7) and the blues of the activity panel: baselines own those.
            styles[name] = (palette(POLICY_COLOURS[k % len(POLICY_COLOURS)]), "-")
            k += 1
    for level, r in enumerate([*rows, *extra]):
        f = r.figures
        xs = [x for x, n in zip(hours, f.removed_by_step, strict=True) if n]
        ys = [level for n in f.removed_by_step if n]
        sizes = [8 + 4 * min(n, 20) for n in f.removed_by_step if n]
        ax_rm.scatter(xs, ys, s=sizes, color=styles[f.name][0], marker="|", label=f"{f.name} ({f.removals})")
    ax_rm.set_yticks(range(len(rows) + len(extra)))
    ax_rm.set_yticklabels([r.figures.name for r in [*rows, *extra]], fontsize=8)
    ax_rm.set_ylabel("removals")
    ax_rm.set_ylim(-0.7, len(rows) + len(extra) - 0.3)

    for r in [*rows, *extra, report.rows[-1]]:
        f = r.figures
        colour, dash = styles[f.name]
        share = "" if f.share_of_oracle is None else f" {100 * f.share_of_oracle:.0f}% of oracle"
        ax_sav.plot(hours, f.saved_by_step, color=colour, ls=dash, lw=1.4, label=f"{f.name}:{share}")
    ax_sav.set_ylabel("GPU-hours saved (cumulative)")
    start = datetime.fromtimestamp(h.start, UTC).isoformat().replace("+00:00", "Z")
    ax_sav.set_xlabel(f"hours since {start}")
    ax_sav.legend(loc="upper left", fontsize=8)
    for ax in (ax_act, ax_rm, ax_sav):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise ConfigError(f"cannot write the plot: {exc.strerror}", source=str(out)) from exc
    finally:
        plt.close(fig)
    return out


def _curve(ax: Any, points: tuple[FrontierPoint, ...], colour: str, label: str) -> None:
    xs = [p.unserved_gpu_minutes for p in points]
    ys = [p.usd_saved for p in points]
    ax.plot(xs, ys, marker="o", color=colour, lw=1.4, label=label)
    for p in points:
        ax.annotate(p.value, (p.unserved_gpu_minutes, p.usd_saved), textcoords="offset points",
                    xytext=(4, 4), fontsize=8, color=colour)  # fmt: skip


def _frontier_panels(ax_front: Any, ax_regret: Any, f: Frontier) -> None:
    """The frontier (billed USD saved vs unserved GPU-minutes) and the regrets per sweep value."""
    _curve(ax_front, f.cold, "tab:blue", "cold restore")
    if f.warm:
        _curve(ax_front, f.warm, "tab:orange", "warm pool")
    ax_front.axhline(f.oracle_usd, color="black", lw=1.0, ls="-", label=f"oracle USD {f.oracle_usd:,.0f}")
    if f.best is not None:
        ax_front.scatter([f.best.unserved_gpu_minutes], [f.best.usd_saved], s=220, facecolors="none",
                         edgecolors="tab:red", lw=1.6,
                         label=f"best at USD {f.price:g}/GPU-min: {f.best.value}"
                         + (" warm" if f.best.warm else ""))  # fmt: skip
    ax_front.set_xlabel("unserved GPU-minutes")
    ax_front.set_ylabel("billed USD saved")
    ax_front.set_ylim(bottom=0)
    ax_front.set_title(f"Frontier of {f.key} (billed)", fontsize=10)
    ax_front.legend(loc="lower right", fontsize=8)
    ax_front.grid(alpha=0.3)
    labels = [p.value for p in f.cold]
    xs = list(range(len(labels)))
    ax_regret.bar([x - 0.2 for x in xs], [p.removals for p in f.cold], width=0.4, color="tab:gray",
                  label="removals")  # fmt: skip
    ax_regret.bar([x + 0.2 for x in xs], [p.regrets for p in f.cold], width=0.4, color="tab:red",
                  label="regrets")  # fmt: skip
    ax_regret.set_xticks(xs)
    ax_regret.set_xticklabels(labels, fontsize=8)
    ax_regret.set_xlabel(f.key)
    ax_regret.legend(loc="upper right", fontsize=8)
    ax_regret.grid(alpha=0.3, axis="y")

"""The frontier of the packaged trace (issue 30): billed USD saved vs unserved GPU-minutes per idle window,
cold and with a STOPPED warm pool, at several restore delays.

For each restore delay d (default 1, 2, 5 and 10 minutes: desired-size change → first GPU pod Ready) it
runs the scale-to-zero policy's ``idle_window`` sweep cold (replacement Ready d after demand) and with a
STOPPED warm pool (Ready ``d × WARM_STOPPED_RATIO`` after demand — the one published warm/cold ratio,
80 s / 110 s on non-GPU nodes; pooled instances cost 100 GB of gp3 while their node is out), and prints per
window: billed USD saved, share of the oracle, unserved GPU-minutes, regrets / removals, net value at the
policy's ``unserved_gpu_minute_usd`` (or ``--price``), and the best window. Usage:
``.venv/bin/python benchmarks/backtest_frontier.py [--delays 1m,2m,5m,10m] [--windows 10m,20m,30m,60m,2h]
[--price 0.10] [--plot-dir DIR]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rightsizer.backtest import simulate as bt
from rightsizer.backtest.frontier import frontier, render_frontier
from rightsizer.backtest.report import (
    SCALE_TO_ZERO,
    BacktestRequest,
    NamedPolicy,
    Sweep,
    parse_seconds,
    run_backtest,
    scale_to_zero_policy,
)
from rightsizer.backtest.sources import packaged_trace, read_trace
from rightsizer.domain.warm_pool import WARM_STOPPED_RATIO


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delays", default="1m,2m,5m,10m")
    parser.add_argument("--windows", default="10m,20m,30m,60m,2h")
    parser.add_argument("--price", type=float, default=None, help="USD per unserved GPU-minute")
    parser.add_argument("--plot-dir", type=Path, default=None, help="write frontier-<delay>.png here")
    args = parser.parse_args()
    windows = tuple(w.strip() for w in args.windows.split(",") if w.strip())
    source = read_trace(packaged_trace())
    cpu0 = time.process_time()
    for text in (d.strip() for d in args.delays.split(",") if d.strip()):
        delay = parse_seconds(text, "--delays")
        warm = bt.WarmPoolModel.of("STOPPED", round(delay * WARM_STOPPED_RATIO))
        request = BacktestRequest(
            (NamedPolicy(SCALE_TO_ZERO, scale_to_zero_policy()),),
            model=bt.SimModel(provision_delay=delay),
            sweep=Sweep("idle_window", windows),
            sweep_base=SCALE_TO_ZERO,
            baselines=False,
            warm_pool=warm,
        )
        report = run_backtest(source, request)
        chosen = frontier(report, args.price)
        assert chosen is not None
        print(f"restore delay {text} (warm pool {warm.provision_delay} s):")
        print("\n".join(render_frontier(chosen)[1:]))
        print()
        if args.plot_dir is not None:
            from rightsizer.backtest.plot import plot_report

            args.plot_dir.mkdir(parents=True, exist_ok=True)
            plot_report(report, args.plot_dir / f"frontier-{text}.png", chosen)
    print(f"process CPU {time.process_time() - cpu0:.1f} s")


if __name__ == "__main__":
    main()

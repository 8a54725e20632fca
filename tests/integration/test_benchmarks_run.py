"""Every benchmark docs/performance.md names runs to completion, at its smallest sizes.

The figures are measured by hand (docs/performance.md), so nothing else runs these scripts: one broke
silently when the assessment learned to refuse a read its identity may not make (`validate_scale.py`
measured the whole cluster under the drain's ClusterRole and died on the PVC list). This runs each
documented script with the tiniest arguments its ``--help`` allows and checks it exits 0 and prints its
table; the ones that build a 100-node Prometheus TSDB or a built artifact are left to the hand runs
(listed in ``NOT_RUN`` with the reason, so a new script must be placed in one or the other).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.prometheus_server import find_binaries

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

#: script → (the tiniest arguments, a text its output must carry)
RUN = {
    "plan_scale.py": (["--sizes", "10", "--runs", "1"], "nodes"),
    "placement_scale.py": (["--sizes", "20", "--trials", "2"], "trials"),
    "validate_scale.py": (["--sizes", "4,6", "--runs", "1"], "| node | 6 |"),
    "shard_scale.py": (["--nodes", "20", "--per-shard", "10"], "cost of one run"),
    "k8s_lists_scale.py": (["--sizes", "8", "--gpu-share", "1"], "| live | 8 |"),
    "handlers_webhook.py": (["--requests", "5", "--warmup", "1"], "workflows started"),
    "handlers.py": (["--rounds", "1"], "assess"),
}
#: documented scripts not run here, and why
NOT_RUN = {
    "collect_scale.py": "backfills a Prometheus TSDB of 100+ nodes with promtool (minutes)",
    "assess_memory.py": "reads collect_scale.py's TSDB",
    "recording_rules_probe.py": "reads collect_scale.py's TSDB",
    "drain_scale.py": "waits out real grace periods (≥ 10 s a size)",
    "backtest_trace.py": "replays the whole 22.8 h trace (~1.5 min)",
    "backtest_frontier.py": "replays the whole trace at four delays",
    "fleet_scale.py": "tests/integration/test_fleet_scale.py runs the same state machine at 1,000 clusters",
}


def test_every_documented_benchmark_is_run_here_or_says_why_not() -> None:
    documented = set(re.findall(r"benchmarks/(\w+\.py)", (ROOT / "docs" / "performance.md").read_text()))
    assert documented, "docs/performance.md names no benchmark"
    assert documented <= set(RUN) | set(NOT_RUN), documented - set(RUN) - set(NOT_RUN)
    assert not set(RUN) & set(NOT_RUN)


@pytest.mark.parametrize("script", sorted(RUN))
def test_the_benchmark_runs_at_its_smallest_size(script: str, tmp_path: Path) -> None:
    if script == "validate_scale.py" and find_binaries() is None:
        pytest.skip("prometheus/promtool not installed")
    arguments, expected = RUN[script]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions"), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout, done.stdout[-3000:]

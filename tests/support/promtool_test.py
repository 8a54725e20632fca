"""Run ``promtool test rules`` on one generated unit test: input series, rule files, expectations."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.binaries import require_binary


def promtool_unit_test(
    directory: Path,
    series: Sequence[Mapping[str, str]],
    *,
    rule_files: Mapping[str, str] | None = None,
    samples: Sequence[tuple[str, str, float]] = (),
    alerts: Sequence[tuple[str, str, Sequence[Mapping[str, Any]]]] = (),
    interval: str = "1m",
) -> subprocess.CompletedProcess[str]:
    """Write ``rule_files`` (name -> text; none: an empty group list) and a test over ``series``
    (``{"series": ..., "values": ...}``) into ``directory`` and run promtool on it.

    ``samples``: (expr, eval time, the one label-less value expected); ``alerts``: (eval time, alertname,
    expected alerts as promtool's ``exp_alerts``). The caller asserts on the returned process."""
    promtool = require_binary("promtool")
    files = dict(rule_files or {"empty.rules.yaml": "groups: []\n"})
    for name, text in files.items():
        (directory / name).write_text(text)
    test = {
        "interval": interval,
        "input_series": [dict(s) for s in series],
        "promql_expr_test": [
            {"expr": e, "eval_time": t, "exp_samples": [{"labels": "{}", "value": v}]} for e, t, v in samples
        ],
        "alert_rule_test": [
            {"eval_time": t, "alertname": name, "exp_alerts": [dict(a) for a in expected]}
            for t, name, expected in alerts
        ],
    }
    document = {"rule_files": list(files), "evaluation_interval": interval, "tests": [test]}
    (directory / "unit.test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run(
        [promtool, "test", "rules", "unit.test.yaml"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

"""Cold start of the Lambda handlers (docs/architecture.md §8): import time of each handler module in a fresh interpreter.

Each figure is the median of ``--runs`` fresh ``python`` processes timing ``import <module>`` with
``time.perf_counter`` (interpreter start-up excluded), beside a bare ``import boto3`` — the floor every
Python Lambda that talks to AWS pays. Also reported: whether the import pulled in the Kubernetes client,
boto3 or the X-Ray SDK (the webhook must import no Kubernetes client; heavy modules only where needed).

Run: ``.venv/bin/python benchmarks/handlers.py [--runs 5] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("boto3", "assess.app", "alert_webhook.app", "drain.app", "offhours.app")
PROBE = """
import json, sys, time
sys.path.insert(0, {functions!r})
t = time.perf_counter()
import {module}
elapsed = time.perf_counter() - t
print(json.dumps({{"seconds": elapsed, "kubernetes": "kubernetes" in sys.modules,
                  "boto3": "boto3" in sys.modules, "xray": "aws_xray_sdk" in sys.modules}}))
"""


def measure(module: str, runs: int) -> dict[str, object]:
    """Median import time of ``module`` over ``runs`` fresh interpreters, and what it pulled in."""
    env = {**os.environ, "RIGHTSIZER_TRACING": "false", "PYTHONDONTWRITEBYTECODE": "0"}
    samples = []
    last: dict[str, object] = {}
    for _ in range(runs):
        probe = PROBE.format(functions=str(ROOT / "functions"), module=module)
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env, cwd=ROOT
        ).stdout
        last = json.loads(out.strip().splitlines()[-1])
        samples.append(float(str(last["seconds"])))
    return {
        "module": module,
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "imports_kubernetes": last["kubernetes"],
        "imports_boto3": last["boto3"],
        "imports_xray": last["xray"],
    }


def main(argv: list[str] | None = None) -> int:
    """Print one row per module (or ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # One warm-up so every run reads .pyc files, as a Lambda artifact built by `sam build` does.
    for module in MODULES:
        measure(module, 1)
    rows = [measure(module, args.runs) for module in MODULES]
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "runs": args.runs, "rows": rows}, indent=2))
        return 0
    base = float(str(rows[0]["median_s"]))
    print(f"python {sys.version.split()[0]}, median of {args.runs} fresh interpreters")
    print(f"{'module':<20} {'median ms':>10} {'vs boto3':>9}  kubernetes boto3 xray")
    for row in rows:
        median = float(str(row["median_s"]))
        print(
            f"{row['module']:<20} {median * 1000:>10.1f} {median / base:>8.2f}x  "
            f"{row['imports_kubernetes']!s:<10} {row['imports_boto3']!s:<5} {row['imports_xray']!s}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

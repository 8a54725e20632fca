"""Webhook latency benchmark (docs/architecture.md §8: the webhook answers within one second; it starts work only).

Starts ``rightsizer serve``'s server (:func:`rightsizer.localserve.build_webhook_server`) on 127.0.0.1 with the
real handler (``alert_webhook.app.lambda_handler``: Function URL event, Powertools Parser and Logger,
bearer check, pydantic payload, de-duplication) and sends, over one keep-alive httpx connection, after a
warm-up:

* ``new``       — N notifications, each a new firing alert (the real Alertmanager 0.25 capture with its
  fingerprint changed): parse, idempotency key, one workflow start → 202;
* ``duplicate`` — N redeliveries of one alert → 200;
* ``401``       — N requests with a wrong token.

Backends: ``--backend memory`` (default: in-memory leases and de-duplication, a recording starter — what
the handler itself costs) or ``--backend moto`` (leases and Powertools Idempotency on DynamoDB in a local
moto server: two to three DynamoDB calls over HTTP per alert; moto is slower than DynamoDB, so read this
as an upper bound). The workflow starter is a recording double in both (Step Functions ``StartExecution``
is one more AWS call, typically 20-50 ms). Also prints the handler module's import time beside a bare
``import boto3`` in fresh interpreters (cold start, docs/architecture.md §8).

Usage: ``.venv/bin/python benchmarks/handlers_webhook.py [--requests 1000] [--backend memory|moto]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
AM = ROOT / "tests" / "fixtures" / "alertmanager"
TOKEN = "s3cr3t-webhook-token"


class CountingStarter:
    """A ``WorkflowStarter`` that only counts (the benchmark measures intake, not drains)."""

    def __init__(self) -> None:
        self.started = 0
        self._lock = threading.Lock()

    def start(self, request: Any) -> str:
        with self._lock:
            self.started += 1
        return str(request.execution_id)


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * len(ordered)) - 1)]
    return p50 * 1000, p99 * 1000, ordered[-1] * 1000


def import_time(module: str, runs: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
            ).stdout
        )
        for _ in range(runs)
    ]
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--backend", choices=("memory", "moto"), default="memory")
    args = parser.parse_args()

    # The Powertools logger writes a JSON line per alert; the benchmark measures the webhook, not a tty.
    os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"
    logging.disable(logging.WARNING)
    from alert_webhook import app
    from rightsizer.adapters.memory_state import MemoryState
    from rightsizer.config import Config
    from rightsizer.localserve import build_webhook_server
    from rightsizer.services.webhook import MemoryDuplicateGuard

    app.logger.setLevel("WARNING")
    starter = CountingStarter()
    moto = None
    if args.backend == "moto":
        import boto3

        from rightsizer.testing.dynamodb_table import create_state_table
        from rightsizer.testing.moto_eks import start_moto_server

        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
            os.environ[name] = value
        moto = start_moto_server()
        client = boto3.session.Session(region_name="us-east-1").client(
            "dynamodb", endpoint_url=moto.endpoint_url
        )
        create_state_table(client, "bench")
        config = Config.model_validate(
            {"cluster": {"name": "bench"}, "aws": {"endpoint_url": moto.endpoint_url, "table": "bench"}}
        )
        server = build_webhook_server(config, starter=starter, environ={"RIGHTSIZER_WEBHOOK_TOKEN": TOKEN})
    else:
        config = Config.model_validate({"cluster": {"name": "bench"}})
        server = build_webhook_server(
            config,
            starter=starter,
            state=MemoryState("bench"),
            guard=MemoryDuplicateGuard(),
            environ={"RIGHTSIZER_WEBHOOK_TOKEN": TOKEN},
        )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    template = json.loads((AM / "alertmanager-0.25-webhook-firing.real.json").read_text())
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "Content-Type": "application/json",
        "User-Agent": "Alertmanager/0.25.0",
    }

    def body(i: int) -> bytes:
        template["alerts"][0]["fingerprint"] = f"{i:016x}"
        return json.dumps(template).encode()

    def run(n: int, make: Any, want: int, hdrs: dict[str, str]) -> list[float]:
        samples = []
        for i in range(n):
            content = make(i)
            start = time.perf_counter()
            answer = client_http.post("/alertmanager", content=content, headers=hdrs)
            samples.append(time.perf_counter() - start)
            assert answer.status_code == want, (answer.status_code, answer.text)
        return samples

    try:
        with httpx.Client(base_url=server.url, timeout=30) as client_http:
            run(args.warmup, lambda i: body(10_000_000 + i), 202, headers)
            results = {
                "new (202)": run(args.requests, body, 202, headers),
                "duplicate (200)": run(args.requests, lambda i: body(0), 200, headers),
                "wrong token (401)": run(
                    args.requests, lambda i: body(0), 401, {**headers, "Authorization": "Bearer wrong"}
                ),
            }
    finally:
        server.shutdown()
        server.server_close()
        if moto is not None:
            moto.stop()

    print(
        f"webhook via rightsizer serve on 127.0.0.1, backend={args.backend}, {args.requests} warm requests each"
    )
    print(f"{'case':<20} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, samples in results.items():
        p50, p99, worst = percentiles(samples)
        print(f"{name:<20} {p50:8.2f} {p99:8.2f} {worst:8.2f}")
    print(f"workflows started: {starter.started} (expected {args.requests + args.warmup})")
    print(
        f"import alert_webhook.app: {import_time('alert_webhook.app'):.0f} ms; bare import boto3: {import_time('boto3'):.0f} ms"
    )


if __name__ == "__main__":
    main()

"""The shipped KEDA example wakes a Deployment from zero on a real Prometheus (issue 32).

GIVEN the ScaledObject ``infra/k8s/components/keda-example`` as rendered, a real Prometheus scraping an
ingress controller's request counter every second, and KEDA's prometheus scaler and activation rules
(``tests.support.keda_model``, ported from kedacore/keda)
WHEN the counter is missing, then present but flat, then growing
THEN the wake-up trigger errs while the metric is lost (``ignoreNullValues: "false"``: never read as 0),
the Deployment stays at 0 while nobody asks, and goes 0 → 1 with the first requests.
"""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_keda import scaled_object
from tests.support.keda_model import KedaQueryError, scaler_value, wake_replicas
from tests.support.prometheus_server import PrometheusServer, free_port, require_binaries

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERIES = 'nginx_ingress_controller_requests{exported_namespace="llm-serving",ingress="vllm-llama3-8b",status="200"}'


class Ingress:
    """A scrape target standing in for ingress-nginx's metrics: no counter until ``start``, then a counter
    that ``serve`` grows."""

    def __init__(self) -> None:
        self.total: float | None = None
        self.lock = threading.Lock()

    def text(self) -> str:
        with self.lock:
            if self.total is None:
                return ""
            return f"# TYPE nginx_ingress_controller_requests counter\n{SERIES} {self.total:g}\n"

    def add(self, n: float) -> None:
        with self.lock:
            self.total = (self.total or 0.0) + n


@pytest.fixture
def ingress() -> Iterator[tuple[Ingress, int]]:
    target = Ingress()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = target.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield target, int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def prometheus(ingress: tuple[Ingress, int], tmp_path: Path) -> Iterator[PrometheusServer]:
    binaries = require_binaries()
    _target, port = ingress
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
        f"  - job_name: ingress-nginx\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    listen = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binaries.prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{listen}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    server = PrometheusServer(f"http://127.0.0.1:{listen}", process, tmp_path)
    try:
        until(lambda: _ready(server.url), 60)
        yield server
    finally:
        server.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def until(check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)


def _up(url: str) -> bool:
    result = httpx.get(f"{url}/api/v1/query", params={"query": "up"}, timeout=5).json()["data"]["result"]
    return bool(result) and result[0]["value"][1] == "1"


def test_the_example_wakes_from_zero_on_real_prometheus_and_never_reads_a_lost_metric_as_zero(
    prometheus: PrometheusServer, ingress: tuple[Ingress, int], tmp_path: Path
) -> None:
    obj = scaled_object(tmp_path)
    wake = next(t for t in obj["spec"]["triggers"] if t["name"] == "ingress-requests")["metadata"]
    assert wake["ignoreNullValues"] == "false"
    target, _port = ingress
    url = prometheus.url
    until(lambda: _up(url), 30)

    # the ingress counter is lost (scraped target, no series): the wake-up trigger errs, it is not a 0
    with pytest.raises(KedaQueryError, match="result is empty"):
        scaler_value(url, wake, datetime.now(UTC))
    assert scaler_value(url, dict(wake, ignoreNullValues="true"), datetime.now(UTC)) == 0.0  # the default
    assert wake_replicas(obj, 0, url, datetime.now(UTC)) == 0

    # present but flat: nobody asks, the Deployment stays at zero
    target.add(0)
    until(lambda: _answers(url, wake), 30)
    time.sleep(2.5)
    assert scaler_value(url, wake, datetime.now(UTC)) == 0.0
    assert wake_replicas(obj, 0, url, datetime.now(UTC)) == 0

    # the first requests arrive at the ingress (answered 503 while no replica is ready, still counted)
    for _ in range(4):
        target.add(5)
        time.sleep(1.0)
    until(lambda: scaler_value(url, wake, datetime.now(UTC)) > 0, 30)
    assert wake_replicas(obj, 0, url, datetime.now(UTC)) == 1


def _answers(url: str, wake: dict[str, Any]) -> bool:
    try:
        scaler_value(url, wake, datetime.now(UTC))
    except KedaQueryError:
        return False
    return True

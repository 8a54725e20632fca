"""BUG-50 (tests/fixtures/cases/BUG-50.json): Amazon Managed Service for Prometheus refuses queries by shape.

AMP answers a query that is too big with HTTP 413 (text/plain "response larger than the max"), 422
("the query hit the aggregated data size limit", "queries with long day range (32d to 95d) are currently
only supported for range type queries"), a rejection above the caller's Query Samples Processed error
threshold, or — above the warning threshold — HTTP 200 with a warning. These are deterministic: resent
unchanged they fail again.

GIVEN an AMP-like front on 127.0.0.1 that answers the case's refusals for some DCGM families and forwards
every other query to a real Prometheus holding backfilled DCGM series,
WHEN the live plan (``plan --config``) and ``rightsizer snapshot`` + ``plan --snapshot`` read through it,
THEN each refused query is sent once (no blind retry), only the metrics it feeds are unknown
(``partial_response:<metric>``; the other families still read: the busy GPU's 85 %), the refusal's and the
warning's own text is named in the log, a snapshot records the refusals (their class: an error text can
echo series labels, issue 14) and the warning and decides like the live plan,
AND a backtest never sends a request spanning 32 days or more, and names the refused chunk instead of
filling it with zeros.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import httpx
import pytest

from rightsizer.adapters.prometheus import PrometheusQueryError
from rightsizer.backtest.sources import MAX_QUERY_SPAN_S, fetch_prometheus_history, fetch_range
from rightsizer.domain.errors import ConfigError
from tests.builders import AT, rfc
from tests.integration.test_snapshot_cli import double, prometheus, run, seed_cluster, write_config
from tests.support.http_serve import reply

if TYPE_CHECKING:
    from rightsizer.testing.k8s import KubernetesDouble
    from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration
__all__ = ["double", "prometheus"]  # fixtures shared with test_snapshot_cli

CASE = json.loads((Path(__file__).parents[1] / "fixtures/cases/BUG-50.json").read_text())
SCENARIOS = {s["name"]: s for s in CASE["scenarios"]}
TOO_LARGE = SCENARIOS["response_too_large"]
DATA_SIZE = SCENARIOS["aggregated_data_size_limit"]
LONG_RANGE = SCENARIOS["backtest_instant_query_over_40_days"]
#: Representative text of AMP's QSP answers (the case gives none; tests match on status, not on text).
QSP_WARNING = "query processed 612000000 samples, above max_samples_processed_warning_threshold 500000000"
QSP_ERROR = "query processed 612000000 samples, above max_samples_processed_error_threshold 500000000"


class AmpFront:
    """An AMP-like endpoint: refuses queries of chosen DCGM families as the case says, forwards the rest
    to a real Prometheus (adding the QSP warning where chosen), and counts every query it was sent."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.sent: Counter[str] = Counter()
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                status, headers, answer = front.answer(self.path, form, body)
                reply(self, status, headers, answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, form: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        query = form.get("query", "")
        self.sent[query] += 1
        if "DCGM_FI_DEV_FB_USED" in query:
            return TOO_LARGE["http_status"], TOO_LARGE["headers"], TOO_LARGE["body_text"].encode()
        if "DCGM_FI_DEV_POWER_USAGE" in query:
            return 422, _json, _error("execution", DATA_SIZE["body_error_text"])
        if "DCGM_FI_DEV_FB_FREE" in query:
            return 422, _json, _error("execution", QSP_ERROR)
        forwarded = httpx.post(
            self.upstream + path,
            content=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            timeout=30,
        )
        answer = forwarded.json()
        if "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in query:
            answer["warnings"] = [QSP_WARNING]
        return forwarded.status_code, _json, json.dumps(answer).encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_json = {"Content-Type": "application/json"}


def _error(error_type: str, text: str) -> bytes:
    return json.dumps({"status": "error", "errorType": error_type, "error": text}).encode()


@pytest.fixture
def amp(prometheus: PrometheusServer) -> Iterator[AmpFront]:
    front = AmpFront(prometheus.url)
    yield front
    front.close()


REFUSED = (
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)


def test_bug50_refusals_make_only_their_metrics_unknown_once_each_with_their_text(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    amp: AmpFront,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING")
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    config = write_config(tmp_path, double, moto_server, amp.url, gpu_cluster.cluster)

    # WHEN the live plan reads through the front
    code, out, err = run(["plan", "--config", str(config), "--at", rfc(AT), "--json"], capsys)

    # THEN it decides: every node unknown by exactly the refused families, nothing else lost
    assert code == 0, err
    live = json.loads(out)
    for row in live["nodes"]:
        partial = sorted(r.split(":", 1)[1] for r in row["reasons"] if r.startswith("partial_response:"))
        assert partial == sorted(REFUSED), row
        assert row["verdict"] == "unknown"
    busy = next(r for r in live["nodes"] if r["node"] == "gpu-busy")
    assert busy["gpu_activity_max_pct"] == 85.0  # GPU_UTIL was answered and read
    assert live["actions"] == []
    # AND no refused query was sent twice: a deterministic limit is not retried blindly
    refused = {q: n for q, n in amp.sent.items() if any(m in q for m in REFUSED)}
    assert refused and set(refused.values()) == {1}, refused
    # AND the log names each refusal and the QSP warning in the server's own words
    for text in (TOO_LARGE["body_text"], DATA_SIZE["body_error_text"], QSP_ERROR, QSP_WARNING):
        assert text in caplog.text, text
    caplog.clear()

    # WHEN a snapshot is taken through the same front and planned offline
    snap = tmp_path / "snap"
    code, _, err = run(["snapshot", "--config", str(config), "--out", str(snap), "--at", rfc(AT)], capsys)
    assert code == 0, err
    recorded = json.loads((snap / "metrics/DCGM_FI_DEV_FB_USED.json").read_text())
    assert recorded == {"status": "error", "errorType": "http_413"}  # the class, not the text
    code, out, err = run(["plan", "--snapshot", str(snap), "--at", rfc(AT), "--json"], capsys)

    # THEN it decides exactly as the live plan did, and its log names each refusal's class and the warning
    assert code == 0, err
    assert json.loads(out)["nodes"] == live["nodes"]
    for text in ("status_error: http_413", "status_error: execution", QSP_WARNING):
        assert text in caplog.text, text


# ----------------------------------------------------------------------------------------- backtest


class _Recorder:
    """A ``RangeQuerier``: empty matrices, the spans asked, and refusals/warnings where told."""

    def __init__(self, refuse_chunk: int | None = None, warn: str | None = None) -> None:
        self.spans: list[tuple[float, float]] = []
        self.refuse_chunk = refuse_chunk
        self.warn = warn

    def query_range(self, expr: str, start: Any, end: Any, step: float) -> dict[str, Any]:
        self.spans.append((float(start), float(end)))
        if self.refuse_chunk is not None and len(self.spans) == self.refuse_chunk:
            raise PrometheusQueryError(
                f"/api/v1/query_range: HTTP 422 (execution): {LONG_RANGE['body_error_text']}",
                status_code=LONG_RANGE["http_status"],
                error_type="execution",
            )
        answer: dict[str, Any] = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        if self.warn:
            answer["warnings"] = [self.warn]
        return answer


@pytest.mark.parametrize(("days", "step"), [(40, 60), (40, 300), (95, 900), (31, 300)])
def test_bug50_backtest_requests_never_span_32_days(days: int, step: int) -> None:
    querier = _Recorder()
    start = datetime(2024, 4, 1, tzinfo=UTC)
    with pytest.raises(ConfigError, match="no GPU nodes"):  # an empty server: the requests are what counts
        fetch_prometheus_history(
            querier,
            start=start,
            end=start + timedelta(days=days),
            step=step,
            cluster="c",
            region="us-east-1",
            inventory_step=step,
        )
    assert querier.spans
    assert max(end - begin for begin, end in querier.spans) <= MAX_QUERY_SPAN_S < 32 * 86_400


def test_bug50_backtest_chunks_cover_the_period_without_overlap() -> None:
    querier = _Recorder()
    start = datetime(2024, 4, 1, tzinfo=UTC).timestamp()
    end = start + 40 * 86_400
    fetched = fetch_range(querier, "DCGM_FI_DEV_GPU_UTIL", start, end, 300)
    assert fetched.problem is None
    assert querier.spans[0][0] == start and querier.spans[-1][1] == end
    assert all(b[0] == a[1] + 300 for a, b in zip(querier.spans, querier.spans[1:], strict=False))
    assert len(querier.spans) == 2


def test_bug50_a_refused_chunk_is_named_and_never_filled() -> None:
    start = datetime(2024, 4, 1, tzinfo=UTC).timestamp()
    refused = fetch_range(_Recorder(refuse_chunk=2), "m", start, start + 40 * 86_400, 300)
    assert refused.problem is not None and refused.problem.startswith("chunk 2 of 2 refused:")
    assert LONG_RANGE["body_error_text"] in refused.problem
    warned = fetch_range(_Recorder(warn=QSP_WARNING), "m", start, start + 86_400, 300)
    assert warned.problem == f"chunk 1 of 1: warnings: {QSP_WARNING}"

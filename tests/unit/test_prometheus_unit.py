"""PrometheusClient and collect_live against a scripted HTTP server on 127.0.0.1; SigV4 on the wire; secrets.

The server is a real ``http.server`` (not an httpx mock), so status codes, bodies, delays and the exact
headers that reach the wire are what the tests see.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import gc
import gzip
import hashlib
import json
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import botocore.auth
import httpx
import pytest
from botocore.credentials import Credentials

from rightsizer.adapters.prometheus import (
    PrometheusClient,
    PrometheusQueryError,
    PrometheusUnavailable,
    SigV4Auth,
    answer_problem,
    build_client,
    collect_live,
    plan_queries,
)
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.observation import observation_queries, series_shards
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import ENERGY, FB_FREE, FB_USED, GPU_UTIL, POWER, UP, Window
from tests.builders import AT, STEP, WINDOW, gpu_node, snapshot, verdict_reasons
from tests.support.http_serve import reply, serving
from tests.support.sigv4 import AKID, FROZEN, SECRET, sigv4_by_hand

# ------------------------------------------------------------------------------------- scripted server

Reply = tuple[int, dict[str, str], bytes, float]
"""(status, headers, body, delay in seconds before answering)."""


def ok(result: list[dict[str, Any]], result_type: str = "vector", **extra: Any) -> Reply:
    body = {"status": "success", "data": {"resultType": result_type, "result": result}, **extra}
    return 200, {"Content-Type": "application/json"}, json.dumps(body).encode(), 0.0


def error(status: int, error_type: str, message: str) -> Reply:
    body = {"status": "error", "errorType": error_type, "error": message}
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode(), 0.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}


@dataclass
class Script:
    """Replies by call order (``queue``) or by query expression (``by_query``); default an empty vector."""

    queue: list[Reply] = field(default_factory=list)
    by_query: dict[str, Reply] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reply(self, seen: Seen) -> Reply:
        with self.lock:
            self.seen.append(seen)
            if self.queue:
                return self.queue.pop(0)
        expr = seen.form.get("query", "")
        if expr in self.by_query:
            return self.by_query[expr]
        return ok([], "matrix" if seen.path.endswith("query_range") else "vector")


@pytest.fixture
def prom() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            status, headers, payload, delay = script.reply(seen)
            if delay:
                time.sleep(delay)
            with contextlib.suppress(
                BrokenPipeError, ConnectionResetError
            ):  # the client gave up (timeout test)
                reply(self, status, headers, payload)

        def log_message(self, *_args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, script


@pytest.fixture
def sleeps() -> list[float]:
    return []


def client_for(url: str, sleeps: list[float], **kw: Any) -> PrometheusClient:
    return PrometheusClient(url, sleep=sleeps.append, **kw)


# ---------------------------------------------------------------------------------------- client


def test_query_posts_a_form_with_partial_response_false(
    prom: tuple[str, Script], sleeps: list[float]
) -> None:
    url, script = prom
    with client_for(url, sleeps, stats=True, timeout=12) as client:
        answer = client.query('max by (UUID) (DCGM_FI_DEV_GPU_UTIL{job="a b"})', 1793613600.0)
    assert answer["status"] == "success"
    seen = script.seen[0]
    assert seen.path == "/api/v1/query"
    assert seen.headers["content-type"] == "application/x-www-form-urlencoded"
    assert seen.form == {
        "query": 'max by (UUID) (DCGM_FI_DEV_GPU_UTIL{job="a b"})',
        "time": "1793613600.000",
        "partial_response": "false",
        "timeout": "12s",
        "stats": "all",
    }


def test_503_timeout_body_is_not_retried(prom: tuple[str, Script], sleeps: list[float]) -> None:
    # GIVEN a server that gave up on the query (errorType timeout): the same query would time out again
    url, script = prom
    script.queue = [error(503, "timeout", "query timed out in expression evaluation")] * 4
    with (
        client_for(url, sleeps, retries=3, backoff=0.5, max_backoff=8) as client,
        pytest.raises(PrometheusUnavailable) as err,
    ):
        client.query("up", 0)
    # THEN one attempt, no back-off
    assert err.value.status_code == 503 and err.value.error_type == "timeout"
    assert len(script.seen) == 1
    assert sleeps == []


def test_503_unavailable_is_retried_with_backoff_then_unavailable(
    prom: tuple[str, Script], sleeps: list[float]
) -> None:
    url, script = prom
    script.queue = [error(503, "unavailable", "too many concurrent queries")] * 4
    with (
        client_for(url, sleeps, retries=3, backoff=0.5, max_backoff=8) as client,
        pytest.raises(PrometheusUnavailable) as err,
    ):
        client.query("up", 0)
    assert err.value.status_code == 503
    assert len(script.seen) == 4
    assert sleeps == [0.5, 1.0, 2.0]


def test_422_execution_is_not_retried(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    script.queue = [error(422, "execution", "query processing would load too many samples into memory")]
    with client_for(url, sleeps) as client, pytest.raises(PrometheusQueryError) as err:
        client.query_range("up", 0, 60, 15)
    assert err.value.status_code == 422 and err.value.error_type == "execution"
    assert len(script.seen) == 1 and sleeps == []


def test_429_then_success_honours_retry_after(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    script.queue = [(429, {"Retry-After": "3"}, b"slow down", 0.0), ok([])]
    with client_for(url, sleeps, backoff=0.5) as client:
        assert client.query("up", 0)["status"] == "success"
        assert client.stats.requests == 2
    assert sleeps == [3.0]


def test_stats_counters_are_exact_under_concurrent_queries() -> None:
    """GIVEN one client shared by 8 threads (``collect_live`` runs 4), with the interpreter switching
    threads every microsecond so an unguarded ``+=`` loses updates within a few thousand requests
    WHEN 3,000 queries are answered, each 117 bytes with an engine time of 0.25 s (exact in binary)
    THEN every counter is exact: requests, queries, bytes and the engine seconds summed."""
    body = json.dumps(
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [], "stats": {"timings": {"evalTotalTime": 0.25}}},
        }
    ).encode()
    # The counters, not the wire, are under test: an in-process transport sends 3,000 requests in seconds.
    transport = httpx.MockTransport(lambda _request: httpx.Response(200, content=body))
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with (
            PrometheusClient("http://prometheus.test", transport=transport, stats=True) as client,
            ThreadPoolExecutor(max_workers=8) as pool,
        ):
            list(pool.map(lambda _: client.query("up", 0), range(3000)))
    finally:
        sys.setswitchinterval(previous)
    stats = client.stats
    assert (stats.requests, stats.queries) == (3000, 3000)
    assert stats.response_bytes == 3000 * len(body)
    assert stats.engine_seconds == 750.0 and stats.slowest_engine_seconds == 0.25


def test_each_answer_is_freed_when_dropped_while_the_cyclic_gc_is_paused() -> None:
    """``collect_live`` pauses the cyclic collector while it reduces answers; an answer (bytes, response)
    must still be freed by reference counting as soon as it is dropped — httpx's response ↔ stream
    binding is a cycle that kept all 194 answers of 10,000 GPU nodes (180 MiB) to the collection's end."""
    made: list[weakref.ref[httpx.Response]] = []

    def answer(_request: httpx.Request) -> httpx.Response:
        response = httpx.Response(
            200, content=b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
        )
        made.append(weakref.ref(response))
        return response

    enabled = gc.isenabled()
    gc.disable()
    try:
        with PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(answer)) as client:
            for _ in range(3):
                assert client.query_range_bytes("up", 0, 60, 60).startswith(b'{"status"')
            assert client.query("up", 0)["status"] == "success"
            assert len(made) == 4 and [ref() for ref in made] == [None] * 4
    finally:
        if enabled:
            gc.enable()


def test_read_timeout_is_not_retried(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    script.queue = [(*ok([])[:3], 1.0), (*ok([])[:3], 1.0)]
    with (
        client_for(url, sleeps, timeout=0.2, retries=1) as client,
        pytest.raises(PrometheusUnavailable) as err,
    ):
        client.query("up", 0)
    assert err.value.error_type == "timeout"
    assert len(script.seen) == 1 and sleeps == []


def test_a_budget_bounds_the_call_and_is_sent_as_the_query_timeout(
    prom: tuple[str, Script], sleeps: list[float]
) -> None:
    # GIVEN a server slower than the caller's remaining budget
    url, script = prom
    script.queue = [(*ok([], "matrix")[:3], 2.0)]
    started = time.monotonic()
    with client_for(url, sleeps, timeout=30) as client, pytest.raises(PrometheusUnavailable):
        client.query_range("up", 0, 60, 15, budget=0.5)
    # THEN the call ends at the budget, and the server was told to give up by then too
    assert time.monotonic() - started < 1.5
    assert script.seen[0].form["timeout"].endswith("ms")  # whole milliseconds: Prometheus parses them
    assert int(script.seen[0].form["timeout"].removesuffix("ms")) <= 500


def test_connection_refused_is_unavailable(sleeps: list[float]) -> None:
    with client_for("http://127.0.0.1:9", sleeps, retries=2) as client, pytest.raises(PrometheusUnavailable):
        client.query("up", 0)
    assert sleeps == [0.5, 1.0]


def test_warnings_and_wrong_result_types_are_problems(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    script.queue = [ok([], warnings=["partial response: store gateway unavailable"]), ok([], "scalar")]
    with client_for(url, sleeps) as client:
        warned = client.query("up", 0)
        scalar = client.query("up", 0)
    assert answer_problem(warned, "vector") == "warnings: partial response: store gateway unavailable"
    assert answer_problem(scalar, "vector") == "not_a_vector"
    assert answer_problem({"status": "error"}, "matrix") == "status_error"


def test_query_range_raw_returns_error_answers_verbatim(
    prom: tuple[str, Script], sleeps: list[float]
) -> None:
    url, script = prom
    reply = error(422, "execution", "too many samples")
    script.queue = [reply]
    with client_for(url, sleeps) as client:
        assert client.query_range_raw("up", 0, 60, 15) == reply[2]


def test_bearer_and_basic_auth_reach_the_wire(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    with build_client(url, auth="bearer", secret="t0ken") as client:
        client.query("up", 0)
    with build_client(url, auth="basic", username="grafana", secret="p:w") as client:
        client.query("up", 0)
    assert script.seen[0].headers["authorization"] == "Bearer t0ken"
    assert script.seen[1].headers["authorization"] == "Basic " + base64.b64encode(b"grafana:p:w").decode()
    with pytest.raises(ConfigError):
        build_client(url, auth="sigv4")


@pytest.mark.parametrize(
    ("auth", "compression", "expected"),
    [
        ("none", "auto", "identity"),
        ("bearer", "auto", "identity"),
        ("basic", "auto", "identity"),
        ("sigv4", "auto", "gzip"),
        ("none", "gzip", "gzip"),
        ("sigv4", "identity", "identity"),
    ],
)
def test_answers_are_asked_uncompressed_except_from_amp(
    prom: tuple[str, Script], auth: Any, compression: Any, expected: str
) -> None:
    # GIVEN a client as config prometheus builds it
    url, script = prom
    creds = Credentials(AKID, SECRET)
    with build_client(
        url,
        auth=auth,
        secret="t0ken",
        username="u",
        credentials=creds,
        region="eu-west-1",
        compression=compression,
    ) as client:
        client.query_range_bytes("up", 0, 60, 15)
        client.query("up", 0)
    # THEN the server is asked for that encoding only, on every endpoint (identity: it compresses nothing)
    assert [s.headers["accept-encoding"] for s in script.seen] == [expected, expected]


@pytest.mark.parametrize(
    ("prometheus", "expected"),
    [
        ({}, "identity"),
        ({"compression": "gzip"}, "gzip"),
        ({"auth": "sigv4", "sigv4_region": "eu-west-1"}, "gzip"),
        ({"auth": "sigv4", "sigv4_region": "eu-west-1", "compression": "identity"}, "identity"),
    ],
)
def test_config_prometheus_compression_reaches_the_wire(
    prom: tuple[str, Script], monkeypatch: pytest.MonkeyPatch, prometheus: dict[str, Any], expected: str
) -> None:
    """``prometheus.compression`` as the CLI and the Lambdas build their client (``build_metrics_reader``)."""
    from pydantic import ValidationError

    from rightsizer.config import Config
    from rightsizer.wiring.builders import build_metrics_reader

    url, script = prom
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AKID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    config = Config.model_validate({"cluster": {"name": "c"}, "prometheus": {"url": url, **prometheus}})
    with build_metrics_reader(config) as client:
        client.query_range_bytes("up", 0, 60, 15)
    assert script.seen[0].headers["accept-encoding"] == expected
    with pytest.raises(ValidationError, match="compression"):
        Config.model_validate({"cluster": {"name": "c"}, "prometheus": {"compression": "br"}})


def test_a_gzip_answer_is_decoded(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    status, headers, body, _ = ok([{"metric": {"UUID": "GPU-1"}, "values": [[60, "3"]]}], "matrix")
    script.queue = [(status, {**headers, "Content-Encoding": "gzip"}, gzip.compress(body), 0.0)]
    with client_for(url, sleeps, gzip=True) as client:
        assert client.query_range_bytes("up", 0, 60, 15) == body
    assert script.seen[0].headers["accept-encoding"] == "gzip"


# ------------------------------------------------------------------------------------------ SigV4


def test_sigv4_signs_exactly_what_reaches_the_server(
    prom: tuple[str, Script], sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a long PromQL query and session credentials, sent through the real client
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: FROZEN)
    url, script = prom
    creds = Credentials(AKID, SECRET, token="session-token")
    long_expr = 'max by (node, UUID) (max_over_time(DCGM_FI_DEV_GPU_UTIL{job="gpu-operator/dcgm"}[60s]))' * 40
    with PrometheusClient(url, auth=SigV4Auth(creds, "eu-west-1"), sleep=sleeps.append) as client:
        client.query(long_expr, 1440938160)
    # THEN recomputing the signature from the received method, path, headers and body gives the same value
    seen = script.seen[0]
    auth = seen.headers["authorization"]
    signed_names = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert signed_names == [
        "content-type",
        "host",
        "x-amz-content-sha256",
        "x-amz-date",
        "x-amz-security-token",
    ]
    _, signature = sigv4_by_hand(
        method=seen.method,
        path=urlsplit(seen.path).path,
        query="",
        headers={n: seen.headers[n] for n in signed_names},
        body=seen.body,
        amz_date=seen.headers["x-amz-date"],
        region="eu-west-1",
        service="aps",
    )
    assert auth.endswith(f"Signature={signature}")
    assert seen.headers["x-amz-content-sha256"] == hashlib.sha256(seen.body).hexdigest()
    assert seen.form["query"] == long_expr


# ----------------------------------------------------------------------------------- live path


def test_plan_queries_split_the_window_exactly_and_do_not_depend_on_the_fleet() -> None:
    window = Window(end=1793613600.0, seconds=1800, step=60)
    tasks = plan_queries(window, split_seconds=900)
    assert len(tasks) == 7 + 7 * 2
    assert len(plan_queries(window, job="dcgm", split_seconds=900)) == len(tasks)
    assert len(plan_queries(window, split_seconds=1800)) == 14
    # every step point of (end − W, end] is asked exactly once per per-step query
    util = [t for t in tasks if t.query.path == f"metrics/{GPU_UTIL}.json"]
    points = sorted(p for t in util for p in range(int(t.span(60)[0]), int(t.span(60)[1]) + 1, 60))
    assert points == [int(window.end) - 60 * k for k in range(29, -1, -1)]
    # and the sub-windows of the window-level queries tile the window
    nonfinite = [t for t in tasks if t.query.kind == "nonfinite" and t.query.metric == GPU_UTIL]
    assert sorted((t.end - t.seconds, t.end) for t in nonfinite) == [
        (window.end - 1800, window.end - 900),
        (window.end - 900, window.end),
    ]
    assert nonfinite[0].query.expr(60, 900) == "(sum_over_time(DCGM_FI_DEV_GPU_UTIL[900s]) * 0) != 0"
    assert util[0].query.expr(60, 900) == "max_over_time(DCGM_FI_DEV_GPU_UTIL[60s])"
    # a spread does not merge across sub-windows: it reads the whole window once
    spreads = [t for t in tasks if t.query.kind == "stddev"]
    assert [(t.seconds, t.end) for t in spreads] == [(1800, window.end)] * 2


def test_series_shards_cut_sorted_names_into_exact_match_sets() -> None:
    shards = series_shards("node", ["ip-10-0-1-2.ec2.internal", "b", "a", "b", "c+d"], 2)
    assert [s.nodes for s in shards] == [("a", "b"), ("c+d", "ip-10-0-1-2.ec2.internal")]
    # only RE2 metacharacters escaped (PromQL string escaping doubles the backslash): a set of literals
    assert shards[1].matcher() == 'node=~"c\\\\+d|ip-10-0-1-2\\\\.ec2\\\\.internal"'
    assert series_shards("node", [], 5) == ()
    with pytest.raises(ValueError, match="per_shard"):
        series_shards("node", ["a"], 0)


def test_plan_queries_repeat_every_dcgm_query_per_shard_but_not_up() -> None:
    window = Window(end=1793613600.0, seconds=1800, step=60)
    shards = series_shards("node", [f"n{i}" for i in range(5)], 2)
    tasks = plan_queries(window, split_seconds=900, shards=shards)
    up = [t for t in tasks if t.query.metric == UP]
    # the 2 sub-windows of its per-step maxima and its window count (scrape attempts), unsharded
    assert [(t.query.kind, t.shard) for t in up] == [("step", None), ("step", None), ("count", None)]
    assert up[-1].expr(60) == "count_over_time(up[1800s])"
    assert len(tasks) == 3 + (6 + 6 * 2) * 3
    util = [t for t in tasks if t.query.path == f"metrics/{GPU_UTIL}.json"]
    assert {t.shard for t in util} == set(shards)
    assert util[0].expr(60) == 'max_over_time(DCGM_FI_DEV_GPU_UTIL{node=~"n0|n1"}[60s])'
    with_job = plan_queries(window, job="dcgm", split_seconds=1800, shards=shards[:1])
    assert with_job[0].expr(60) == 'max_over_time(DCGM_FI_DEV_GPU_UTIL{job="dcgm",node=~"n0|n1"}[60s])'


NODE = "gpu-a"
END = AT.timestamp()


def _dev(g: int, **extra: str) -> dict[str, str]:
    return {"node": NODE, "gpu": str(g), "UUID": f"GPU-{g}", "instance": "10.1.0.1:9400", **extra}


def _matrix(rows: list[tuple[dict[str, str], list[tuple[float, str]]]]) -> Reply:
    return ok(
        [{"metric": labels, "values": [[t, v] for t, v in points]} for labels, points in rows], "matrix"
    )


def _steps(value: str, first: int = 0, last: int = 29) -> list[tuple[float, str]]:
    return [(END - STEP * k, value) for k in range(last, first - 1, -1)]


def _query(metric: str, kind: str) -> str:
    q = next(x for x in observation_queries() if x.metric == metric and x.kind == kind)
    return q.expr(STEP, WINDOW)


def idle_answers() -> dict[str, Reply]:
    """What a healthy Prometheus answers for one idle 4-GPU node (one sub-window: the whole window)."""
    devs = [_dev(g) for g in range(4)]
    at_end = [(END, "")]

    def one(value: str, rows: list[dict[str, str]] = devs) -> Reply:
        return _matrix([(d, [(t, value) for t, _ in at_end]) for d in rows])

    return {
        _query(GPU_UTIL, "step"): _matrix([(d, _steps("0")) for d in devs]),
        _query(UP, "step"): _matrix([({"instance": "10.1.0.1:9400"}, _steps("1"))]),
        _query(FB_USED, "max"): one("300"),
        _query(POWER, "max"): one("27.5"),
        _query(POWER, "stddev"): one("0.3"),
        _query(ENERGY, "stddev"): one("1.2e6"),
        _query(FB_USED, "avg"): one("300"),
        _query(FB_FREE, "avg"): one("22700"),
        _query(GPU_UTIL, "timestamp"): one(str(END - 10)),
    }


def run_plan(url: str, sleeps: list[float], answers: dict[str, Reply], **kw: Any) -> Any:
    policy = Policy()
    window = Window.ending(AT, policy.idle_window, STEP)
    base = snapshot([gpu_node(NODE, ip="10.0.0.5")], [])
    with client_for(url, sleeps, retries=1) as client:
        signals = collect_live(
            client,
            NodeJoiner(base.nodes, base.pods),
            window,
            policy,
            max_workers=1,
            split_seconds=WINDOW,
            **kw,
        )
    from dataclasses import replace

    return signals, plan(replace(base, signals=signals), policy)


def test_healthy_answers_make_an_idle_node(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    script.by_query = idle_answers()
    signals, p = run_plan(url, sleeps, script.by_query)
    assert signals.problems == ()
    assert [(n.verdict, verdict_reasons(n.reasons)) for n in p.nodes] == [("idle", ["idle_window_clean"])]
    assert len(script.seen) == 14
    assert {s.path for s in script.seen} == {"/api/v1/query_range"}


@pytest.mark.parametrize(
    ("path", "labels", "points", "reason"),
    [
        (_query(GPU_UTIL, "nonfinite"), _dev(1), [(END, "NaN")], f"non_finite:{GPU_UTIL}"),
        (_query(FB_FREE, "avg"), _dev(2), [(END, "NaN")], f"non_finite:{FB_FREE}"),
        (_query(FB_USED, "avg"), _dev(1), [(END, "-Inf")], f"non_finite:{FB_USED}"),
        (_query(POWER, "stddev"), _dev(3), [(END, "NaN")], f"non_finite:{POWER}"),
        (_query(ENERGY, "stddev"), _dev(3), [(END, "NaN")], f"non_finite:{ENERGY}"),
        (_query(FB_USED, "max"), _dev(2), [(END, "+Inf")], f"non_finite:{FB_USED}"),
        (_query(GPU_UTIL, "step"), _dev(0), _steps("NaN", 7, 7), f"non_finite:{GPU_UTIL}"),
    ],
)
def test_non_finite_values_make_the_node_unknown(
    prom: tuple[str, Script],
    sleeps: list[float],
    path: str,
    labels: dict[str, str],
    points: list[tuple[float, str]],
    reason: str,
) -> None:
    url, script = prom
    answers = idle_answers()
    rows = json.loads(answers[path][2])["data"]["result"] if path in answers else []
    mine = next((r for r in rows if r["metric"] == labels), None)
    if mine is None:
        rows.append({"metric": labels, "values": [[t, v] for t, v in points]})
    else:
        at = {t for t, _ in points}
        mine["values"] = sorted([p for p in mine["values"] if p[0] not in at] + [[t, v] for t, v in points])
    answers[path] = ok(rows, "matrix")
    script.by_query = answers
    _, p = run_plan(url, sleeps, answers)
    assert p.nodes[0].verdict == "unknown"
    assert reason in p.nodes[0].reasons


@pytest.mark.parametrize(
    "reply",
    [
        error(503, "timeout", "query timed out"),
        error(422, "execution", "query processing would load too many samples into memory"),
        ok([], "matrix", warnings=["partial response"]),
        ok([], "vector"),
    ],
)
def test_one_unusable_answer_makes_its_metric_a_problem(
    prom: tuple[str, Script], sleeps: list[float], reply: Reply
) -> None:
    url, script = prom
    answers = idle_answers()
    answers[_query(GPU_UTIL, "nonfinite")] = reply
    script.by_query = answers
    signals, p = run_plan(url, sleeps, answers)
    assert set(signals.problems) == {GPU_UTIL}
    assert p.nodes[0].verdict == "unknown"
    assert f"partial_response:{GPU_UTIL}" in p.nodes[0].reasons
    # a timeout is not asked again
    assert sum(s.form["query"] == _query(GPU_UTIL, "nonfinite") for s in script.seen) == 1


BUG_50 = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "cases" / "BUG-50.json").read_text(encoding="utf-8")
)


def _bug50_replies() -> list[tuple[str, Reply, str]]:
    """The case's rejected shapes as AMP answers them: (scenario, reply, text the log must carry)."""
    rows = {s["name"]: s for s in BUG_50["scenarios"]}
    too_large = rows["response_too_large"]
    long_range = rows["backtest_instant_query_over_40_days"]
    data_size = rows["aggregated_data_size_limit"]
    qsp = rows["qsp_error_threshold"]
    warning = "query processed 612000000 samples, above max_samples_processed_warning_threshold"
    return [
        # text/plain 413 from AMP's front end: no JSON, no errorType
        (too_large["name"], (413, too_large["headers"], too_large["body_text"].encode(), 0.0), "HTTP 413"),
        # 422 whose body the report shows only as text (errorType not recorded)
        (
            long_range["name"],
            (422, {"Content-Type": "text/plain"}, long_range["body_error_text"].encode(), 0.0),
            "long day range",
        ),
        (data_size["name"], error(422, "execution", data_size["body_error_text"]), "aggregated data size"),
        (qsp["name"], error(400, "bad_data", "samples processed above the error threshold"), "400"),
        # a 200 with a QSP warning: still partial (fail closed), but the log names the warning
        ("qsp_warning", ok([], "matrix", warnings=[warning]), "max_samples_processed_warning_threshold"),
    ]


@pytest.mark.parametrize(("scenario", "reply", "named"), _bug50_replies(), ids=lambda v: str(v)[:30])
def test_bug50_amp_query_shape_rejections_are_problems_not_data_and_not_retried(
    prom: tuple[str, Script],
    sleeps: list[float],
    caplog: pytest.LogCaptureFixture,
    scenario: str,
    reply: Reply,
    named: str,
) -> None:
    """BUG-50: AMP refuses a query by its shape (413 response too large, 422 long range or data size,
    a samples-processed threshold) or answers 200 with a samples-processed warning.
    GIVEN a Prometheus answering the per-step activity query so, and every other query healthy
    WHEN the live path collects THEN the answer is not retried unchanged (one request, no sleep), it is
    not data (the metric is a problem, the node ``unknown`` with ``partial_response``), and the log line
    names what the server said so an operator can reshape the query."""
    url, script = prom
    answers = idle_answers()
    answers[_query(GPU_UTIL, "step")] = reply
    script.by_query = answers
    with caplog.at_level("WARNING", logger="rightsizer"):
        signals, p = run_plan(url, sleeps, answers)
    assert set(signals.problems) == {GPU_UTIL}, scenario
    assert p.nodes[0].verdict == "unknown"
    assert f"partial_response:{GPU_UTIL}" in p.nodes[0].reasons
    assert sum(s.form["query"] == _query(GPU_UTIL, "step") for s in script.seen) == 1
    assert sleeps == []
    assert any(named in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_hanging_prometheus_ends_the_cycle_at_its_deadline(
    prom: tuple[str, Script], sleeps: list[float]
) -> None:
    # GIVEN a Prometheus that takes 3 s per answer and a cycle deadline of 1 s
    url, script = prom
    script.by_query = {k: (*v[:3], 3.0) for k, v in idle_answers().items()}
    started = time.monotonic()
    # WHEN the live path collects THEN it stops at the deadline as "Prometheus unavailable"
    with pytest.raises(PrometheusUnavailable, match="Prometheus unavailable"):
        run_plan(url, sleeps, script.by_query, deadline_seconds=1.0)
    assert time.monotonic() - started < 2.5
    assert len(script.seen) == 1  # nothing started after the deadline


def test_a_bad_node_label_is_a_config_error(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, _ = prom
    with client_for(url, sleeps) as client, pytest.raises(ConfigError, match="node_label"):
        collect_live(client, NodeJoiner([], []), Window(END, WINDOW, STEP), Policy(), "bad-label")


def test_workload_label_variants_of_one_device_merge(prom: tuple[str, Script], sleeps: list[float]) -> None:
    url, script = prom
    answers = idle_answers()
    rows = [(_dev(g), _steps("0")) for g in range(1, 4)]
    rows += [
        (_dev(0, namespace="ml", pod="a"), _steps("3", 15, 29)),
        (_dev(0, namespace="ml", pod="b"), _steps("4", 0, 14)),
    ]
    answers[_query(GPU_UTIL, "step")] = _matrix(rows)
    script.by_query = answers
    signals, p = run_plan(url, sleeps, answers)
    devs = {d.device: d for d in signals.devices[NODE]}
    assert len(devs) == 4 and devs["GPU-0"].activity_max_pct == 4.0
    assert devs["GPU-0"].coverage == 1.0
    assert p.nodes[0].verdict == "idle"


@pytest.mark.parametrize(
    ("prometheus", "expected"),
    [
        (
            {"node_label": "node", "shard_nodes": 2},
            ['node=~"gpu-0|gpu-1"', 'node=~"gpu-2|gpu-3"', 'node=~"gpu-4"'],
        ),
        ({"node_label": "node", "shard_nodes": 5}, []),  # the fleet fits one query
        (  # no node label: 3 shards' worth of nodes → 4 shards by the GPU index (label gpu) mod 4
            {"shard_nodes": 2},
            [
                'gpu!~"0|4|8|12|1|5|9|13|2|6|10|14"',
                'gpu=~"0|4|8|12"',
                'gpu=~"1|5|9|13"',
                'gpu=~"2|6|10|14"',
            ],
        ),
        ({"shard_nodes": 5}, []),
    ],
)
def test_the_live_plan_shards_large_fleets_by_node_label_else_by_gpu_index(
    prometheus: dict[str, Any], expected: list[str]
) -> None:
    """``live_signals`` (what ``plan --config`` and the assess Lambda run) shards only GPU nodes, and only
    when the fleet is larger than ``prometheus.shard_nodes``: by ``prometheus.node_label`` when set, else
    by the GPU index (label ``gpu``) every DCGM series carries."""
    from rightsizer.config import Config
    from rightsizer.services.observe import live_signals

    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(parse_qs(request.content.decode())["query"][0])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": []}})

    config = Config.model_validate({"cluster": {"name": "c"}, "prometheus": prometheus})
    cpu = gpu_node("cpu-0", instance_type="m5.large", gpus=0, labels={"nvidia.com/gpu.present": "false"})
    base = snapshot([*(gpu_node(f"gpu-{i}") for i in range(5)), cpu], [])
    with PrometheusClient("http://prometheus", transport=httpx.MockTransport(answer)) as client:
        live_signals(config, Policy(), base, functools.partial(collect_live, client))
    util = sorted(q for q in asked if q.startswith("max_over_time(DCGM_FI_DEV_GPU_UTIL"))
    if not expected:
        assert util == ["max_over_time(DCGM_FI_DEV_GPU_UTIL[60s])"]
    else:
        assert util == [f"max_over_time(DCGM_FI_DEV_GPU_UTIL{{{m}}}[60s])" for m in expected]
    assert [q for q in asked if q.startswith("max_over_time(up")] == ["max_over_time(up[60s])"]

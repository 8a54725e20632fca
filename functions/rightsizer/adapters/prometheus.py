"""Prometheus / Thanos / Amazon Managed Service for Prometheus (AMP): the live DCGM path (docs/architecture.md §3, §8).

Two parts:
- ``PrometheusClient`` — the HTTP API (``/api/v1/query``, ``/api/v1/query_range``) over httpx with
  auth ``none`` | ``bearer`` | ``basic`` | ``sigv4`` (AMP, service ``aps``, botocore's signer:
  ``adapters.prometheus_auth``, re-exported here), TLS with an
  optional CA bundle, connect/read timeouts bounded by a per-call budget, and bounded exponential backoff
  on 429/502/503/504 and connection errors (never on timeouts). Queries are POSTed as form bodies so long
  PromQL fits and SigV4 signs exactly the bytes that are sent.
- ``collect_live`` — per-device signals for every GPU node from the same queries a snapshot records
  (``rightsizer.domain.observation.observation_queries``: every raw sample of the window counted), split
  into sub-windows (and, for large fleets, series shards) like a query frontend, with a number of queries
  that does not grow with the fleet (one in flight while the answers are small, a few at once for a
  large fleet), each answer reduced on arrival to per-device facts by the snapshot
  path's own ``ObservationReducer``, so ``plan`` decides alike on both paths.

Failure policy: an answer that is not ``success``, carries ``warnings`` (Thanos partial responses), has an
unexpected result type, or an HTTP error left after retries makes the metric names that query feeds a
*problem* (``CollectedSignals.problems`` ⇒ ``partial_response:<metric>`` ⇒ every GPU node ``unknown``).
Nothing is silently dropped and no exception escapes ``collect_live`` for a query failure; only a cycle
that runs past its total deadline (``prometheus.deadline``) ends as ``PrometheusUnavailable``.

Needs: network reach to the query endpoint. AMP: IAM ``aps:QueryMetrics`` on the workspace (SigV4 with
the function's role; ``aps:GetSeries``/``aps:GetLabels`` are not used). Bearer/basic secrets are resolved
by ``rightsizer.adapters.secrets`` (``ssm:GetParameter``, ``secretsmanager:GetSecretValue``,
``kms:Decrypt`` on a customer-managed key).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

import httpx
import orjson

from rightsizer.adapters import prometheus_matrix
from rightsizer.adapters.http_bodies import unbound
from rightsizer.adapters.prometheus_ahead import ReadAhead
from rightsizer.adapters.prometheus_answers import answer_problem, refusal_answer
from rightsizer.adapters.prometheus_auth import BearerAuth, CredentialsLike, SigV4Auth
from rightsizer.adapters.prometheus_matrix import MatrixFeeder
from rightsizer.domain.errors import ConfigError, MetricsFailed, PermanentError, TransientError
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.observation import (
    MetricQuery,
    ObservationReducer,
    SeriesShard,
    Shard,
    observation_queries,
    prometheus_duration,
    target_matchers,
)
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import UP, CollectedSignals, Window
from rightsizer.gc_pause import cyclic_gc_paused
from rightsizer.logsafety import is_credential_name, register_secret

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 502, 503, 504})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# --------------------------------------------------------------------------------------------- errors


class PrometheusError(Exception):
    """Mixin of every Prometheus adapter error: ``status_code`` (HTTP, None for transport errors) and
    ``error_type`` (the API's ``errorType``: ``timeout``, ``execution``, ``bad_data``…)."""

    status_code: int | None = None
    error_type: str | None = None


class PrometheusUnavailable(TransientError, PrometheusError):
    """429/5xx, timeouts or connection errors still failing after the retries."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_type: str | None = None,
        retry_after: float = 30.0,
    ) -> None:
        self.status_code = status_code
        self.error_type = error_type
        super().__init__(message, retry_after=retry_after)


class PrometheusQueryError(PermanentError, PrometheusError):
    """The server refused the query (400 ``bad_data``, 422 ``execution``, 401/403) or sent no JSON answer."""

    def __init__(
        self, message: str, *, status_code: int | None = None, error_type: str | None = None
    ) -> None:
        self.status_code = status_code
        self.error_type = error_type
        super().__init__(message)


# --------------------------------------------------------------------------------------------- client


def _unix(t: float | datetime) -> str:
    value = t.timestamp() if isinstance(t, datetime) else float(t)
    return f"{value:.3f}"


@dataclass
class ClientStats:
    """Counters of one client: HTTP requests sent (retries included), queries answered, response bytes,
    the Prometheus engine time reported with ``stats=all`` (``data.stats.timings.evalTotalTime``, s:
    summed, and the largest of one query), and the longest single request (s, wall clock). Updated under
    one lock: ``collect_live`` sends from several threads, and ``x += 1`` is a read and a write."""

    requests: int = 0
    queries: int = 0
    response_bytes: int = 0
    engine_seconds: float = 0.0
    slowest_engine_seconds: float = 0.0
    slowest_request_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def sent(self) -> None:
        """One HTTP request is about to be sent."""
        with self._lock:
            self.requests += 1

    def received(self, seconds: float, size: int) -> None:
        """A request came back after ``seconds`` (wall clock) with ``size`` bytes."""
        with self._lock:
            self.slowest_request_seconds = max(self.slowest_request_seconds, seconds)
            self.response_bytes += size

    def answered(self, engine_seconds: float) -> None:
        """A query was answered with success, its engine time ``engine_seconds`` (0 without stats)."""
        with self._lock:
            self.queries += 1
            self.engine_seconds += engine_seconds
            self.slowest_engine_seconds = max(self.slowest_engine_seconds, engine_seconds)


class PrometheusClient:
    """The Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``) for Prometheus, Thanos and AMP.

    Args:
        base_url: server root (AMP: ``https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>``).
        auth: an httpx auth (``BearerAuth``, ``httpx.BasicAuth``, ``SigV4Auth``) or None.
        timeout: read timeout per request in seconds; also sent as the query ``timeout`` so the server
            gives up first and says so (``errorType: timeout``) instead of the socket timing out.
        connect_timeout: TCP/TLS connect timeout in seconds.
        ca_bundle: PEM file of CAs to trust (None: the system/certifi store).
        retries: extra attempts after the first on 429/502/503/504 and connection errors. A timeout
            (the socket's, or the server's ``errorType: timeout``) is never retried: the same query
            would time out again, and the cycle's deadline is better spent elsewhere.
        backoff: first back-off in seconds, doubled per attempt, capped by ``max_backoff``; a
            ``Retry-After`` header (seconds) is honoured within the same cap.
        sleep: the sleep function (injected by tests).
        stats: send ``stats=all`` and add ``evalTotalTime`` to ``self.stats.engine_seconds``.
        transport: an httpx transport (tests); default a real HTTP transport.
        gzip: ask for gzip-compressed answers (``Accept-Encoding: gzip``, decoded by httpx). False
            (default): ``Accept-Encoding: identity``, so the server spends no CPU compressing: answers
            of the live path are large (≈ 38 MiB per cycle at 2,000 nodes × 8 GPUs, ≈ 190 MiB at
            10,000) and compressing them cost a self-hosted Prometheus about 5–25 % of its CPU for the cycle
            (``benchmarks/collect_scale.py``); ``build_client`` keeps gzip for AMP.
    """

    def __init__(
        self,
        base_url: str,
        *,
        auth: httpx.Auth | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        ca_bundle: str | None = None,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
        stats: bool = False,
        transport: httpx.BaseTransport | None = None,
        gzip: bool = False,
    ) -> None:
        url = httpx.URL(base_url)
        if url.userinfo:
            # Userinfo leaves the URL here, before any log line or error message can print it (issue 26):
            # it becomes the Basic credentials httpx would have derived from it.
            register_secret(url.password)
            if auth is None:
                auth = httpx.BasicAuth(url.username, url.password)
            url = url.copy_with(userinfo=b"")
        # Query parameters of the configured URL (``?token=`` of a proxy in front) go with every request;
        # credential values are redacted wherever a URL is logged.
        params = url.params
        for name, value in params.multi_items():
            if is_credential_name(name):
                register_secret(value)
        self.base_url = str(url.copy_with(query=None)).rstrip("/")
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.send_stats = stats
        self.stats = ClientStats()
        self._connect = connect_timeout
        self._sleep = sleep
        verify: str | bool = ca_bundle if ca_bundle else True
        headers = {"Accept": "application/json", "User-Agent": "gpu-rightsizer"}
        # httpx offers gzip (and deflate, br, zstd when installed) by default, so Prometheus compresses
        # every answer; identity asks it not to (RFC 9110 §12.5.3).
        headers["Accept-Encoding"] = "gzip" if gzip else "identity"
        self._http = httpx.Client(
            auth=auth,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            verify=verify,
            transport=transport,
            headers=headers,
            params=params,
        )

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- API

    def query(self, expr: str, at: float | datetime) -> dict[str, Any]:
        """Instant query (``POST /api/v1/query``) evaluated at ``at`` (Unix s or aware datetime).

        Returns:
            The parsed JSON answer (``status``, ``data.resultType``, ``data.result``, maybe ``warnings``);
            values are strings as Prometheus sends them (``"NaN"``, ``"+Inf"`` included).

        Raises:
            PrometheusUnavailable: 429/5xx/timeouts/connection errors after the retries.
            PrometheusQueryError: any other non-success answer (400 ``bad_data``, 422 ``execution``…).
        """
        return self._json(self._post("/api/v1/query", {"query": expr, "time": _unix(at)}))

    def query_range(
        self,
        expr: str,
        start: float | datetime,
        end: float | datetime,
        step: float,
        *,
        budget: float | None = None,
    ) -> dict[str, Any]:
        """Range query (``POST /api/v1/query_range``) at ``start + k·step`` ≤ ``end`` (step in s).

        ``budget`` (s) bounds this call, retries and back-offs included: each attempt's timeout is the
        smaller of ``timeout`` and what is left. Returns and raises as ``query``; the answer is a
        ``matrix`` for a valid expression.
        """
        return self._json(
            self._post("/api/v1/query_range", self._range_form(expr, start, end, step), budget=budget)
        )

    def query_range_bytes(
        self,
        expr: str,
        start: float | datetime,
        end: float | datetime,
        step: float,
        *,
        budget: float | None = None,
    ) -> bytes:
        """``query_range`` answer bytes of a 2xx, undecoded: ``collect_live`` waits for Prometheus from
        several threads but decodes one answer at a time (``prometheus_matrix``), since a decoded answer
        is many times its JSON. Raises as ``query`` for transport and HTTP errors."""
        return self._post(
            "/api/v1/query_range", self._range_form(expr, start, end, step), budget=budget
        ).content

    def query_range_raw(
        self, expr: str, start: float | datetime, end: float | datetime, step: float
    ) -> bytes:
        """``query_range`` answer bytes, verbatim, for snapshot files (docs/architecture.md §5 ``metrics/<M>.json``).

        A Prometheus error answer with a JSON body (4xx/5xx after retries) is returned as it is, so the
        snapshot records the failure and the loader marks the metric a problem; a 4xx refusal without one
        (AMP's text/plain 413) is returned as an API error answer holding its text (``refusal_answer``).

        Raises:
            PrometheusUnavailable: no JSON answer at all (timeouts, connection errors, HTML 502 pages).
        """
        response = self._post(
            "/api/v1/query_range", self._range_form(expr, start, end, step), raise_status=False
        )
        try:
            json.loads(response.content)
        except ValueError as exc:
            if 400 <= response.status_code < 500 and response.status_code not in RETRY_STATUS:
                return refusal_answer(response.status_code, response.text)
            raise PrometheusUnavailable(
                f"query_range: HTTP {response.status_code} without a JSON answer",
                status_code=response.status_code,
            ) from exc
        return response.content

    # -- plumbing

    def _range_form(
        self, expr: str, start: float | datetime, end: float | datetime, step: float
    ) -> dict[str, str]:
        return {"query": expr, "start": _unix(start), "end": _unix(end), "step": prometheus_duration(step)}

    def _post(
        self,
        path: str,
        form: dict[str, str],
        *,
        raise_status: bool = True,
        budget: float | None = None,
    ) -> httpx.Response:
        # partial_response=false: Thanos then fails the query instead of silently answering with some
        # stores missing; Prometheus and AMP ignore the parameter.
        started = time.monotonic()
        attempt = 0
        while True:
            timeout = self.timeout
            if budget is not None:
                timeout = min(timeout, budget - (time.monotonic() - started))
                if timeout <= 0.05:
                    raise PrometheusUnavailable(f"{path}: no time left in the budget of {budget:g} s")
            # whole seconds or ms: "89.006s" is a 400 (bad_data) that would fail every deadline-cut query
            body = {**form, "partial_response": "false", "timeout": prometheus_duration(timeout)}
            if self.send_stats:
                body["stats"] = "all"
            delay: float | None = None
            try:
                self.stats.sent()
                sent = time.monotonic()
                response = self._http.post(
                    self.base_url + path, data=body, timeout=httpx.Timeout(timeout, connect=self._connect)
                )
            except httpx.TimeoutException as exc:
                # A query that ran out of time will run out of time again: no blind retry.
                raise PrometheusUnavailable(
                    f"{path}: {type(exc).__name__} after {timeout:g} s: {exc}", error_type="timeout"
                ) from exc
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise PrometheusUnavailable(
                        f"{path}: {type(exc).__name__} after {attempt + 1} attempts: {exc}",
                        error_type="transport",
                    ) from exc
            else:
                self.stats.received(time.monotonic() - sent, len(unbound(response).content))
                timed_out = _error_type(response) == "timeout"
                if response.status_code not in RETRY_STATUS or attempt >= self.retries or timed_out:
                    if raise_status and response.status_code >= 400:
                        raise _status_error(path, response, attempt + 1)
                    return response
                delay = _retry_after(response)
            wait = min(self.max_backoff, self.backoff * (2**attempt))
            if delay is not None:
                wait = min(self.max_backoff, max(wait, delay))
            if budget is not None:
                wait = min(wait, max(0.0, budget - (time.monotonic() - started)))
            self._sleep(wait)
            attempt += 1

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        try:
            # The standard library, not orjson: as fast on these answers (GC paused), and its peak is
            # the decoded objects alone, where orjson's peaked 2.6× higher (218 vs 84 MiB on the
            # per-step answer of 2,000 nodes × 8 GPUs) — the client's peak memory is this peak.
            answer = json.loads(response.content)
        except ValueError as exc:
            raise PrometheusQueryError(
                f"HTTP {response.status_code}: not a JSON answer", status_code=response.status_code
            ) from exc
        if not isinstance(answer, dict):
            raise PrometheusQueryError("answer is not a JSON object", status_code=response.status_code)
        if answer.get("status") != "success":
            raise PrometheusQueryError(
                f"status {answer.get('status')!r}: {answer.get('error', '')}",
                status_code=response.status_code,
                error_type=answer.get("errorType"),
            )
        data = answer.get("data")
        timings = (data.get("stats") or {}).get("timings") or {} if isinstance(data, dict) else {}
        self.stats.answered(float(timings.get("evalTotalTime") or 0.0) if self.send_stats else 0.0)
        return answer


def _error_type(response: httpx.Response) -> str | None:
    """The API's ``errorType`` of an error answer (``timeout`` for a query the server gave up on)."""
    if response.status_code < 400:
        return None
    try:
        body = orjson.loads(response.content)
    except ValueError:
        return None
    value = body.get("errorType") if isinstance(body, dict) else None
    return str(value) if value else None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from Prometheus front ends; exponential backoff is enough.


def _status_error(path: str, response: httpx.Response, attempts: int) -> Exception:
    error_type: str | None = None
    detail = response.text[:300]
    try:
        body = response.json()
        if isinstance(body, dict):
            error_type = body.get("errorType")
            detail = str(body.get("error") or detail)
    except ValueError:
        pass
    message = f"{path}: HTTP {response.status_code} ({error_type or 'no errorType'}): {detail}"
    if response.status_code in RETRY_STATUS or response.status_code >= 500:
        return PrometheusUnavailable(
            f"{message} after {attempts} attempts",
            status_code=response.status_code,
            error_type=error_type,
            retry_after=_retry_after(response) or 30.0,
        )
    return PrometheusQueryError(message, status_code=response.status_code, error_type=error_type)


def build_client(
    url: str,
    *,
    auth: Literal["none", "bearer", "basic", "sigv4"] = "none",
    secret: str | None = None,
    username: str | None = None,
    credentials: CredentialsLike | None = None,
    region: str | None = None,
    timeout: float = 30.0,
    ca_bundle: str | None = None,
    stats: bool = False,
    compression: Literal["auto", "gzip", "identity"] = "auto",
) -> PrometheusClient:
    """A client for config ``prometheus`` (``rightsizer.config.PrometheusConfig`` fields).

    Args:
        secret: the already resolved token (bearer) or password (basic) — see ``adapters.secrets``.
        credentials: botocore credentials for ``sigv4`` (e.g. ``boto3.Session().get_credentials()``).
        region: SigV4 region (config ``sigv4_region``, else ``aws.region``).
        compression: config ``prometheus.compression``, how answers travel: ``auto`` asks gzip from AMP
            (``sigv4``: its CPU is not the cluster's, and bytes may cross a NAT gateway) and uncompressed
            answers (``identity``) from every other server, whose CPU is the cluster's own
            (``PrometheusClient`` ``gzip``); ``gzip`` or ``identity`` forces one.

    Raises:
        ConfigError: a required secret, user name, credentials or region is missing.
    """
    http_auth: httpx.Auth | None = None
    if auth == "bearer":
        if not secret:
            raise ConfigError("bearer auth needs a token", field="prometheus.secret")
        http_auth = BearerAuth(secret)
    elif auth == "basic":
        if not username or secret is None:
            raise ConfigError("basic auth needs username and secret", field="prometheus.username")
        http_auth = httpx.BasicAuth(username, secret)
    elif auth == "sigv4":
        if credentials is None or not region:
            raise ConfigError("sigv4 needs AWS credentials and a region", field="prometheus.sigv4_region")
        http_auth = SigV4Auth(credentials, region)
    gzip = compression == "gzip" or (compression == "auto" and auth == "sigv4")
    return PrometheusClient(url, auth=http_auth, timeout=timeout, ca_bundle=ca_bundle, stats=stats, gzip=gzip)


# ----------------------------------------------------------------------------------------- live path


@dataclass(frozen=True, slots=True)
class SubQuery:
    """One request of ``collect_live``: ``query`` over the sub-window (end − seconds, end], restricted
    to the series of ``shard`` when one is set."""

    query: MetricQuery
    end: float
    seconds: int
    shard: Shard | None = None

    def expr(self, step: int) -> str:
        """The PromQL text of this request."""
        return self.query.expr(step, self.seconds, self.shard.matcher() if self.shard else "")

    def span(self, step: int) -> tuple[float, float]:
        """(start, end) of the ``query_range`` (``MetricQuery.span`` of the sub-window)."""
        return self.query.span(self.end, self.seconds, step)


def plan_queries(
    window: Window,
    *,
    job: str | None = None,
    split_seconds: int = 3600,
    shards: Sequence[Shard] = (),
    scope: tuple[str, ...] = (),
) -> list[SubQuery]:
    """The requests of ``collect_live``: each ``observation_queries`` query, split like a query frontend.

    The window (end − W, end] is cut into sub-windows of at most ``split_seconds`` (rounded down to whole
    steps, at least one step), newest first. The ``MetricQuery.splittable`` queries (per-step points,
    maxima, non-finite sums) run once per sub-window, because their answers merge exactly: step points
    are disjoint, a maximum is the maximum of the sub-windows' maxima, and a series has a non-finite
    sample in the window iff it has one in some sub-window. The others run once over the whole window:
    the spreads (``stddev_over_time`` does not merge), which read each sample of their family once, like
    the floor, the instant ``timestamp``/latest-value queries, which read one sample per series, and the
    ``up`` sample count (scrape attempts per target, one series per exporter).
    Without ``shards`` the count depends on W, the step and the split, never on the number of nodes:
    7 + 7 × ⌈W / split⌉.

    With ``shards`` (large fleets, ``series_shards``/``device_shards``) every DCGM request is repeated per shard, each
    reading only its nodes' series; ``up`` (one series per exporter, not per GPU) stays whole, since its
    series need not carry the node label. Each request then reads at most one shard's share of the
    fleet, so no single query nears the server's timeout or ``--query.max-samples``.
    """
    step = max(1, int(window.step))
    chunk = max(step, split_seconds // step * step)
    subs: list[tuple[float, int]] = []
    covered = 0
    while covered < window.seconds:
        seconds = min(chunk, window.seconds - covered)
        subs.append((window.end - covered, seconds))
        covered += seconds
    out: list[SubQuery] = []
    for q in observation_queries(job, scope):
        spans = subs if q.splittable else [(window.end, window.seconds)]
        parts: Sequence[Shard | None] = shards if shards and q.metric != UP else (None,)
        out.extend(SubQuery(q, end, seconds, shard) for shard in parts for end, seconds in spans)
    return out


@dataclass(slots=True)
class _Outcome:
    """How the requests of one query went: a failure of the whole query, failures of series shards."""

    problem: str | None = None
    failed_shards: dict[Shard, str] = field(default_factory=dict)


def _file_kind(q: MetricQuery) -> str:
    # Window maxima share ``metrics/<M>.json`` with the per-step maxima, as in a snapshot.
    return "step" if q.kind == "max" else q.kind


#: ``collect_live`` asks one query at a time until an answer is larger than this (bytes) or a request
#: slower than ``SERIAL_SECONDS``, then ``max_workers`` at a time. A small fleet's answers take Prometheus
#: a few ms each; asked together they only contend for its cores and the client's: at 100 GPU nodes × 8
#: GPUs one at a time halves the engine time and costs ~4 % less CPU (the client's ~6 % less, no thread
#: pool) for 0.1 s more wall (``benchmarks/collect_scale.py``'s TSDB, 6 alternated samples of 30 runs).
#: The per-step activity answer, asked first, is ~5.5 KiB per GPU node of 8 GPUs: from ~200 such nodes
#: the rest go concurrent.
SERIAL_BYTES: Final = 1 << 20
SERIAL_SECONDS: Final = 0.5


def _reduce_answer(feeder: MatrixFeeder, q: MetricQuery, content: bytes, stats: ClientStats) -> str | None:
    """Decode one answer of ``q`` and feed it to the reducer; why it is unusable, or None."""
    try:
        answer = prometheus_matrix.decode(content)
        problem = answer_problem(answer.envelope(), "matrix")
        if answer.status == "success":
            stats.answered(answer.engine_seconds)
        if problem is None:  # else still unusable, but named: a warning's text says what to reshape (BUG-50)
            feeder.feed(_file_kind(q), q.metric, answer)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return f"malformed: {exc}"
    return problem


def collect_live(  # noqa: C901 (11): run/settle share the collection's state
    client: PrometheusClient,
    joiner: NodeJoiner | Future[NodeJoiner],
    window: Window,
    policy: Policy,
    node_label: str | None = None,
    *,
    job: str | None = None,
    scope: tuple[str, ...] = (),
    max_workers: int = 4,
    split_seconds: int = 3600,
    shards: Sequence[Shard] = (),
    deadline_seconds: float | None = None,
    fail_share: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CollectedSignals:
    """Per-device signals for the window ending at ``window.end``: the snapshot's queries, read live.

    Issues ``plan_queries`` (a constant number whatever the node count) — one at a time while the answers
    are small and quick, ``max_workers`` at a time from the first answer over ``SERIAL_BYTES`` or request
    over ``SERIAL_SECONDS`` — and hands each answer as it arrives to ``rightsizer.domain.observation_signals.ObservationReducer`` — the
    very code ``plan --snapshot`` runs on a format-2 snapshot's files, so the two paths decide alike —
    which merges sub-windows and shards exactly and keeps per-device facts only, never the series: the
    client's memory grows with the devices, not with the answers (docs/architecture.md §8). DCGM fields: ``DCGM_FI_DEV_GPU_UTIL`` (%),
    ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio ×100; the only activity of a MIG instance),
    ``DCGM_FI_DEV_FB_USED``/``FB_FREE`` (MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W),
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ), and ``up``.

    Args:
        client: a ``PrometheusClient``.
        joiner: resolves series labels to nodes (docs/architecture.md §3 join); unjoinable series go to ``unmapped``.
            A ``Future`` of it: the queries start at once, answers wait for it (``prometheus_ahead``).
        window: the idle window (``end`` Unix s, ``seconds``, ``step``).
        policy: the ``Policy`` (its ``gpu_activity_max_pct`` sets ``active_steps``).
        node_label: config ``prometheus.node_label`` (tried first by the join).
        job: config ``prometheus.job``: only series of that scrape job.
        scope: label matchers selecting one node's series (``join.node_series_matchers``; the drain's
            per-node read), () for every series. The ``up`` of a target the node's DCGM series name but
            the matchers did not select is then counted by its name (``ObservationReducer.
            uncounted_targets``, ``observation.target_matchers``): one more query, only when needed.
        max_workers: queries in flight at once once the answers are large or slow (1: always one).
        split_seconds: longest sub-window one query reads (``plan_queries``).
        shards: series shards (``rightsizer.domain.observation.series_shards`` by node name,
            ``device_shards`` by GPU index) each DCGM query is split
            into, merged by union; empty: one request per query and sub-window.
        deadline_seconds: the whole collection's budget (config ``prometheus.deadline``); every request
            gets at most what is left of it, and none starts after it.
        fail_share: when more than this share of the queries failed (wholly: every shard), raise
            ``MetricsFailed`` instead of returning a picture of ``unknown`` nodes (the assessment: 0.5).
        clock: monotonic clock (tests).

    Returns:
        ``CollectedSignals``; a failed query puts the metric it feeds into ``problems`` (its nodes are
        then ``unknown``); a failed shard of a query only into ``node_problems`` of the shard's nodes
        (a device shard: the nodes of the devices it holds), unless every shard of that query failed.

    Raises:
        PrometheusUnavailable: the deadline passed with queries unanswered (a hanging or overloaded
            Prometheus): "Prometheus unavailable", nothing is decided on a partial picture of the cycle.
        MetricsFailed: more than ``fail_share`` of the queries failed.
    """
    _check_node_label(node_label)
    tasks = plan_queries(window, job=job, split_seconds=split_seconds, shards=shards, scope=scope)

    def reducing(joined: NodeJoiner) -> tuple[ObservationReducer, MatrixFeeder]:
        reducer = ObservationReducer(joined, window, float(policy.gpu_activity_max_pct))
        return reducer, MatrixFeeder(reducer)

    ahead: ReadAhead[SubQuery, tuple[ObservationReducer, MatrixFeeder]] = ReadAhead(
        joiner, reducing, clock=clock
    )
    outcomes = {q.path: _Outcome() for q in observation_queries(job)}
    lock = threading.Lock()
    started = clock()
    expired: list[SubQuery] = []
    heavy = threading.Event()  # an answer was large or slow: the rest go max_workers at a time

    def remaining() -> float | None:  # the wait for the join is not Prometheus' time
        return None if deadline_seconds is None else deadline_seconds - (clock() - started - ahead.waited)

    def run(task: SubQuery) -> None:
        if ahead.failed():  # the Kubernetes read failed: nothing will be decided on these answers
            return
        left = remaining()
        if left is not None and left <= 0:
            with lock:
                expired.append(task)
            return
        start, end = task.span(window.step)
        problem: str | None = None
        content: bytes | None = None
        sent = time.monotonic()
        try:
            content = client.query_range_bytes(task.expr(window.step), start, end, window.step, budget=left)
        except PrometheusUnavailable as exc:
            if deadline_seconds is not None and (remaining() or 0.0) <= 0:
                with lock:
                    expired.append(task)
                return
            problem = f"{type(exc).__name__}: {exc}"
        except PrometheusQueryError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        finally:
            if time.monotonic() - sent > SERIAL_SECONDS or (
                content is not None and len(content) > SERIAL_BYTES
            ):
                heavy.set()
        with lock:  # decoded and reduced one answer at a time: bounded memory, whatever the fleet
            if content is not None and ahead.hold(task, content):
                return
            for held, body in ahead.drain() if content is not None else ():
                settle(held, body, None)
            settle(task, content, problem)

    def settle(task: SubQuery, content: bytes | None, problem: str | None) -> None:  # under the lock
        q = task.query
        target = outcomes[q.path]
        if content is not None:
            problem = _reduce_answer(ahead.made()[1], q, content, client.stats)
        if problem is not None and task.shard is not None:
            log.warning(
                "prometheus query %s unusable in shard %s (%s): %s unknown on its nodes",
                q.path,
                task.shard.matcher() or "rest",
                problem,
                q.metric,
            )
            target.failed_shards.setdefault(task.shard, problem)
        elif problem is not None:
            log.warning("prometheus query %s unusable (%s): %s unknown", q.path, problem, q.metric)
            target.problem = target.problem or problem

    with cyclic_gc_paused():
        _ask(tasks, run, heavy, max_workers)
        with lock:
            for held, body in ahead.drain():
                settle(held, body, None)
        reducer = ahead.made()[0]
        if scope and (targets := reducer.uncounted_targets()):
            # targets named otherwise than the node's matchers know: their up counts by name
            run(SubQuery(MetricQuery(UP, "count", job, target_matchers(targets)), window.end, window.seconds))
    if expired:
        raise PrometheusUnavailable(
            f"Prometheus unavailable: {len(expired)} of {len(tasks)} queries unanswered within the "
            f"cycle deadline of {deadline_seconds:g} s"
        )
    node_problems = _conclude(reducer, outcomes, job, len(shards))
    failed = [(path, o.problem) for path, o in outcomes.items() if o.problem]
    if fail_share is not None and len(failed) > fail_share * len(outcomes):
        raise MetricsFailed(
            f"{len(failed)} of {len(outcomes)} Prometheus queries failed, first {failed[0][0]}: {failed[0][1]}"
        )
    with cyclic_gc_paused():
        signals = reducer.finish()
    return dataclasses.replace(signals, node_problems=node_problems) if node_problems else signals


def _ask(
    tasks: Sequence[SubQuery], run: Callable[[SubQuery], None], heavy: threading.Event, max_workers: int
) -> None:
    """``run`` every task: one at a time until ``heavy`` is set, then the rest ``max_workers`` at a time."""
    pending = iter(tasks)
    for task in pending:
        run(task)
        if heavy.is_set() and max_workers > 1:
            break
    rest = list(pending)
    if rest:
        with ThreadPoolExecutor(max_workers=min(max_workers, len(rest))) as pool:
            list(pool.map(run, rest))


def _conclude(
    reducer: ObservationReducer, outcomes: dict[str, _Outcome], job: str | None, shard_count: int
) -> dict[str, tuple[str, ...]]:
    """Tell the reducer which answers failed; returns node → metrics of its failed shards.

    A query that failed in every shard is a problem of the whole collection, as an unsharded failure.
    """
    node_problems: dict[str, dict[str, None]] = {}
    for q in observation_queries(job):
        outcome = outcomes[q.path]
        if outcome.failed_shards and len(outcome.failed_shards) == shard_count:
            outcome.problem = outcome.problem or next(iter(outcome.failed_shards.values()))
        if outcome.problem:
            reducer.problem(_file_kind(q), q.metric)
            continue
        reducer.answered(_file_kind(q), q.metric)
        for shard in outcome.failed_shards:
            # a node shard names its nodes; a device shard's are those of the devices it holds
            nodes = (
                shard.nodes
                if isinstance(shard, SeriesShard)
                else reducer.nodes_of_series(shard.label, shard.holds)
            )
            for node in sorted(nodes):
                node_problems.setdefault(node, {})[q.metric] = None
    return {node: tuple(names) for node, names in node_problems.items()}


def _check_node_label(node_label: str | None) -> None:
    if node_label is not None and not _LABEL_NAME.match(node_label):
        raise ConfigError(f"not a Prometheus label name: {node_label!r}", field="prometheus.node_label")

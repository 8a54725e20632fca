"""Prometheus / Thanos / Amazon Managed Service for Prometheus (AMP): the live DCGM path (design §3, §8).

Two parts:

- ``PrometheusClient`` — the HTTP API (``/api/v1/query``, ``/api/v1/query_range``) over httpx with
  auth ``none`` | ``bearer`` | ``basic`` | ``sigv4`` (AMP, service ``aps``, botocore's signer), TLS with an
  optional CA bundle, connect/read timeouts and bounded exponential backoff on 429/502/503/504, timeouts
  and connection errors. Queries are POSTed as form bodies so long PromQL fits and SigV4 signs exactly the
  bytes that are sent.
- ``collect_live`` — per-device signals for every GPU node with a CONSTANT number of queries whatever the
  node count (``live_queries`` lists them): the server aggregates per device and per window, the client
  only joins the small answers to nodes (``NodeJoiner``) and fills the same ``DeviceSignals`` the snapshot
  path builds, so ``plan`` decides alike on both paths.

Failure policy: an answer that is not ``success``, carries ``warnings`` (Thanos partial responses), has an
unexpected result type, or an HTTP error left after retries makes the metric names that query feeds a
*problem* (``CollectedSignals.problems`` ⇒ ``partial_response:<metric>`` ⇒ every GPU node ``unknown``).
Nothing is silently dropped and no exception escapes ``collect_live`` for a query failure.

Needs: network reach to the query endpoint. AMP: IAM ``aps:QueryMetrics`` on the workspace (SigV4 with
the function's role; ``aps:GetSeries``/``aps:GetLabels`` are not used). Bearer/basic secrets are resolved
by ``rightsizer.adapters.secrets`` (``ssm:GetParameter``, ``secretsmanager:GetSecretValue``,
``kms:Decrypt`` on a customer-managed key).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

import httpx
from botocore.auth import SigV4Auth as _BotocoreSigV4
from botocore.awsrequest import AWSRequest

from rightsizer.domain.errors import ConfigError, PermanentError, TransientError
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import (
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    POWER,
    PROF_ACTIVE,
    UP,
    CollectedSignals,
    DeviceKey,
    DeviceSignals,
    UnmappedSeries,
    Window,
)

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 502, 503, 504})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: Labels kept on per-series answers: what ``NodeJoiner`` reads plus the device identity (design §3).
#: Everything else (``container``, ``pci_bus_id``, ``modelName``, ``DCGM_FI_DRIVER_VERSION``…) is
#: aggregated away in the server so the answer stays small.
JOIN_LABELS = (
    "node",
    "kubernetes_node",
    "Hostname",
    "hostname",
    "instance",
    "namespace",
    "pod",
    "exported_namespace",
    "exported_pod",
)
DEVICE_LABELS = ("UUID", "gpu", "GPU_I_ID", "GPU_I_PROFILE")
#: Workload labels change when the workload changes; per-step merges of one device must not split on them.
WORKLOAD_LABELS = ("namespace", "pod", "exported_namespace", "exported_pod")


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


# ----------------------------------------------------------------------------------------------- auth


class CredentialsLike(Protocol):
    """botocore credentials: ``get_frozen_credentials()`` (refreshable role credentials included)."""

    def get_frozen_credentials(self) -> Any:
        """A consistent (access_key, secret_key, token) triple for one signature."""


class SigV4Auth(httpx.Auth):
    """AWS Signature Version 4 for AMP (service ``aps``) using botocore's signer.

    The request is signed over exactly what httpx will send: method, URL (path and query string), the
    body bytes (``x-amz-content-sha256`` = hex SHA-256 of the body, sent as well), ``host``,
    ``content-type`` and ``x-amz-date`` (plus ``x-amz-security-token`` for session credentials). Only
    those headers are signed: httpx may add or rewrite others (``connection``, ``accept-encoding``) and a
    proxy may too, which would break a signature over them. Credentials are frozen per request, so
    refreshable role credentials rotate without rebuilding the client.
    """

    requires_request_body = True

    def __init__(self, credentials: CredentialsLike, region: str, service: str = "aps") -> None:
        self._credentials = credentials
        self._region = region
        self._service = service

    def sign(self, request: httpx.Request) -> None:
        """Add ``Authorization``, ``X-Amz-Date``, ``X-Amz-Content-SHA256`` (and token) to ``request``."""
        body = request.content
        headers = {"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()}
        if "content-type" in request.headers:
            headers["Content-Type"] = request.headers["content-type"]
        aws = AWSRequest(method=request.method, url=str(request.url), data=body, headers=headers)
        # botocore derives the signed ``host`` from the URL the same way httpx writes the Host header
        # (default ports omitted); assert it rather than hope, a mismatch would be a 403 far from here.
        _BotocoreSigV4(self._credentials.get_frozen_credentials(), self._service, self._region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token"):
            value = aws.headers.get(name)
            if value is not None:
                request.headers[name] = value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """httpx hook: sign each attempt afresh (retries get a new date and signature)."""
        self.sign(request)
        yield request


class BearerAuth(httpx.Auth):
    """``Authorization: Bearer <token>`` (Thanos/Prometheus behind an auth proxy, Grafana Cloud…)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """httpx hook: add the header."""
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


# --------------------------------------------------------------------------------------------- client


def _unix(t: float | datetime) -> str:
    value = t.timestamp() if isinstance(t, datetime) else float(t)
    return f"{value:.3f}"


@dataclass
class ClientStats:
    """Counters of one client: HTTP requests sent (retries included), queries answered, response bytes,
    and the Prometheus engine time reported with ``stats=all`` (``data.stats.timings.evalTotalTime``, s)."""

    requests: int = 0
    queries: int = 0
    response_bytes: int = 0
    engine_seconds: float = 0.0


class PrometheusClient:
    """The Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``) for Prometheus, Thanos and AMP.

    Args:
        base_url: server root (AMP: ``https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>``).
        auth: an httpx auth (``BearerAuth``, ``httpx.BasicAuth``, ``SigV4Auth``) or None.
        timeout: read timeout per request in seconds; also sent as the query ``timeout`` so the server
            gives up first and says so (``errorType: timeout``) instead of the socket timing out.
        connect_timeout: TCP/TLS connect timeout in seconds.
        ca_bundle: PEM file of CAs to trust (None: the system/certifi store).
        retries: extra attempts after the first on 429/502/503/504, timeouts and connection errors.
        backoff: first back-off in seconds, doubled per attempt, capped by ``max_backoff``; a
            ``Retry-After`` header (seconds) is honoured within the same cap.
        sleep: the sleep function (injected by tests).
        stats: send ``stats=all`` and add ``evalTotalTime`` to ``self.stats.engine_seconds``.
        transport: an httpx transport (tests); default a real HTTP transport.
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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.send_stats = stats
        self.stats = ClientStats()
        self._sleep = sleep
        verify: str | bool = ca_bundle if ca_bundle else True
        self._http = httpx.Client(
            auth=auth,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            verify=verify,
            transport=transport,
            headers={"Accept": "application/json", "User-Agent": "gpu-rightsizer"},
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
        self, expr: str, start: float | datetime, end: float | datetime, step: float
    ) -> dict[str, Any]:
        """Range query (``POST /api/v1/query_range``) at ``start + k·step`` ≤ ``end`` (step in s).

        Returns and raises as ``query``; the answer is a ``matrix`` for a valid expression.
        """
        return self._json(self._post("/api/v1/query_range", self._range_form(expr, start, end, step)))

    def query_range_raw(
        self, expr: str, start: float | datetime, end: float | datetime, step: float
    ) -> bytes:
        """``query_range`` answer bytes, verbatim, for snapshot files (design §5 ``metrics/<M>.json``).

        A Prometheus error answer with a JSON body (4xx/5xx after retries) is returned as it is, so the
        snapshot records the failure and the loader marks the metric a problem.

        Raises:
            PrometheusUnavailable: no JSON answer at all (timeouts, connection errors, HTML 502 pages).
        """
        response = self._post(
            "/api/v1/query_range", self._range_form(expr, start, end, step), raise_status=False
        )
        try:
            json.loads(response.content)
        except ValueError as exc:
            raise PrometheusUnavailable(
                f"query_range: HTTP {response.status_code} without a JSON answer",
                status_code=response.status_code,
            ) from exc
        return response.content

    # -- plumbing

    def _range_form(
        self, expr: str, start: float | datetime, end: float | datetime, step: float
    ) -> dict[str, str]:
        return {"query": expr, "start": _unix(start), "end": _unix(end), "step": f"{float(step):g}"}

    def _post(self, path: str, form: dict[str, str], *, raise_status: bool = True) -> httpx.Response:
        # partial_response=false: Thanos then fails the query instead of silently answering with some
        # stores missing; Prometheus and AMP ignore the parameter.
        body = {**form, "partial_response": "false", "timeout": f"{self.timeout:g}s"}
        if self.send_stats:
            body["stats"] = "all"
        attempt = 0
        while True:
            delay: float | None = None
            try:
                self.stats.requests += 1
                response = self._http.post(self.base_url + path, data=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                if attempt >= self.retries:
                    raise PrometheusUnavailable(
                        f"{path}: {type(exc).__name__} after {attempt + 1} attempts: {exc}",
                        error_type="timeout" if isinstance(exc, httpx.TimeoutException) else "transport",
                    ) from exc
            else:
                self.stats.response_bytes += len(response.content)
                if response.status_code not in RETRY_STATUS or attempt >= self.retries:
                    if raise_status and response.status_code >= 400:
                        raise _status_error(path, response, attempt + 1)
                    return response
                delay = _retry_after(response)
            wait = min(self.max_backoff, self.backoff * (2**attempt))
            if delay is not None:
                wait = min(self.max_backoff, max(wait, delay))
            self._sleep(wait)
            attempt += 1

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        try:
            answer = response.json()
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
        self.stats.queries += 1
        data = answer.get("data")
        if self.send_stats and isinstance(data, dict):
            timings = (data.get("stats") or {}).get("timings") or {}
            self.stats.engine_seconds += float(timings.get("evalTotalTime") or 0.0)
        return answer


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


def answer_problem(answer: Mapping[str, Any], result_type: Literal["vector", "matrix"]) -> str | None:
    """Why an API answer cannot be used, or None: ``status_<s>``, ``warnings``, ``not_a_<type>``.

    Warnings make an answer unusable on purpose: Thanos and AMP use them for partial results.
    """
    if answer.get("status") != "success":
        return f"status_{answer.get('status')}"
    if answer.get("warnings"):
        return "warnings"
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != result_type:
        return f"not_a_{result_type}"
    if not isinstance(data.get("result"), list):
        return f"not_a_{result_type}"
    return None


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
) -> PrometheusClient:
    """A client for config ``prometheus`` (``rightsizer.config.PrometheusConfig`` fields).

    Args:
        secret: the already resolved token (bearer) or password (basic) — see ``adapters.secrets``.
        credentials: botocore credentials for ``sigv4`` (e.g. ``boto3.Session().get_credentials()``).
        region: SigV4 region (config ``sigv4_region``, else ``aws.region``).

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
    return PrometheusClient(url, auth=http_auth, timeout=timeout, ca_bundle=ca_bundle, stats=stats)


# ----------------------------------------------------------------------------------------- live path


@dataclass(frozen=True, slots=True)
class LiveQuery:
    """One query of the live path.

    ``key`` names its role; ``metrics`` are the metric names that become problems when it fails;
    ``range`` queries run as ``query_range`` over the window's step points, the others as instant
    queries at ``window.end``.
    """

    key: str
    expr: str
    metrics: tuple[str, ...]
    range: bool = False


@dataclass(frozen=True, slots=True)
class _Sample:
    labels: dict[str, str]
    value: float
    times: tuple[float, ...] = ()


def _selector(metric: str, job: str | None, extra: str = "") -> str:
    matchers = [m for m in (extra, f'job="{_escape(job)}"' if job else "") if m]
    return f"{metric}{{{','.join(matchers)}}}" if matchers else metric


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _labels(node_label: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if node_label is not None and not _LABEL_NAME.match(node_label):
        raise ConfigError(f"not a Prometheus label name: {node_label!r}", field="prometheus.node_label")
    series = tuple(dict.fromkeys([*([node_label] if node_label else []), *JOIN_LABELS, *DEVICE_LABELS]))
    device = tuple(n for n in series if n not in WORKLOAD_LABELS)
    return series, device


def subquery_range(window: Window) -> str:
    """The subquery range that holds exactly the step points in (end − W, end].

    Prometheus 2.x subqueries evaluate at the multiples of the step in [end − range, end], both ends
    included; one millisecond less than W drops the left end, matching the snapshot rule "finite step
    points in (at − W, at]" (design §3). Prometheus 3 made ranges left-open, where this is still exact.
    """
    return f"[{window.seconds * 1000 - 1}ms:{window.step}s]"


def live_queries(
    window: Window,
    activity_threshold_pct: float,
    *,
    node_label: str | None = None,
    job: str | None = None,
) -> list[LiveQuery]:
    """Every query of ``collect_live``: their number depends on nothing but the metric list (18).

    Notation: ``F(m) = m > -Inf < +Inf`` keeps finite samples (NaN compares false) where a per-step value
    is combined (coverage, disagreement, activity, FB total, liveness); ``by (L)`` keeps the
    join and device labels (``JOIN_LABELS`` + ``DEVICE_LABELS`` + the configured node label); ``by (D)``
    is the same without workload labels, so series of one device that differ only in pod/namespace merge
    per step (max) in the server before coverage, liveness, disagreement and activity are counted.
    """
    series_by, device_by = _labels(node_label)
    lj = ", ".join(series_by)
    ld = ", ".join(device_by)
    rng = subquery_range(window)
    s = {m: _selector(m, job) for m in (GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER, ENERGY, UP)}
    util_full = _selector(GPU_UTIL, job, 'GPU_I_ID=""')

    def fin(sel: str) -> str:
        return f"({sel} > -Inf < +Inf)"

    queries: list[LiveQuery] = []
    for m in (GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER):
        # Max of maxima needs no per-step merge, so aggregate once after max_over_time and select the raw
        # series in the subquery: ~10x less engine time than a filter or "max by" at every step (measured
        # by benchmarks/collect_scale.py). max_over_time skips NaN but returns +Inf when present; the
        # nonfinite:* queries flag such devices, which are unknown anyway.
        queries.append(LiveQuery(f"max:{m}", f"max by ({lj}) (max_over_time({s[m]}{rng}))", (m,)))
    for m in (GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER, ENERGY):
        # m - m is 0 for a finite sample and NaN for NaN/±Inf; NaN != 0 is true, so only those remain.
        expr = f"max by ({lj}) (count_over_time((({s[m]} - {s[m]}) != 0){rng}))"
        queries.append(LiveQuery(f"nonfinite:{m}", expr, (m,)))
    for m in (GPU_UTIL, PROF_ACTIVE):
        # timestamp() must see the raw selector: on an aggregate it returns the evaluation time.
        expr = f"max by ({ld}) (max_over_time(timestamp({s[m]}){rng}))"
        queries.append(LiveQuery(f"newest:{m}", expr, (m,)))

    prof = f"(100 * max by ({ld}) {fin(s[PROF_ACTIVE])})"
    util = f"(max by ({ld}) {fin(util_full)})"  # a MIG instance's GPU_UTIL is not activity (BUG-02)
    both = (GPU_UTIL, PROF_ACTIVE)
    queries.append(LiveQuery("coverage", f"count_over_time(({prof} or {util}){rng})", both))
    queries.append(LiveQuery("disagree", f"max_over_time((abs({prof} - {util}) > bool 50){rng})", both))
    # max(P, U) > t  ⇔  P > t or U > t: filter the raw series first (few survive on an idle fleet), then
    # merge per device; 4x cheaper than combining P and U at every step (benchmarks/collect_scale.py).
    thr = float(activity_threshold_pct)
    activity = (
        f"(max by ({ld}) ({s[PROF_ACTIVE]} > {thr / 100!r})) or (max by ({ld}) ({util_full} > {thr!r}))"
    )
    queries.append(LiveQuery("active", activity, both, range=True))
    used_d = f"(max by ({ld}) {fin(s[FB_USED])})"
    free_d = f"(max by ({ld}) {fin(s[FB_FREE])})"
    queries.append(LiveQuery("fb_total", f"max_over_time(({used_d} + {free_d}){rng})", (FB_FREE,)))
    # Liveness per series, merged per device by max: a device moves when any of its series moves. This
    # differs from the snapshot's per-step merge only for two series of one GPU holding different constant
    # values, which a real counter cannot do; a per-step "max by" here cost 4x the engine time.
    energy = f"{fin(s[ENERGY])}{rng}"
    queries.append(
        LiveQuery(
            "liveness:energy",
            f"max by ({ld}) (max_over_time({energy}) - min_over_time({energy}))"
            # A counter with only non-finite samples is frozen (0), as the snapshot path treats it.
            f" or (0 * max by ({ld}) (count_over_time({s[ENERGY]}{rng})))",
            (ENERGY,),
        )
    )
    power = f"{fin(s[POWER])}{rng}"
    queries.append(
        LiveQuery(
            "liveness:power",
            f"max by ({ld}) (max_over_time({power}) - min_over_time({power}))",
            (POWER,),
        )
    )
    up_by = ", ".join(n for n in series_by if n in JOIN_LABELS or n == node_label)
    up_sel = s[UP]
    up_expr = (
        f"(count_over_time((max by ({up_by}) ({up_sel}) == 1){rng})"
        f" or 0 * count_over_time((max by ({up_by}) ({up_sel})){rng}))"
    )
    if not job:
        # Without a configured job, keep only the targets that exported DCGM series in the window; the
        # filter sits outside the subquery, so steps where the exporter was down still count as down.
        up_expr += (
            f" and on (instance) (group by (instance) (count_over_time({s[POWER]}[{window.seconds}s])))"
        )
    queries.append(LiveQuery("up", up_expr, (UP,)))
    return queries


def range_points(window: Window) -> tuple[float, float]:
    """(start, end) of the ``query_range`` whose points are the subquery points: multiples of the step
    in (end − W, end], in Unix seconds."""
    step_ms = window.step * 1000
    end_ms = round(window.end * 1000)
    start_ms = ((end_ms - window.seconds * 1000) // step_ms + 1) * step_ms
    return start_ms / 1000, end_ms / 1000


def _parse(answer: Mapping[str, Any]) -> list[_Sample]:
    out: list[_Sample] = []
    for item in answer["data"]["result"]:
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items() if v != ""}
        if "value" in item:
            out.append(_Sample(labels, float(item["value"][1])))
        else:
            points = item.get("values") or []
            out.append(_Sample(labels, math.nan, tuple(float(p[0]) for p in points)))
    out.sort(key=lambda x: sorted(x.labels.items()))
    return out


def collect_live(
    client: PrometheusClient,
    joiner: NodeJoiner,
    window: Window,
    policy: Policy,
    node_label: str | None = None,
    *,
    job: str | None = None,
    max_workers: int = 4,
) -> CollectedSignals:
    """Per-device signals for the window ending at ``window.end``, aggregated in the server.

    Issues the constant set of ``live_queries`` (17 instant queries at ``window.end`` and one
    ``query_range`` over the window's step points), ``max_workers`` at a time. DCGM fields:
    ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio ×100; the only activity of a MIG
    instance), ``DCGM_FI_DEV_FB_USED``/``FB_FREE`` (MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W),
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ), and ``up``.

    Semantics equal the snapshot path's (``rightsizer.domain.usage.collect_signals``): coverage = finite
    step points in (end − W, end] ÷ (W/step), capped at 1, on the per-step max of a device's series;
    maxima over finite samples; liveness = the merged counter (else power) takes more than one value;
    newest sample = the newest raw sample time (``timestamp``). Step points are the multiples of the step
    (Prometheus subquery alignment); the snapshot's ``query_range`` points are ``end − k·step``, so both
    paths see the same samples when ``end`` is a multiple of the step, which ``rightsizer snapshot`` and
    the scheduler should use. Slots of ``active_steps`` count back from ``end``: ``⌊(end − t)/step⌋``.

    Args:
        client: a ``PrometheusClient``.
        joiner: resolves series labels to nodes (design §3 join); unjoinable series go to ``unmapped``.
        window: the idle window (``end`` Unix s, ``seconds``, ``step``).
        policy: the ``Policy`` (its ``gpu_activity_max_pct`` sets ``active_steps``).
        node_label: config ``prometheus.node_label`` (kept on the answers and tried first by the join).
        job: config ``prometheus.job``: only series of that scrape job.
        max_workers: queries in flight at once.

    Returns:
        ``CollectedSignals``; a failed query puts the metric names it feeds into ``problems``.
    """
    threshold = float(policy.gpu_activity_max_pct)
    queries = live_queries(window, threshold, node_label=node_label, job=job)
    start, end = range_points(window)

    def run(q: LiveQuery) -> tuple[LiveQuery, list[_Sample] | None, str | None]:
        try:
            if q.range:
                answer = client.query_range(q.expr, start, end, window.step)
            else:
                answer = client.query(q.expr, window.end)
        except (PrometheusUnavailable, PrometheusQueryError) as exc:
            return q, None, f"{type(exc).__name__}: {exc}"
        problem = answer_problem(answer, "matrix" if q.range else "vector")
        if problem:
            return q, None, problem
        try:
            return q, _parse(answer), None
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            return q, None, f"malformed: {exc}"

    if max_workers > 1:
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            results = list(pool.map(run, queries))
    else:
        results = [run(q) for q in queries]
    answers: dict[str, list[_Sample]] = {}
    problems: set[str] = set()
    for q, samples, problem in results:
        if samples is None:
            log.warning("prometheus query %s unusable (%s): metrics %s unknown", q.key, problem, q.metrics)
            problems.update(q.metrics)
        else:
            answers[q.key] = samples
    _, device_by = _labels(node_label)
    return _assemble(answers, frozenset(problems), joiner, window, device_by)


@dataclass
class _Acc:
    """Accumulators per device key while assembling (all maxima over finite samples)."""

    activity: dict[str, float] = field(default_factory=dict)
    non_finite: set[str] = field(default_factory=set)
    fb_used: float | None = None
    has_fb: bool = False
    fb_total: float | None = None
    power: float | None = None
    has_power: bool = False
    coverage_points: float = 0.0
    newest: float | None = None
    disagree: bool = False
    active: set[int] = field(default_factory=set)
    energy_delta: float | None = None
    power_delta: float | None = None
    profile: str | None = None
    exporter: str | None = None
    is_activity_device: bool = False


def _key(node: str, labels: Mapping[str, str]) -> DeviceKey:
    return (node, labels.get("UUID") or labels.get("gpu") or "", labels.get("GPU_I_ID") or "")


def _max(a: float | None, b: float) -> float:
    return b if a is None or b > a else a


def _assemble(
    answers: Mapping[str, Sequence[_Sample]],
    problems: frozenset[str],
    joiner: NodeJoiner,
    window: Window,
    device_by: Sequence[str],
) -> CollectedSignals:
    acc: dict[DeviceKey, _Acc] = {}
    unmapped: dict[tuple[str, tuple[tuple[str, str], ...]], UnmappedSeries] = {}
    # Device-level answers carry no workload labels; they reach their node through the per-series
    # answers with the same device labels (whose pod labels the join may need), else the join itself.
    via: dict[tuple[str, ...], set[str | None]] = {}

    def project(labels: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(labels.get(n, "") for n in device_by)

    def per_series(key: str, metric: str) -> Iterable[tuple[DeviceKey, _Sample]]:
        for smp in answers.get(key, ()):
            result = joiner.join(smp.labels)
            via.setdefault(project(smp.labels), set()).add(result.node)
            if result.node is None:
                ident = (metric, tuple(sorted(smp.labels.items())))
                unmapped.setdefault(
                    ident, UnmappedSeries(metric, dict(smp.labels), f"series_unmapped:{result.reason}")
                )
                continue
            yield _key(result.node, smp.labels), smp

    metric_order = (GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER, ENERGY)
    present: set[str] = set()
    for metric in metric_order:
        for kind in ("max", "nonfinite"):
            rows = answers.get(f"{kind}:{metric}", ())
            if rows:
                present.add(metric)
            for key, smp in per_series(f"{kind}:{metric}", metric):
                a = acc.setdefault(key, _Acc())
                if smp.labels.get("GPU_I_PROFILE"):
                    a.profile = smp.labels["GPU_I_PROFILE"]
                if a.exporter is None:
                    a.exporter = smp.labels.get("instance") or smp.labels.get("Hostname") or ""
                if metric in (GPU_UTIL, PROF_ACTIVE) and (metric == PROF_ACTIVE or not key[2]):
                    a.is_activity_device = True
                if kind == "nonfinite" or not math.isfinite(smp.value):
                    a.non_finite.add(metric)
                    _mark_has(a, metric)
                    continue
                _mark_has(a, metric)
                value = smp.value * (100.0 if metric == PROF_ACTIVE else 1.0)
                if metric in (GPU_UTIL, PROF_ACTIVE):
                    a.activity[metric] = _max(a.activity.get(metric), value)
                elif metric == FB_USED:
                    a.fb_used = _max(a.fb_used, value)
                elif metric == POWER:
                    a.power = _max(a.power, value)

    def per_device(key: str, metric: str, report: bool = False) -> Iterable[tuple[DeviceKey, _Sample]]:
        # ``report``: list unjoinable series as unmapped — only for answers no per-series query covers
        # (the energy counter), so one device is not listed twice with different label sets.
        for smp in answers.get(key, ()):
            nodes = via.get(project(smp.labels))
            reason = "no_match"
            if nodes is None:
                result = joiner.join(smp.labels)
                node, reason = result.node, result.reason or reason
            else:
                known = nodes - {None}
                node = next(iter(known)) if len(known) == 1 else None
                if len(known) > 1:
                    reason = "ambiguous:" + ",".join(sorted(k for k in known if k))
            if node is not None:
                yield _key(node, smp.labels), smp
            elif report:
                ident = (metric, tuple(sorted(smp.labels.items())))
                unmapped.setdefault(
                    ident, UnmappedSeries(metric, dict(smp.labels), f"series_unmapped:{reason}")
                )

    n = window.expected_points
    step = window.step
    for key, smp in per_device("coverage", GPU_UTIL):
        a = acc.setdefault(key, _Acc())
        a.is_activity_device = True
        a.coverage_points += smp.value
    for metric in (GPU_UTIL, PROF_ACTIVE):
        for key, smp in per_device(f"newest:{metric}", metric):
            if key in acc and math.isfinite(smp.value):
                acc[key].newest = _max(acc[key].newest, smp.value)
    for key, smp in per_device("disagree", GPU_UTIL):
        if key in acc and smp.value > 0:
            acc[key].disagree = True
    for key, smp in per_device("active", GPU_UTIL):
        if key in acc:
            for t in smp.times:
                acc[key].active.add(min(n - 1, int((window.end - t) // step)))
    for key, smp in per_device("fb_total", FB_FREE):
        if key in acc and math.isfinite(smp.value):
            acc[key].fb_total = _max(acc[key].fb_total, smp.value)
    energy_rows = answers.get("liveness:energy", ())
    if energy_rows:
        present.add(ENERGY)
    for key, smp in per_device("liveness:energy", ENERGY, report=True):
        a = acc.setdefault(key, _Acc())
        a.energy_delta = _max(a.energy_delta, smp.value)
    for key, smp in per_device("liveness:power", POWER):
        if key in acc:
            acc[key].power_delta = _max(acc[key].power_delta, smp.value)

    up_coverage: dict[str, float] = {}
    for smp in answers.get("up", ()):
        result = joiner.join(smp.labels)
        if result.node is not None:
            # Per-step union across several up series of one node cannot be computed in the server
            # (the node is known only here); the largest count is its lower bound — exact for the usual
            # one exporter target per node, and never an overstatement.
            share = min(1.0, smp.value / n)
            up_coverage[result.node] = max(up_coverage.get(result.node, 0.0), share)

    devices: dict[str, list[DeviceSignals]] = {}
    for key in sorted(k for k, a in acc.items() if a.is_activity_device):
        node, device, gi = key
        a = acc[key]
        sig = DeviceSignals(node=node, device=device, gpu_instance=gi)
        sig.mig_profile = a.profile
        sig.exporter = a.exporter or ""
        names = (PROF_ACTIVE,) if gi else (GPU_UTIL, PROF_ACTIVE)
        values = [a.activity[m] for m in names if m in a.activity]
        sig.activity_max_pct = max(values) if values else None
        sig.coverage = min(1.0, a.coverage_points / n)
        sig.activity_points = int(a.coverage_points)
        sig.active_steps = frozenset(a.active)
        sig.newest_sample = a.newest
        sig.signals_disagree = a.disagree and not gi
        non_finite = [m for m in names if m in a.non_finite]
        parent = acc.get((node, device, ""))
        fb = a if a.has_fb else parent
        if fb is not None and fb.has_fb:
            sig.has_fb = True
            sig.fb_used_max_mib = fb.fb_used
            sig.fb_total_mib = fb.fb_total
            non_finite.extend(m for m in (FB_USED, FB_FREE) if m in fb.non_finite)
        if parent is not None and parent.has_power:
            sig.has_power = True
            sig.power_max_w = parent.power
            if POWER in parent.non_finite:
                non_finite.append(POWER)
        if parent is not None and ENERGY in parent.non_finite:
            non_finite.append(ENERGY)
        sig.non_finite = tuple(non_finite)
        if parent is not None and parent.energy_delta is not None:
            sig.liveness = "moving" if parent.energy_delta > 0 else "frozen"
        elif parent is not None and parent.power is not None:
            sig.liveness = "moving" if (parent.power_delta or 0.0) > 0 else "frozen"
        devices.setdefault(node, []).append(sig)

    return CollectedSignals(
        devices=devices,
        up_coverage=up_coverage,
        unmapped=sorted(unmapped.values(), key=lambda u: (u.metric, sorted(u.labels.items()))),
        problems=tuple(sorted(problems)),
        present=frozenset(present - problems),
    )


def _mark_has(a: _Acc, metric: str) -> None:
    if metric == FB_USED:
        a.has_fb = True
    elif metric == POWER:
        a.has_power = True

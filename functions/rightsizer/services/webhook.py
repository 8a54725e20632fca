"""Webhook intake (docs/architecture.md §2 "The webhook is intake only", §4 "Webhook", §5 "Webhook (contract)").

One HTTP request from Alertmanager becomes, per alert: a started drain workflow (firing), a recorded
cancel of the node's lease epoch (resolved), a duplicate (seen before), or nothing (no node label, no
lease). The intake authenticates, validates, de-duplicates and starts or cancels; it never talks to
Kubernetes or Prometheus, so it answers within a second and needs no Kubernetes client. Whether the node
exists and is still idle is the workflow's first step (validate), which re-checks on fresh data.

Order of checks — each answers without doing the next:

1. ``Authorization: Bearer <token>`` compared in constant time; missing or wrong ⇒ **401**, before the
   body is decoded or parsed and before any backend is contacted.
   Several ``Authorization`` headers (in any case, or joined by a comma as Function URLs join repeats)
   never match: one request carries one credential.
2. Body size after base64 decoding (Function URL bodies may be base64) > 1 MiB ⇒ **413**.
3. JSON and the payload schema (:mod:`rightsizer.domain.alertmanager`) ⇒ **400**
   ``{"error": "malformed_json" | "invalid_payload" | "invalid_base64", "detail": str}``; more than
   ``MAX_ALERTS`` (500) alerts ⇒ **400** ``too_many_alerts`` before any of them is acted on, so one request
   does bounded work whatever it carries (set ``max_alerts: 500`` on the Alertmanager receiver: it then
   truncates instead, and ``truncatedAlerts`` is honoured).
4. A node label value that is not a DNS-1123 subdomain (``..``, ``a/b``, upper case, over 253
   characters) is ignored with reason ``invalid_node_name:<why>``: it cannot name a Node and never reaches
   the workflow.
5. Per alert, in payload order: firing ⇒ start a drain with a deterministic execution id; resolved ⇒
   ``request_cancel(node, lease.epoch)`` when a lease is held. Each alert runs at most once per
   ``[fingerprint, startsAt, status]`` (Powertools Idempotency, 7 days); a key in progress or completed
   is a duplicate.

Answer: **202** when at least one workflow started or one cancel was recorded, **200** when there was
nothing to do, **503** when an alert could not be handled (its idempotency key is released, so
Alertmanager's retry of the whole group handles it while the others come back as duplicates).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from pydantic import ValidationError

from rightsizer.domain.alertmanager import Alert, WebhookPayload, node_of
from rightsizer.domain.errors import ConfigError, RightsizerError, TransientError
from rightsizer.domain.names import DNS1123_SUBDOMAIN_MAX, dns1123_subdomain_problem
from rightsizer.domain.policy import DEFAULT_ALERT_NODE_LABELS
from rightsizer.services.approval import ApprovalDesk, LinkResponse
from rightsizer.state import LeaseStore

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer

    from rightsizer.ports import WorkflowStarter

__all__ = [
    "IDEMPOTENCY_EXPIRY_SECONDS",
    "IDEMPOTENCY_KEY_JMESPATH",
    "IDEMPOTENCY_KEY_PREFIX",
    "MAX_ALERTS",
    "MAX_BODY_BYTES",
    "AlertKey",
    "DuplicateGuard",
    "MemoryDuplicateGuard",
    "PowertoolsDuplicateGuard",
    "WebhookIntake",
    "WebhookRequest",
    "WebhookResponse",
    "alert_key",
    "bearer_token_matches",
    "decode_body",
    "execution_id_for",
    "parse_payload",
]

#: The AWS actions Powertools Idempotency calls for :class:`PowertoolsDuplicateGuard` (its items live in
#: the state table under ``idempotency#<function>``).
IAM_ACTIONS: Final = frozenset(
    {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"}
)

#: Largest accepted body, in bytes after base64 decoding (docs/architecture.md §5: 413 above 1 MiB).
MAX_BODY_BYTES: Final = 1_048_576
#: docs/architecture.md §4: per-alert de-duplication key, hash and lifetime (7 days, longer than any repeat_interval).
IDEMPOTENCY_KEY_JMESPATH: Final = "[fingerprint, startsAt, status]"
IDEMPOTENCY_HASH: Final = "sha256"
IDEMPOTENCY_EXPIRY_SECONDS: Final = 604_800
#: Sort-key prefix of idempotency items (``alert#<sha256>``). Fixed rather than Powertools' default
#: ``<function>.<module>.<qualname>`` so that renaming code never forgets what was already handled.
IDEMPOTENCY_KEY_PREFIX: Final = "alert"
#: Most alerts one request may carry (docs/architecture.md §5 "Webhook"); more ⇒ 400 ``too_many_alerts``.
MAX_ALERTS: Final = 500
#: Alerts of one notification handled at once (each is a DynamoDB write or two and a StartExecution).
ALERT_CONCURRENCY: Final = 8

JSON = dict[str, Any]
#: ``{"fingerprint": str, "startsAt": str, "status": str}`` — what the idempotency key is computed from.
AlertKey = dict[str, str]

log = logging.getLogger(__name__)


class LogSink(Protocol):
    """The logging calls the intake makes: a ``logging.Logger`` or a Powertools ``Logger`` (which adds
    the request's correlation id to every line)."""

    def info(self, msg: str, *args: Any) -> None:
        """An informational line."""

    def warning(self, msg: str, *args: Any) -> None:
        """Something the operator should see."""

    def exception(self, msg: str, *args: Any) -> None:
        """An error with the current exception's traceback."""


# --------------------------------------------------------------------------------------------------
# Request / response
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookRequest:
    """An HTTP request as a Lambda Function URL (payload format 2.0) delivers it.

    Attributes:
        headers: header names in any case (Function URLs lower-case them).
        body: the body as text, or base64 text when ``is_base64_encoded``; ``None`` when empty.
        is_base64_encoded: the Function URL's ``isBase64Encoded``.
        request_id: ``requestContext.requestId`` (the correlation id of the log lines).
        source_ip: ``requestContext.http.sourceIp`` (the address the Function URL saw; recorded with an
            approval link's decision).
    """

    headers: Mapping[str, str]
    body: str | None
    is_base64_encoded: bool = False
    request_id: str = ""
    source_ip: str = ""


@dataclass(frozen=True)
class WebhookResponse:
    """The HTTP answer: ``status_code`` and a JSON ``body``."""

    status_code: int
    body: JSON

    def to_function_url(self) -> JSON:
        """The Function URL (and API Gateway HTTP API) response: ``{statusCode, headers, body}``,
        ``body`` a JSON string."""
        return {
            "statusCode": self.status_code,
            "headers": {"content-type": "application/json"},
            "body": json.dumps(self.body, separators=(",", ":")),
        }


def _error(status: int, error: str, detail: str) -> WebhookResponse:
    return WebhookResponse(status, {"error": error, "detail": detail})


def _headers(headers: Mapping[str, str], name: str) -> list[str]:
    wanted = name.lower()
    return [value for key, value in headers.items() if key.lower() == wanted]


def bearer_token_matches(headers: Mapping[str, str], token: str) -> bool:
    """True when exactly one ``Authorization`` header is ``Bearer <token>`` (scheme case-insensitive,
    RFC 7235).

    Two ``Authorization`` headers (names differing in case), or one holding a comma (Function URLs join
    repeated headers with commas; a bearer token has none, RFC 6750 ``b64token``), never match: which of
    them counts would depend on the proxy in between. The comparison is ``hmac.compare_digest`` over UTF-8
    bytes: its time does not depend on how many leading characters match, so the token cannot be guessed
    one character at a time.
    """
    values = _headers(headers, "authorization")
    if len(values) != 1 or "," in values[0]:
        return False
    value = values[0]
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode("utf-8"), token.encode("utf-8"))


def decode_body(request: WebhookRequest) -> bytes:
    """The body's bytes (base64-decoded when the event says so).

    Raises:
        ValueError: ``isBase64Encoded`` with text that is not base64.
    """
    if not request.body:
        return b""
    if request.is_base64_encoded:
        try:
            return base64.b64decode(request.body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"body is not valid base64: {exc}") from exc
    return request.body.encode("utf-8")


def _describe(exc: ValidationError, limit: int = 5) -> str:
    # Locations and messages only: echoing input values would copy attacker-chosen text into logs.
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:limit]:
        where = ".".join(str(part) for part in err["loc"]) or "<root>"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"… and {more} more")
    return "; ".join(parts)


def parse_payload(body: bytes) -> WebhookPayload | WebhookResponse:
    """Parse an Alertmanager webhook body (version 4).

    Returns:
        The payload, or a 400 :class:`WebhookResponse` whose ``error`` is ``malformed_json`` (not JSON)
        or ``invalid_payload`` (JSON that is not a version 4 payload) and whose ``detail`` names the
        failing fields with pydantic's reason.
    """
    try:
        return WebhookPayload.model_validate_json(body)
    except ValidationError as exc:
        if any(err["type"] == "json_invalid" for err in exc.errors(include_url=False, include_input=False)):
            return _error(400, "malformed_json", _describe(exc))
        return _error(400, "invalid_payload", _describe(exc))


def alert_key(alert: Alert) -> AlertKey:
    """The data the idempotency key is computed from (``[fingerprint, startsAt, status]``).

    ``startsAt`` is canonical (UTC, µs) so that two spellings of one instant are one alert.
    """
    return {"fingerprint": alert.fingerprint, "startsAt": alert.starts_at_key, "status": alert.status}


def execution_id_for(alert: Alert) -> str:
    """The drain's execution id for a firing alert: ``alert-`` + 16 hex of sha256(fingerprint|startsAt).

    Deterministic, so one alert instance can never start two drains even if the idempotency items are
    lost: starting an execution id twice is a no-op (``WorkflowStarter.start``; Step Functions refuses
    a second execution of the same name). Valid as a Step Functions execution name.
    """
    digest = hashlib.sha256(f"{alert.fingerprint}|{alert.starts_at_key}".encode()).hexdigest()
    return f"alert-{digest[:16]}"


# --------------------------------------------------------------------------------------------------
# De-duplication port and its two implementations
# --------------------------------------------------------------------------------------------------


class DuplicateGuard(Protocol):
    """Runs an action at most once per alert key (docs/architecture.md §4: in progress or completed = duplicate)."""

    def once(self, key: AlertKey, action: Callable[[], JSON]) -> tuple[JSON, bool]:
        """Run ``action`` unless ``key`` was seen.

        Returns:
            ``(result, False)`` after running it now; ``(stored result or {}, True)`` for a duplicate.

        Raises:
            Whatever ``action`` raised — the key is then forgotten, so a retry runs it again.
            TransientError: the key store failed (retry later).
        """
        ...

    def bind_invocation(self, lambda_context: Any) -> None:
        """Note the current invocation (a Lambda context or ``None``) before :meth:`once` calls."""
        ...


class MemoryDuplicateGuard:
    """:class:`DuplicateGuard` in memory, thread-safe, without expiry: unit tests, ``serve`` without a
    table. Same semantics as :class:`PowertoolsDuplicateGuard`, minus durability."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[str, str, str], JSON | None] = {}  # None = in progress

    def once(self, key: AlertKey, action: Callable[[], JSON]) -> tuple[JSON, bool]:
        """See :meth:`DuplicateGuard.once`."""
        ident = (key["fingerprint"], key["startsAt"], key["status"])
        with self._lock:
            if ident in self._done:
                return self._done[ident] or {}, True
            self._done[ident] = None
        try:
            result = action()
        except BaseException:
            with self._lock:
                del self._done[ident]
            raise
        with self._lock:
            self._done[ident] = result
        return result, False

    def bind_invocation(self, lambda_context: Any) -> None:
        """Nothing to note: in-progress keys live as long as this process."""

    def seen(self) -> list[tuple[str, str, str]]:
        """Keys seen so far (fingerprint, startsAt, status), for tests."""
        with self._lock:
            return sorted(self._done)


@dataclass(frozen=True)
class _Replayed:
    """Marks a result Powertools returned from the store instead of running the function."""

    result: JSON


def _mark_replayed(response: Any, idempotent_data: Any) -> Any:
    return _Replayed(response if isinstance(response, dict) else {})


def _run_action(*, alert: AlertKey, action: Callable[[], JSON]) -> JSON:
    # ``alert`` only feeds the idempotency key (Powertools hashes the keyword it is told to).
    return action()


class PowertoolsDuplicateGuard:
    """:class:`DuplicateGuard` on Powertools Idempotency (``idempotent_function``).

    Items live in the state table (``DynamoDBPersistenceLayer(key_attr="pk", sort_key_attr="sk",
    expiry_attr="ttl")``, ``pk`` = ``idempotency#<function>``, ``sk`` = ``alert#<sha256 of the key>``)
    for 7 days. When the invocation's Lambda context is bound, an in-progress item expires with the
    invocation, so an alert whose handling crashed is retried on the next delivery instead of blocking
    for 7 days; the deterministic execution id keeps that retry from starting a second drain.

    Args:
        persistence_store: a Powertools persistence layer (DynamoDB in production and tests).
    """

    def __init__(self, persistence_store: BasePersistenceLayer) -> None:
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

        self.config = IdempotencyConfig(
            event_key_jmespath=IDEMPOTENCY_KEY_JMESPATH,
            hash_function=IDEMPOTENCY_HASH,
            expires_after_seconds=IDEMPOTENCY_EXPIRY_SECONDS,
            raise_on_no_idempotency_key=True,
            response_hook=_mark_replayed,
        )
        self._run: Callable[..., Any] = idempotent_function(
            _run_action,
            data_keyword_argument="alert",
            persistence_store=persistence_store,
            config=self.config,
            key_prefix=IDEMPOTENCY_KEY_PREFIX,
        )

    def bind_invocation(self, lambda_context: Any) -> None:
        """Register the Lambda context (Powertools reads its remaining time for in-progress expiry).

        One config serves every thread of ``serve``; their contexts carry similar deadlines, so the
        last one bound is as good as any.
        """
        if lambda_context is not None:
            self.config.register_lambda_context(lambda_context)

    def once(self, key: AlertKey, action: Callable[[], JSON]) -> tuple[JSON, bool]:
        """See :meth:`DuplicateGuard.once`; ``IdempotencyAlreadyInProgressError`` counts as a duplicate."""
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyAlreadyInProgressError,
            IdempotencyPersistenceLayerError,
        )

        try:
            result = self._run(alert=key, action=action)
        except IdempotencyAlreadyInProgressError:
            return {}, True
        except IdempotencyPersistenceLayerError as exc:
            raise TransientError(f"idempotency store: {exc}", retry_after=5.0) from exc
        if isinstance(result, _Replayed):
            return result.result, True
        return result, False


# --------------------------------------------------------------------------------------------------
# The intake
# --------------------------------------------------------------------------------------------------


@dataclass
class _Summary:
    started: list[JSON] = field(default_factory=list)
    cancelled: list[JSON] = field(default_factory=list)
    duplicates: int = 0
    ignored: list[JSON] = field(default_factory=list)
    failed: list[JSON] = field(default_factory=list)

    def response(self, truncated: int) -> WebhookResponse:
        body = {
            "started": self.started,
            "cancelled": self.cancelled,
            "duplicates": self.duplicates,
            "ignored": self.ignored,
            "failed": self.failed,
            "truncated_alerts": truncated,
        }
        if self.failed:
            return WebhookResponse(503, body)
        return WebhookResponse(202 if self.started or self.cancelled else 200, body)


class WebhookIntake:
    """Turns Alertmanager notifications into drain starts and cancels (see the module docstring).

    Args:
        token: the bearer token Alertmanager sends (non-empty; fail closed otherwise), or a provider of it
            asked on every request (a rotation takes effect without a new intake).
        starter: starts drain workflows (Step Functions, or the in-process runner for ``serve``).
        leases: node leases (``get`` and ``request_cancel`` only).
        guard: per-alert de-duplication.
        node_labels: alert labels that may carry the node name, first present wins (policy
            ``alert_node_labels``).
        logger: where log lines go (a Powertools ``Logger`` adds the correlation id).
        max_body_bytes: the 413 limit, bytes after base64 decoding.
        max_alerts: the most alerts one request may carry (400 ``too_many_alerts`` above).
        approvals: decides approval requests from their signed links (path ``/approval``); None: 404.

    Raises:
        ConfigError: an empty token.
    """

    def __init__(
        self,
        *,
        token: str | Callable[[], str],
        starter: WorkflowStarter,
        leases: LeaseStore,
        guard: DuplicateGuard,
        node_labels: Sequence[str] = DEFAULT_ALERT_NODE_LABELS,
        logger: LogSink | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_alerts: int = MAX_ALERTS,
        approvals: ApprovalDesk | None = None,
    ) -> None:
        # A provider is asked on every request (``adapters.secrets.CachedSecret``: a rotated token is
        # accepted within minutes); it is asked once here so a missing token fails closed at once.
        self._token = token if callable(token) else (lambda: token)
        if not self._token():
            raise ConfigError(
                "the webhook token is empty; refusing every request would be silent",
                field="webhook.token_secret",
            )
        self.starter = starter
        self.leases = leases
        self.guard = guard
        self.node_labels = tuple(node_labels)
        self.log: LogSink = logger if logger is not None else log
        self.max_body_bytes = max_body_bytes
        self.max_alerts = max_alerts
        self.approvals = approvals

    def authenticates(self, headers: Mapping[str, str]) -> bool:
        """True when ``headers`` carry the bearer token (:func:`bearer_token_matches`): ``serve`` asks this
        before it reads a body, so an unauthenticated sender never holds a worker for its body."""
        return bearer_token_matches(headers, self._token())

    def handle(self, request: WebhookRequest, *, lambda_context: Any = None) -> WebhookResponse:
        """Answer one webhook request.

        Returns:
            401 ``{"error": "unauthorized"}`` — missing or wrong bearer token (nothing else looked at);
            413 ``{"error": "payload_too_large"}`` — more than ``max_body_bytes`` after decoding;
            400 ``{"error": "malformed_json" | "invalid_payload" | "invalid_base64" | "too_many_alerts",
            "detail"}``;
            202 / 200 / 503 with ``{"started": [{"node", "execution_id", "fingerprint"}],
            "cancelled": [{"node", "epoch", "fingerprint"}], "duplicates": int,
            "ignored": [{"fingerprint", "node", "reason"}], "failed": [{"fingerprint", "node", "error"}],
            "truncated_alerts": int}`` (see :meth:`process`).
        """
        if not self.authenticates(request.headers):
            self.log.warning("webhook: missing or wrong bearer token")
            return _error(401, "unauthorized", "missing or wrong bearer token")
        try:
            body = decode_body(request)
        except ValueError as exc:
            return _error(400, "invalid_base64", str(exc))
        if len(body) > self.max_body_bytes:
            self.log.warning("webhook: body of %d bytes refused (limit %d)", len(body), self.max_body_bytes)
            return _error(
                413, "payload_too_large", f"body is {len(body)} bytes; the limit is {self.max_body_bytes}"
            )
        parsed = parse_payload(body)
        if isinstance(parsed, WebhookResponse):
            self.log.warning("webhook: %s: %s", parsed.body["error"], parsed.body["detail"])
            return parsed
        if len(parsed.alerts) > self.max_alerts:
            detail = (
                f"{len(parsed.alerts)} alerts in one request; the limit is {self.max_alerts} "
                f"(set max_alerts: {self.max_alerts} on the Alertmanager webhook receiver)"
            )
            self.log.warning("webhook: too_many_alerts: %s", detail)
            return _error(400, "too_many_alerts", detail)
        self.guard.bind_invocation(lambda_context)
        return self.process(parsed)

    def handle_approval(self, method: str, query: str, request: WebhookRequest) -> LinkResponse:
        """Answer an approval link (``GET``/``POST /approval?token=…``): authenticated by the link's
        signed token, not by the bearer token (:meth:`rightsizer.services.approval.ApprovalDesk.handle_link`:
        401 forged or expired, 409 reused, 404 unknown)."""
        if self.approvals is None:
            return LinkResponse(404, "approval links are not served here")
        try:
            body = decode_body(request)
        except ValueError:
            body = b""
        if len(body) > 8192:
            return LinkResponse(413, "body too large")
        source = f"{request.source_ip or 'an unknown address'} (request {request.request_id or 'unknown'})"
        answer = self.approvals.handle_link(method, query, body.decode("utf-8", "replace"), source=source)
        self.log.info("webhook: approval link %s -> %d", method, answer.status_code)
        return answer

    def process(self, payload: WebhookPayload) -> WebhookResponse:
        """Act on every alert present, each by its own status (never the group's).

        With ``truncatedAlerts > 0`` the missing alerts are neither resolved nor firing: they keep their
        state until the next assessment reconciles (BUG-12); the count is logged and returned.

        Returns:
            202 when a workflow was started or a cancel recorded; 200 when there was nothing to do
            (duplicates, no node label, resolved without a lease); 503 when an alert failed (retry).
        """
        if payload.truncated_alerts:
            self.log.warning(
                "webhook: notification truncated by max_alerts: %d alerts not sent (group %s); "
                "acting on the %d present, the next assessment reconciles the rest",
                payload.truncated_alerts,
                payload.group_key,
                len(payload.alerts),
            )
        summary = _Summary()
        work: list[tuple[Alert, str]] = []
        for alert in payload.alerts:
            node = node_of(alert.labels, self.node_labels)
            problem = None if node is None else dns1123_subdomain_problem(node)
            if node is None:
                summary.ignored.append(
                    {"fingerprint": alert.fingerprint, "node": None, "reason": "no_node_label"}
                )
            elif problem is not None:
                summary.ignored.append(
                    {
                        "fingerprint": alert.fingerprint,
                        "node": node[:DNS1123_SUBDOMAIN_MAX],
                        "reason": f"invalid_node_name:{problem}",
                    }
                )
            else:
                work.append((alert, node))
        for outcome in self._run_all(work):
            self._tally(summary, outcome)
        response = summary.response(payload.truncated_alerts)
        self.log.info(
            "webhook: %d started, %d cancelled, %d duplicates, %d ignored, %d failed -> %d",
            len(summary.started),
            len(summary.cancelled),
            summary.duplicates,
            len(summary.ignored),
            len(summary.failed),
            response.status_code,
        )
        return response

    def _run_all(self, work: list[tuple[Alert, str]]) -> Iterable[JSON]:
        if len(work) <= 1:
            return [self._one(alert, node) for alert, node in work]
        # Alerts are independent (one node each); concurrency keeps a large group within the 1 s target.
        with ThreadPoolExecutor(max_workers=min(ALERT_CONCURRENCY, len(work))) as pool:
            return list(pool.map(lambda item: self._one(*item), work))

    def _one(self, alert: Alert, node: str) -> JSON:
        action = (
            (lambda: self._start(alert, node))
            if alert.status == "firing"
            else (lambda: self._cancel(alert, node))
        )
        try:
            result, duplicate = self.guard.once(alert_key(alert), action)
        except RightsizerError as exc:
            self.log.warning("webhook: alert %s (node %s) failed: %s", alert.fingerprint, node, exc)
            return {"outcome": "failed", "fingerprint": alert.fingerprint, "node": node, "error": str(exc)}
        except Exception as exc:  # one alert's failure must not drop the others of the group
            self.log.exception("webhook: alert %s (node %s) failed", alert.fingerprint, node)
            return {
                "outcome": "failed",
                "fingerprint": alert.fingerprint,
                "node": node,
                "error": type(exc).__name__,
            }
        if duplicate:
            self.log.info(
                "webhook: alert %s (%s, node %s) is a duplicate", alert.fingerprint, alert.status, node
            )
            return {"outcome": "duplicate", "fingerprint": alert.fingerprint, "node": node}
        return result

    def _start(self, alert: Alert, node: str) -> JSON:
        # The drain service (planner, placement, node views) loads with the first alert that starts a
        # drain, not at the webhook's cold start (issue 33): 401s, 400s and resolved alerts never need it.
        from rightsizer.services.drain import DrainRequest

        request = DrainRequest(
            node=node, execution_id=execution_id_for(alert), trigger=f"alert:{alert.fingerprint}"
        )
        execution_id = self.starter.start(request)
        self.log.info(
            "webhook: alert %s: drain of node %s started as %s", alert.fingerprint, node, execution_id
        )
        return {
            "outcome": "started",
            "node": node,
            "execution_id": execution_id,
            "fingerprint": alert.fingerprint,
        }

    def _cancel(self, alert: Alert, node: str) -> JSON:
        lease = self.leases.get(node)
        # The cancel names the epoch read here: a drain that took the lease since then is a new decision
        # and is not stopped by an older alert (request_cancel refuses another epoch).
        if lease is not None and self.leases.request_cancel(node, lease.epoch):
            self.log.info(
                "webhook: alert %s resolved: cancel recorded for node %s epoch %d",
                alert.fingerprint,
                node,
                lease.epoch,
            )
            return {
                "outcome": "cancelled",
                "node": node,
                "epoch": lease.epoch,
                "fingerprint": alert.fingerprint,
            }
        return {"outcome": "ignored", "node": node, "fingerprint": alert.fingerprint, "reason": "no_lease"}

    @staticmethod
    def _tally(summary: _Summary, outcome: JSON) -> None:
        kind = outcome.get("outcome")
        entry = {k: v for k, v in outcome.items() if k != "outcome"}
        if kind == "started":
            summary.started.append(entry)
        elif kind == "cancelled":
            summary.cancelled.append(entry)
        elif kind == "duplicate":
            summary.duplicates += 1
        elif kind == "failed":
            summary.failed.append(entry)
        else:
            summary.ignored.append(entry)

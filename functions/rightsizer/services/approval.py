"""Human approval of a drain (docs/architecture.md §4 "Approval"): request, decide, snooze.

With policy ``approval: required`` (or a node group's override) a validated drain does not cordon: it
opens an :class:`~rightsizer.state.ApprovalRequest`, publishes it (node, verdict, reasons, savings, and
approve / reject / snooze links on the webhook's Function URL, each a signed, expiring token —
:mod:`rightsizer.domain.approval`) and waits: in Step Functions at a task token
(``lambda:invoke.waitForTaskToken``), in process by polling. A person decides once:

- through a link (:meth:`ApprovalDesk.handle_link`, served by the webhook): GET shows the request and a
  confirmation button, POST decides — a mail scanner that fetches links cannot decide anything;
- from the CLI with their own AWS credentials (``rightsizer approve|reject|snooze``).

The decision is one conditional write (single use); then the waiting task is woken (SendTaskSuccess on
approve, SendTaskFailure otherwise). The workflow's ``approval`` step reads the stored decision — never the
wake-up — so a lost callback or a timeout ends the same way: approved → cordon; anything else →
abandoned with nothing cordoned. A snooze also keeps the node ``protected`` (``snoozed:until:<t>``) in
every plan until it ends.
"""

from __future__ import annotations

import html
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol
from urllib.parse import parse_qs, urlencode

from rightsizer.domain.approval import (
    ACTIONS,
    ApprovalAction,
    ApprovalClaims,
    TokenExpired,
    TokenInvalid,
    sign_token,
    verify_token,
)
from rightsizer.domain.holds import stamp
from rightsizer.domain.policy import MAX_SNOOZE_S
from rightsizer.ports import ClusterWriter
from rightsizer.state import ApprovalRequest, ApprovalStatus, ApprovalStore

log = logging.getLogger(__name__)

__all__ = [
    "APPROVAL_EVENTS",
    "APPROVAL_PATH",
    "ApprovalDesk",
    "ApprovalGate",
    "ApprovalNotifier",
    "Decision",
    "LinkKey",
    "LinkResponse",
    "TaskCallback",
    "approval_event",
    "approval_message",
    "current_key",
    "tell_cluster",
]

#: The Function URL path of approval links.
APPROVAL_PATH: Final = "/approval"
_STATUS_OF: Final[dict[ApprovalAction, ApprovalStatus]] = {
    "approve": "approved",
    "reject": "rejected",
    "snooze": "snoozed",
}
#: Step Functions ``Error`` names of a refused approval (SendTaskFailure).
TASK_ERRORS: Final = {"rejected": "ApprovalRejected", "snoozed": "ApprovalSnoozed"}


class ApprovalNotifier(Protocol):
    """Where approval requests go (the stack's SNS topic: e-mail, AWS Chatbot)."""

    def publish(self, subject: str, message: str) -> None:
        """Publish one message (subject ≤ 100 characters)."""
        ...


class TaskCallback(Protocol):
    """Wakes a Step Functions task waiting on a token (SendTaskSuccess / SendTaskFailure)."""

    def succeed(self, task_token: str, output: Mapping[str, Any]) -> bool:
        """True when delivered; False when the task is gone (timed out, execution ended)."""
        ...

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        """True when delivered; False when the task is gone."""
        ...


def _stamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _for_duration(seconds: int) -> str:
    """``1800`` -> ``30m``, ``5400`` -> ``1h30m``: the form ``rightsizer snooze --for`` parses back."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"


def approval_message(
    cluster: str, request: ApprovalRequest, links: Mapping[str, str], snooze_seconds: int
) -> tuple[str, str]:
    """The notification of ``request``: (subject ≤ 100 characters, plain-text body).

    The body names the node, its verdict and reasons, node group, instance, USD/h and USD/month saved,
    the deadline, the links (when the webhook URL and key are known) and the CLI commands.
    """
    d = request.details
    hourly = d.get("hourly_savings_usd")
    saving = "unknown" if hourly is None else f"{hourly:.3f} USD/h ({hourly * 730:.0f} USD/month)"
    lines = [
        f"GPU Rightsizer asks for approval to drain and remove node {request.node} (cluster {cluster}).",
        "",
        f"Verdict:     {d.get('verdict', 'unknown')}",
        f"Reasons:     {', '.join(d.get('reasons', [])) or '-'}",
        f"Node group:  {d.get('node_group') or '-'}   instance {d.get('instance_id') or '-'}"
        f" ({d.get('instance_type') or '-'})",
        f"Saves:       {saving}",
        f"Execution:   {request.execution_id}",
        f"Decide by:   {_stamp(request.expires_at)} (unanswered, the drain is abandoned, nothing cordoned)",
        "",
    ]
    if links:
        lines += [
            f"Approve: {links['approve']}",
            f"Reject:  {links['reject']}",
            f"Snooze {_for_duration(snooze_seconds)}: {links['snooze']}",
            "",
            "Each link opens a confirmation page; a link works once and expires with the request.",
        ]
    lines += [
        "From a shell with AWS credentials for this account:",
        f"  rightsizer approve {request.execution_id} --stack <stack>",
        f"  rightsizer reject  {request.execution_id} --stack <stack>",
        f"  rightsizer snooze  {request.execution_id} --for {_for_duration(snooze_seconds)} --stack <stack>",
    ]
    subject = f"GPU Rightsizer: approve removal of {request.node}"[:100]
    return subject, "\n".join(lines)


#: Kubernetes Event ``reason`` per approval outcome (CamelCase, as the drain's other Events), and whether it
#: is a Warning: what happened to the request, on the Node it is about.
APPROVAL_EVENTS: Final[Mapping[str, tuple[str, bool]]] = {
    "requested": ("ApprovalRequested", False),
    "approved": ("ApprovalGranted", False),
    "rejected": ("ApprovalRejected", False),
    "snoozed": ("ApprovalSnoozed", False),
    "expired": ("ApprovalTimedOut", True),
    "unpublished": ("ApprovalRequestFailed", True),
}


def approval_event(outcome: str, execution_id: str, request: ApprovalRequest | None) -> tuple[str, str, bool]:
    """The Event of an approval outcome: (reason, message, warning).

    Args:
        outcome: a key of :data:`APPROVAL_EVENTS` (``requested`` when the request was published,
            ``unpublished`` when it never was; else the request's decided status).
        execution_id: the waiting drain, named in the message.
        request: the request as stored (who decided, the deadline, the snooze's end), if any.

    Raises:
        KeyError: an unknown ``outcome``.
    """
    reason, warning = APPROVAL_EVENTS[outcome]
    by = (request.decided_by if request else None) or "a person"
    text = {
        "requested": "rightsizer asks a person to approve draining the node",
        "approved": f"{by} approved draining the node",
        "rejected": f"{by} rejected draining the node",
        "snoozed": f"{by} snoozed the node's removal"
        + (f" until {stamp(request.snooze_until)}" if request and request.snooze_until else ""),
        "expired": "nobody approved draining the node in time",
        "unpublished": "rightsizer could not ask for approval to drain the node",
    }[outcome]
    if outcome == "requested":
        then = f"; unanswered by {stamp(request.expires_at)} it is abandoned" if request else ""
    else:
        then = "" if outcome == "approved" else "; the drain is abandoned, nothing was cordoned"
    return reason, f"{text} ({execution_id}){then}", warning


def tell_cluster(
    cluster: ClusterWriter, node: str, outcome: str, execution_id: str, request: ApprovalRequest | None
) -> None:
    """Record the Event of an approval ``outcome`` on ``node`` (:func:`approval_event`; best effort, as
    every Event: ``ClusterWriter.emit_event`` never raises)."""
    reason, message, warning = approval_event(outcome, execution_id, request)
    cluster.emit_event(node, reason, message, warning=warning)


#: An approval-link HMAC key, or a provider of the current one (a cached, rotatable secret).
LinkKey = bytes | Callable[[], bytes]


def current_key(key: LinkKey | None) -> bytes | None:
    """The key now: ``key`` itself, or what its provider answers."""
    return key() if callable(key) else key


@dataclass
class ApprovalGate:
    """The workflow's side: open and publish a request, read the decision.

    Args:
        cluster: the cluster (in tokens and messages).
        store: approval requests and snoozes.
        notifier: where requests are published (``None``: logged only).
        key: the HMAC key of links (:func:`rightsizer.domain.approval.derive_key` of the link-key secret),
            or a provider of it asked per request (a rotated key signs the next links); ``None``: no links.
        base_url: the webhook's Function URL; ``None``: no links (the CLI still decides).
    """

    cluster: str
    store: ApprovalStore
    notifier: ApprovalNotifier | None = None
    key: LinkKey | None = None
    base_url: str | None = None

    def links(self, request: ApprovalRequest, snooze_seconds: int) -> dict[str, str]:
        """approve / reject / snooze URLs of ``request`` (empty without key or base URL)."""
        key = current_key(self.key)
        if key is None or not self.base_url:
            return {}
        out: dict[str, str] = {}
        for action in ACTIONS:
            claims = ApprovalClaims(
                action=action,
                cluster=self.cluster,
                execution_id=request.execution_id,
                nonce=request.nonce,
                expires_at=int(request.expires_at.timestamp()),
                snooze_seconds=snooze_seconds if action == "snooze" else 0,
            )
            query = urlencode({"token": sign_token(key, claims)})
            out[action] = f"{self.base_url.rstrip('/')}{APPROVAL_PATH}?{query}"
        return out

    def open(
        self,
        execution_id: str,
        node: str,
        details: Mapping[str, Any],
        *,
        now: datetime,
        expires_at: datetime,
        snooze_seconds: int,
        task_token: str | None,
    ) -> tuple[ApprovalRequest, bool]:
        """Open (or re-enter) the request of ``execution_id`` and publish it once.

        A request that exists keeps its nonce and deadline and gets ``task_token``; it is published
        again only if its first publication did not complete.

        Returns:
            The request as stored, and whether this call published it (the caller tells the cluster once).
        """
        request = self.store.open_approval(
            ApprovalRequest(
                execution_id=execution_id,
                node=node,
                nonce=secrets.token_urlsafe(16),
                requested_at=now,
                expires_at=expires_at,
                task_token=task_token,
                details=dict(details),
            )
        )
        published = not request.notified and request.status == "pending"
        if published:
            subject, message = approval_message(
                self.cluster, request, self.links(request, snooze_seconds), snooze_seconds
            )
            if self.notifier is not None:
                self.notifier.publish(subject, message)
                # The links are credentials (single use, expiring): they go to the topic, not to the logs.
                log.warning("approval requested for %s (%s), published", node, execution_id)
            else:  # in process without a topic, the log is where the operator reads the request (its
                # links' tokens are redacted there like every credential; the CLI commands it names decide)
                log.warning("approval requested for %s (%s):\n%s", node, execution_id, message)
            self.store.mark_notified(execution_id)
        return request, published


@dataclass(frozen=True)
class Decision:
    """The outcome of one decision attempt: HTTP-like ``status`` (200 decided, 401 bad link, 404 no
    such request, 409 decided before or expired), ``outcome`` code and the request as stored."""

    status: int
    outcome: str
    request: ApprovalRequest | None = None
    detail: str = ""


@dataclass(frozen=True)
class LinkResponse:
    """The webhook's answer to an approval link: status code and an HTML page."""

    status_code: int
    body: str

    def to_function_url(self) -> dict[str, Any]:
        """The Function URL response (HTML; never cached, never framed)."""
        return {
            "statusCode": self.status_code,
            "headers": {
                "content-type": "text/html; charset=utf-8",
                "cache-control": "no-store",
                "x-frame-options": "DENY",
                "referrer-policy": "no-referrer",
            },
            "body": self.body,
        }


def _page(title: str, text: str, form: str = "") -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>GPU Rightsizer</title></head><body>"
        f"<h1>{html.escape(title)}</h1><pre>{html.escape(text)}</pre>{form}</body></html>"
    )


@dataclass
class ApprovalDesk:
    """Decides approval requests once, and wakes the waiting task.

    Args:
        cluster: the cluster whose requests this desk decides (a link for another cluster is refused).
        store: approval requests and snoozes.
        callback: Step Functions callbacks (``None`` in process: the runner polls the store).
        key: the HMAC key of links, or a provider of it asked per link (``None``: links are refused with
            401; the CLI needs none).
        clock: aware UTC now.
    """

    cluster: str
    store: ApprovalStore
    callback: TaskCallback | None = None
    key: LinkKey | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def decide(
        self,
        execution_id: str,
        action: ApprovalAction,
        *,
        by: str,
        nonce: str | None = None,
        snooze_seconds: int = 0,
    ) -> Decision:
        """Decide ``execution_id``'s pending request: ``approve``, ``reject`` or ``snooze`` (reject, and
        keep the node out of plans for ``snooze_seconds``).

        Returns:
            200 ``approved|rejected|snoozed``; 404 ``not_found``; 409 ``already_<status>`` or
            ``expired``; 401 ``forged`` (a link naming another request's nonce).
        """
        now = self.clock().astimezone(UTC)
        status = _STATUS_OF[action]
        if action == "snooze" and not 0 < snooze_seconds <= MAX_SNOOZE_S:
            return Decision(
                400, "bad_snooze", None, f"a snooze lasts more than 0s and at most {MAX_SNOOZE_S // 86400}d"
            )
        until = now + timedelta(seconds=snooze_seconds) if action == "snooze" else None
        decided = self.store.decide_approval(
            execution_id, status, by=by, now=now, nonce=nonce, snooze_until=until
        )
        if decided is None:
            current = self.store.get_approval(execution_id)
            if current is None:
                return Decision(404, "not_found", None, f"no approval request for {execution_id}")
            if current.status != "pending":
                return Decision(409, f"already_{current.status}", current, "decided before")
            if nonce is not None and current.nonce != nonce:
                return Decision(401, "forged", None, "the link does not match the request")
            return Decision(409, "expired", current, f"the request expired at {_stamp(current.expires_at)}")
        if until is not None:
            self.store.snooze(decided.node, until, by=by, now=now)
        self._wake(decided)
        log.warning("approval of %s (%s): %s by %s", decided.node, execution_id, status, by)
        return Decision(200, status, decided)

    def _wake(self, request: ApprovalRequest) -> None:
        if self.callback is None or not request.task_token:
            return
        if request.status == "approved":
            delivered = self.callback.succeed(
                request.task_token, {"decision": "approved", "by": request.decided_by}
            )
        else:
            delivered = self.callback.fail(
                request.task_token, TASK_ERRORS.get(request.status, "ApprovalRejected"),
                f"{request.status} by {request.decided_by}",
            )  # fmt: skip
        if not delivered:
            # The wait already ended (timeout): its approval step reads the store and abandons.
            log.warning("approval of %s: the waiting task is gone", request.execution_id)

    def handle_link(self, method: str, query: str, body: str | None, *, source: str = "") -> LinkResponse:
        """Answer a link of an approval request (``GET``: show it with a confirm button; ``POST``: decide).

        The decider recorded is the link and where its request came from: ``link from <source>``
        (``source``: the request's address and request id), never a name the request declares.

        Returns:
            200 the page; 401 a forged, altered or expired token (documented choice: expired is 401, not
            410); 404 no such request; 409 decided before (a reused link) or expired; 405 another method.
        """
        if method not in ("GET", "POST"):
            return LinkResponse(405, _page("Method not allowed", "Use the link from the message."))
        fields = parse_qs(body or "") if method == "POST" else parse_qs(query or "")
        token = (fields.get("token") or [""])[0]
        key = current_key(self.key)
        if key is None:
            return LinkResponse(401, _page("Link not accepted", "Approval links are not configured."))
        now = self.clock().astimezone(UTC)
        try:
            claims = verify_token(key, token, now.timestamp())
        except TokenExpired:
            return LinkResponse(401, _page("Link expired", "This approval link has expired."))
        except TokenInvalid:
            return LinkResponse(401, _page("Link not accepted", "This is not a valid approval link."))
        if claims.cluster != self.cluster:
            return LinkResponse(401, _page("Link not accepted", "This link is for another cluster."))
        request = self.store.get_approval(claims.execution_id)
        if request is None or request.nonce != claims.nonce:
            return LinkResponse(404, _page("Not found", "No such approval request."))
        if request.status != "pending":
            return LinkResponse(
                409, _page("Already decided", f"This request was {request.status} by {request.decided_by}.")
            )
        summary = (
            f"{claims.action} the drain of node {request.node}\n"
            f"verdict {request.details.get('verdict')}, reasons {', '.join(request.details.get('reasons', []))}"
        )
        if method == "GET":
            form = (
                f"<form method='post' action='{APPROVAL_PATH}'>"
                f"<input type='hidden' name='token' value='{html.escape(token, quote=True)}'>"
                f"<button type='submit'>Confirm: {html.escape(claims.action)}</button></form>"
            )
            return LinkResponse(200, _page(f"Confirm {claims.action}", summary, form))
        decision = self.decide(
            claims.execution_id,
            claims.action,
            by=f"link from {source or 'an unknown source'}",
            nonce=claims.nonce,
            snooze_seconds=claims.snooze_seconds,
        )
        if decision.status != 200:
            return LinkResponse(decision.status, _page("Not done", f"{decision.outcome}: {decision.detail}"))
        return LinkResponse(200, _page(f"Done: {decision.outcome}", summary))

"""The Node reads and the writes a drain makes through the Kubernetes API (``ClusterWriter``): cordon,
uncordon, policy/v1 Eviction and Events on Nodes, over :class:`KubernetesTransport`.

:class:`rightsizer.adapters.kubernetes.KubernetesCluster` is the one class callers use; it adds the
paginated reads to this one. RBAC verbs: ``get``/``patch`` on ``nodes``, ``create`` on ``pods/eviction``
and ``events`` (docs/architecture.md §5, ``infra/k8s/rbac.yaml``). IAM actions: none.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

from rightsizer.adapters.kubernetes_errors import (
    ApiAnswer,
    KubernetesAccessError,
    eviction_retry_after,
    namespace_terminating,
    status_text,
)
from rightsizer.adapters.kubernetes_rbac import remedy_403
from rightsizer.adapters.kubernetes_transport import KubernetesTransport, client_module
from rightsizer.domain.errors import PermanentError, StalePlan
from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY
from rightsizer.domain.names import dns1123_label_problem, dns1123_subdomain_problem
from rightsizer.ports import JSON, AccessCheck, EvictionOutcome

__all__ = [
    "EVENT_COMPONENT",
    "EVENT_NAMESPACE",
    "KubernetesNodeWrites",
    "checked_name",
    "require_utc_rfc3339",
]

log = logging.getLogger(__name__)


def checked_name(name: str, *, namespace: str | None = None) -> str:
    """``name`` when it is a valid object name (DNS-1123 subdomain; ``namespace`` a DNS-1123 label).

    A request path or field selector is built only from names the API server could have issued: ``..``
    would address another API path, a comma another field selector (issue 14).

    Raises:
        PermanentError: the name (or namespace) is not valid; no request is made.
    """
    problem = dns1123_subdomain_problem(name)
    if problem is None and namespace is not None:
        problem = dns1123_label_problem(namespace)
    if problem is not None:
        raise PermanentError(
            f"refusing an invalid object name {name[:64]!r} ({problem}): no request was made"
        )
    return name


#: Node Events live in ``default``: the API server accepts an Event about a cluster-scoped object only
#: in ``default`` (or ``kube-system``), and ``kubectl describe node`` looks there.
EVENT_NAMESPACE: Final = "default"
#: ``source.component`` and ``reportingComponent`` of every Event we write (docs/architecture.md §4).
EVENT_COMPONENT: Final = "rightsizer"
#: The API server keeps Event messages short (events.k8s.io ``note``: 1 kB); longer ones are cut here.
_EVENT_MESSAGE_LIMIT: Final = 1024
_MERGE_PATCH: Final = "application/merge-patch+json"


def require_utc_rfc3339(value: str) -> str:
    """Validate ``value`` as an RFC 3339 instant in UTC and return it unchanged (cordoned-at, docs/architecture.md §4).

    The adapter and ``testing.fakes`` both check a cordon's ``at`` with this one rule.

    Raises:
        ValueError: not RFC 3339, or naive / not UTC.
    """
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"cordoned-at must be RFC 3339, got {value!r}") from exc
    if parsed.utcoffset() != timedelta(0):  # None (naive) or another offset
        raise ValueError(f"cordoned-at must be in UTC, got {value!r}")
    return value


def _reporting_instance() -> str:
    # Required by the API server whenever eventTime is set; in Lambda the host name changes per sandbox,
    # which is what "instance" means here.
    return f"{EVENT_COMPONENT}-{socket.gethostname()}"[:128]


class KubernetesNodeWrites(KubernetesTransport):
    """Node reads by name and the drain's writes (cordon, uncordon, Eviction, Events); see the module
    docstring. ``_clock`` (aware "now" for Event timestamps) is set by the subclass's constructor."""

    _clock: Callable[[], datetime]

    def get_node(self, name: str) -> JSON | None:
        """The Node named exactly ``name`` (``GET /api/v1/nodes/{name}``, uncached), or None on 404.

        Raises:
            PermanentError: ``name`` is not a DNS-1123 subdomain (no request is made), or 403.
        """
        checked_name(name)
        answer = self._call(
            AccessCheck("get", "nodes"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .read_node(name, _preload_content=False, _request_timeout=self._timeout)
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def cordon(self, node: str, execution_id: str, at: str) -> JSON:
        """Cordon ``node`` for ``execution_id``: one JSON merge patch (``PATCH /api/v1/nodes/{name}``) that
        sets ``spec.unschedulable=true`` and the annotations ``rightsizer.io/cordoned-by=<execution_id>`` and
        ``rightsizer.io/cordoned-at=<at>``, guarded by the ``metadata.resourceVersion`` of a fresh GET.

        Args:
            node: the Node's exact name.
            execution_id: the drain workflow's execution id (the annotation value).
            at: RFC 3339 instant in UTC (``2024-05-14T10:00:00Z``).

        Returns:
            The Node as patched; the Node as read, without a write, when it already carries our
            annotation for this execution and is unschedulable (a resumed step).

        Raises:
            StalePlan: ``node_not_found``; ``cordoned_by_other`` (unschedulable without our annotation
                for this execution — a person's or another execution's cordon is never adopted);
                ``uncordoned_by_other`` (our annotation is there but someone made the node schedulable
                again: a person undid our cordon); ``node_changed`` (409: the node changed between our
                GET and our PATCH — re-read and re-check before acting).
            ValueError: ``at`` is not an RFC 3339 UTC instant.
            KubernetesAccessError: 403 on ``get nodes`` / ``patch nodes``, or 401 twice.
        """
        checked_name(node)
        require_utc_rfc3339(at)
        current = self.get_node(node)
        if current is None:
            raise StalePlan("node_not_found")
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        unschedulable = bool((current.get("spec") or {}).get("unschedulable"))
        owner = annotations.get(ANN_CORDONED_BY)
        if owner == execution_id:
            if unschedulable:
                return current
            log.warning(
                "%s: carries our cordon for %s but is schedulable: someone uncordoned it", node, owner
            )
            raise StalePlan("uncordoned_by_other")
        if unschedulable:
            log.info("%s: already cordoned by %s; not adopting it", node, owner or "someone else")
            raise StalePlan("cordoned_by_other")
        patch = {
            "metadata": {
                "resourceVersion": current["metadata"]["resourceVersion"],
                "annotations": {ANN_CORDONED_BY: execution_id, ANN_CORDONED_AT: at},
            },
            "spec": {"unschedulable": True},
        }
        answer = self._patch_node(node, patch)
        if answer.status == 404:
            raise StalePlan("node_not_found")
        if answer.status == 409:
            raise StalePlan("node_changed")
        return answer.body

    def uncordon(self, node: str, execution_id: str) -> bool:
        """Undo our cordon: only when ``rightsizer.io/cordoned-by`` equals ``execution_id``, one JSON merge
        patch guarded by ``resourceVersion`` that removes both annotations (``null``) and sets
        ``spec.unschedulable=false``. A 409 (the node changed meanwhile) re-reads, re-checks and retries once.

        Returns:
            True when this call patched the node; False when the node is gone or the annotation is
            absent or names another execution (a person's cordon is never undone by us).

        Raises:
            StalePlan: ``node_changed`` — 409 twice in a row.
            KubernetesAccessError: 403 on ``get nodes`` / ``patch nodes``, or 401 twice.
        """
        checked_name(node)
        for attempt in (1, 2):
            current = self.get_node(node)
            if current is None:
                return False
            annotations = (current.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANN_CORDONED_BY) != execution_id:
                log.info(
                    "%s: cordoned-by is %r, not %r; leaving the node as it is",
                    node,
                    annotations.get(ANN_CORDONED_BY),
                    execution_id,
                )
                return False
            patch = {
                "metadata": {
                    "resourceVersion": current["metadata"]["resourceVersion"],
                    "annotations": {ANN_CORDONED_BY: None, ANN_CORDONED_AT: None},
                },
                "spec": {"unschedulable": False},
            }
            answer = self._patch_node(node, patch)
            if answer.status == 404:
                return False
            if answer.status != 409:
                return True
            log.info("%s: changed while uncordoning (409, attempt %d)", node, attempt)
        raise StalePlan("node_changed")

    def evict(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        """POST a policy/v1 Eviction (``/api/v1/namespaces/{ns}/pods/{name}/eviction``) with
        ``deleteOptions.preconditions.uid=<uid>``; never a plain DELETE (BUG-14).

        Returns:
            ``accepted`` (201: graceful deletion started — the pod is gone only once :meth:`get_pod`
            answers None, BUG-17); ``gone`` (404); ``uid_mismatch`` (409: the pod with that UID is gone,
            a namesake replaced it); ``blocked`` (429: a PodDisruptionBudget allows no disruption —
            ``message`` names it from the Status causes; ``retry_after`` from ``Retry-After`` or
            ``details.retryAfterSeconds``, None when the server gave none; API Priority and Fairness
            throttling is also a 429 and is equally a reason to wait); ``error`` (500, e.g. the pod is
            matched by more than one PodDisruptionBudget). A 403 whose Status cause is
            ``NamespaceTerminating`` is ``blocked`` too (retry in 5 s): the namespace is being deleted.

        Raises:
            KubernetesAccessError: 403 — names the identity and ``create pods/eviction`` (BUG-31 B) —
                or 401 twice (one 401 rebuilds the token and resends: the first was never admitted).
            TransientError: 502/503/504, timeouts, connection failures (nothing was decided).
            PermanentError: any other status (400/422: a malformed request).
        """
        checked_name(name, namespace=namespace)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        answer = self._call(
            AccessCheck("create", "pods", "eviction"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .create_namespaced_pod_eviction(
                    name, namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            ),
            answered=frozenset({403, 404, 409, 429, 500}),
        )
        if answer.status in (200, 201):
            return EvictionOutcome("accepted")
        message = status_text(answer.body, f"HTTP {answer.status}")
        if answer.status == 403:
            if namespace_terminating(answer.body):
                # The namespace controller deletes the pod itself; kubectl drain waits for it too.
                return EvictionOutcome("blocked", message, 5.0)
            who, check = self.identity(), AccessCheck("create", "pods", "eviction")
            raise KubernetesAccessError(
                f"Kubernetes API answered 403 Forbidden: {who} may not create pods/eviction ({message}). "
                f"Remedy: {remedy_403(check)}.",
                identity=who,
                check=check,
                status=403,
            )
        if answer.status == 404:
            return EvictionOutcome("gone", message)
        if answer.status == 409:
            return EvictionOutcome("uid_mismatch", message)
        if answer.status == 429:
            return EvictionOutcome("blocked", message, eviction_retry_after(answer.headers, answer.body))
        return EvictionOutcome("error", message)

    def emit_event(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        """Create a core/v1 Event about the Node (``POST /api/v1/namespaces/default/events``).

        ``involvedObject`` is the Node (kind, name and — read fresh — uid), ``source.component`` and
        ``reportingComponent`` are ``rightsizer``, ``action`` is ``reason``, ``type`` is ``Warning`` or
        ``Normal``; ``firstTimestamp``/``lastTimestamp`` (RFC 3339) and ``eventTime`` (microseconds) come
        from the adapter's clock. Messages longer than 1024 characters are cut.

        Best effort: any failure (403 on ``create events``, 5xx, network) is logged and swallowed — an
        Event informs people and must never change the outcome of a drain.
        """
        try:
            found = self.get_node(node)
            now = self._clock().astimezone(UTC)
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{node}.", "namespace": EVENT_NAMESPACE},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    **({"uid": found["metadata"]["uid"]} if found else {}),
                },
                "reason": reason,
                "message": message[:_EVENT_MESSAGE_LIMIT],
                "type": "Warning" if warning else "Normal",
                "action": reason,
                "source": {"component": EVENT_COMPONENT},
                "reportingComponent": EVENT_COMPONENT,
                "reportingInstance": _reporting_instance(),
                "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "count": 1,
            }
            self._call(
                AccessCheck("create", "events"),
                lambda api: (
                    client_module()
                    .CoreV1Api(api)
                    .create_namespaced_event(
                        EVENT_NAMESPACE, event, _preload_content=False, _request_timeout=self._timeout
                    )
                ),
            )
        except Exception as exc:  # best effort by contract (ports.ClusterWriter.emit_event)
            log.warning("event %s on node %s not recorded: %s", reason, node, exc)

    def _patch_node(self, node: str, patch: JSON) -> ApiAnswer:
        # The client defaults a dict body to json-patch+json (its first content type); a merge patch must
        checked_name(node)
        # say so, or the API server would read our object as a malformed list of operations.
        return self._call(
            AccessCheck("patch", "nodes"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .patch_node(
                    node,
                    patch,
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            ),
            answered=frozenset({404, 409}),
        )

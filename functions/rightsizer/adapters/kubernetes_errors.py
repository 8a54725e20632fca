"""Kubernetes API answers and errors: how a response or an ``ApiException`` of the official client is read,
and how a refusal becomes one of our error types.

Used by :class:`rightsizer.adapters.kubernetes.KubernetesCluster` (which re-exports
:class:`KubernetesAccessError`). Nothing here sends a request; every function reads an answer the
client already received. The shapes read are the API server's ``Status`` object (``message``,
``details.causes[].reason|type|message``, ``details.retryAfterSeconds``) and the ``Retry-After`` header
(Kubernetes API conventions, "Response Status Kind").

Translation (docs/architecture.md §4 "Errors"): 401 and 403 are :class:`KubernetesAccessError` (a
``PermanentError``) naming the identity, the refused verb/resource and the remedy — the ClusterRole that
grants exactly that, ``adapters.kubernetes_rbac`` (BUG-31); 429 and 5xx
are ``TransientError`` with the server's ``Retry-After``; status 0 (the client's TLS failure) and every
other status are ``PermanentError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

from rightsizer.adapters.kubernetes_rbac import remedy_403
from rightsizer.domain.errors import PermanentError, TransientError
from rightsizer.ports import JSON, AccessCheck

__all__ = [
    "REMEDY_401",
    "ApiAnswer",
    "KubernetesAccessError",
    "ListExpired",
    "eviction_retry_after",
    "namespace_terminating",
    "parse_error_body",
    "status_text",
    "translate_api_error",
]

REMEDY_401: Final = (
    "give this identity access to the cluster: an EKS access entry (authentication mode API or "
    "API_AND_CONFIG_MAP) with Kubernetes group rightsizer-read (rightsizer for the drain and off-hours "
    "functions), or an aws-auth ConfigMap mapRoles entry"
)


class KubernetesAccessError(PermanentError):
    """The API server refused us: 401 twice in a row (unknown identity) or 403 (RBAC).

    ``identity`` is who we are (an IAM ARN on EKS), ``check`` the refused verb/resource, ``status`` the
    HTTP status; the message ends with the remedy.
    """

    def __init__(self, message: str, *, identity: str, check: AccessCheck, status: int) -> None:
        self.identity = identity
        self.check = check
        self.status = status
        super().__init__(message)


class ListExpired(Exception):
    """A continue token expired (410 Gone); the adapter's signal to restart a list from the beginning."""


class ApiAnswer(NamedTuple):
    """One API answer: HTTP status, the parsed JSON object (``{}`` when the body is not JSON), headers."""

    status: int
    body: JSON
    headers: Mapping[str, str]


def parse_error_body(exc: Any) -> JSON:
    """The JSON object in an ``ApiException``'s body (a ``Status``), ``{}`` when it is not one."""
    try:
        body = json.loads(exc.body or b"{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _status_message(exc: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or b"{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or "").strip() if isinstance(body, dict) else ""


def _retry_after(exc: Any, default: float) -> float:
    headers = getattr(exc, "headers", None) or {}
    try:
        return float(headers.get("Retry-After", default))
    except (TypeError, ValueError):
        return default


def status_text(body: JSON, fallback: str) -> str:
    """A ``Status`` message followed by those of its ``details.causes`` that it does not already contain.

    The Eviction API names the PodDisruptionBudget only in a cause (``The disruption budget triton-pdb
    needs 2 healthy pods and has 2 currently``), so the causes are part of what a drain reports (BUG-14).
    """
    message = str(body.get("message") or fallback).strip()
    parts = [message] if message else []
    for cause in (body.get("details") or {}).get("causes") or []:
        text = str((cause or {}).get("message") or "").strip()
        if text and not any(text in part for part in parts):
            parts.append(text)
    return " ".join(parts)


def namespace_terminating(body: JSON) -> bool:
    """A 403 Status caused by a namespace being deleted (``details.causes[].reason`` or ``type``
    ``NamespaceTerminating``, as the NamespaceLifecycle admission plugin writes it)."""
    causes = ((body.get("details") or {}).get("causes")) or []
    return any(
        "NamespaceTerminating" in (str(c.get("reason") or ""), str(c.get("type") or "")) for c in causes
    ) or "because it is being terminated" in str(body.get("message") or "")


def eviction_retry_after(headers: Mapping[str, str], body: JSON) -> float | None:
    """Seconds from the ``Retry-After`` header, else ``details.retryAfterSeconds``, else None."""
    for raw in (headers.get("Retry-After"), (body.get("details") or {}).get("retryAfterSeconds")):
        try:
            seconds = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            seconds = None
        if seconds is not None and seconds > 0:
            return seconds
    return None


def translate_api_error(
    exc: Any, check: AccessCheck, *, identity: Callable[[], str], second_401: bool
) -> Exception:
    """Our error for an ``ApiException`` the adapter does not interpret itself.

    Args:
        exc: the client's ``kubernetes.client.ApiException`` (``status``, ``reason``, ``body``, ``headers``).
        check: the verb/resource the request needed (named in every message).
        identity: who we are, asked only for 401/403 messages.
        second_401: the 401 came after credentials were rebuilt once.

    Returns:
        ``KubernetesAccessError`` (401, 403), ``TransientError`` (429, 5xx; ``retry_after`` from the
        header, else 5 s), ``PermanentError`` (status 0 — a TLS failure — and anything else).
    """
    status = int(exc.status or 0)
    message = _status_message(exc)
    if status == 401:
        who = identity()
        again = " again with freshly built credentials" if second_401 else ""
        return KubernetesAccessError(
            f"Kubernetes API answered 401 Unauthorized to {check.describe()}{again}: the cluster does "
            f"not recognise {who}. Remedy: {REMEDY_401}.",
            identity=who,
            check=check,
            status=401,
        )
    if status == 403:
        who = identity()
        return KubernetesAccessError(
            f"Kubernetes API answered 403 Forbidden: {who} may not {check.describe()} ({message}). "
            f"Remedy: {remedy_403(check)}.",
            identity=who,
            check=check,
            status=403,
        )
    if status == 429 or status >= 500:
        return TransientError(
            f"{check.describe()}: HTTP {status} {message}", retry_after=_retry_after(exc, 5.0)
        )
    if status == 0:
        # The client reports TLS failures as status 0: retrying cannot fix a wrong CA bundle.
        return PermanentError(f"{check.describe()}: {exc.reason} (check the cluster CA bundle)")
    return PermanentError(f"{check.describe()}: HTTP {status} {message}")

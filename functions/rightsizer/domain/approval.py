"""Signed approval links (docs/architecture.md §4 "Approval"): pure token encoding, no I/O, no clock.

An approval request carries three links — approve, reject, snooze — on the webhook's Function URL. Each
link holds a token ``<claims>.<signature>``: ``claims`` is base64url (no padding) of canonical JSON
``{"a": action, "c": cluster, "e": execution id, "n": nonce, "x": expiry (epoch seconds), "s": snooze
seconds}``, ``signature`` base64url of HMAC-SHA256(key, claims) (RFC 2104, :mod:`hmac`), compared in
constant time. The key is derived (:func:`derive_key`) from its own secret, the approval-link key
(template ``ApprovalLinkKeySecret``), never from the webhook's bearer token: the token and a link of a
request together cannot mint another decision (issue 26). Rotating the key invalidates links not yet used.

Single use is not the token's job: the approval record in the state table is decided once, by a
conditional write naming the record's nonce (``ApprovalStore.decide_approval``); any later use answers 409.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ACTIONS",
    "ApprovalAction",
    "ApprovalClaims",
    "TokenExpired",
    "TokenInvalid",
    "derive_key",
    "sign_token",
    "verify_token",
]

ApprovalAction = Literal["approve", "reject", "snooze"]
ACTIONS: Final[tuple[ApprovalAction, ...]] = ("approve", "reject", "snooze")
_KEY_CONTEXT: Final = b"rightsizer.io/approval-link/v1"


class TokenInvalid(ValueError):
    """The token is malformed or its signature does not match (forged or altered): HTTP 401."""


class TokenExpired(ValueError):
    """The token's signature is good but its expiry has passed: HTTP 401 (documented, not 410)."""


@dataclass(frozen=True)
class ApprovalClaims:
    """What a link asks: ``action`` on the drain ``execution_id`` of ``cluster``; valid until
    ``expires_at`` (epoch seconds); ``nonce`` names the approval request; ``snooze_seconds`` is how long
    a snooze keeps the node out of plans (0 for approve and reject)."""

    action: ApprovalAction
    cluster: str
    execution_id: str
    nonce: str
    expires_at: int
    snooze_seconds: int = 0


def derive_key(secret: str) -> bytes:
    """The HMAC key of approval links: HMAC-SHA256(``secret``, a fixed context), 32 bytes.

    Raises:
        ValueError: an empty secret (links would be forgeable).
    """
    if not secret:
        raise ValueError("the approval key needs a non-empty secret")
    return hmac.new(secret.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_token(key: bytes, claims: ApprovalClaims) -> str:
    """The link token for ``claims`` (URL-safe, about 200 characters)."""
    body = json.dumps(
        {
            "a": claims.action,
            "c": claims.cluster,
            "e": claims.execution_id,
            "n": claims.nonce,
            "x": claims.expires_at,
            "s": claims.snooze_seconds,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    encoded = _b64(body)
    signature = hmac.new(key, encoded.encode("ascii"), hashlib.sha256).digest()
    return f"{encoded}.{_b64(signature)}"


def verify_token(key: bytes, token: str, now_epoch: float) -> ApprovalClaims:
    """The claims of a token signed with ``key``, checked for integrity first, then expiry.

    Args:
        now_epoch: the current instant in epoch seconds (the caller's clock).

    Raises:
        TokenInvalid: not ``<claims>.<signature>``, a bad signature, or claims that do not parse.
        TokenExpired: a good signature whose ``x`` is at or before ``now_epoch``.
    """
    encoded, dot, signature = token.strip().partition(".")
    if not dot or not encoded or not signature:
        raise TokenInvalid("not an approval token")
    expected = _b64(hmac.new(key, encoded.encode("ascii", "replace"), hashlib.sha256).digest())
    # Compare the canonical text, not decoded bytes: base64 decoding ignores a last character's unused
    # bits, and a token must have exactly one spelling.
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii", "replace")):
        raise TokenInvalid("signature does not match")
    try:
        data = json.loads(_unb64(encoded))
        action = data["a"]
        if action not in ACTIONS:
            raise TokenInvalid(f"unknown action {action!r}")
        claims = ApprovalClaims(
            action=action,
            cluster=str(data["c"]),
            execution_id=str(data["e"]),
            nonce=str(data["n"]),
            expires_at=int(data["x"]),
            snooze_seconds=int(data.get("s", 0)),
        )
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, TokenInvalid):
            raise
        raise TokenInvalid("claims do not parse") from exc
    if claims.expires_at <= now_epoch:
        raise TokenExpired(f"the link expired at {claims.expires_at}")
    return claims

"""Approval link tokens (``rightsizer.domain.approval``): HMAC-SHA256 over the claims, checked in constant
time before the expiry; any altered byte, another key or a malformed token is ``TokenInvalid``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rightsizer.domain.approval import (
    ApprovalClaims,
    TokenExpired,
    TokenInvalid,
    derive_key,
    sign_token,
    verify_token,
)

KEY = derive_key("the-webhook-token")
CLAIMS = ApprovalClaims("snooze", "prod-eks", "gpu-1-0123456789abcdef", "nonce-1", 2_000_000_000, 86400)


def test_a_token_round_trips_until_it_expires() -> None:
    token = sign_token(KEY, CLAIMS)
    assert verify_token(KEY, token, 1_999_999_999) == CLAIMS
    with pytest.raises(TokenExpired):
        verify_token(KEY, token, 2_000_000_000)


def test_another_key_is_refused_and_keys_are_derived_not_the_secret() -> None:
    token = sign_token(derive_key("another-secret"), CLAIMS)
    with pytest.raises(TokenInvalid):
        verify_token(KEY, token, 0)
    assert KEY != b"the-webhook-token" and len(KEY) == 32
    with pytest.raises(ValueError):
        derive_key("")


@given(position=st.integers(min_value=0), replacement=st.sampled_from("AbZz09-_."))
def test_any_altered_character_is_refused(position: int, replacement: str) -> None:
    token = sign_token(KEY, CLAIMS)
    i = position % len(token)
    altered = token[:i] + replacement + token[i + 1 :]
    if altered == token:
        return
    with pytest.raises(TokenInvalid):
        verify_token(KEY, altered, 0)


@pytest.mark.parametrize("token", ["", ".", "abc", "abc.", ".abc", "a.b.c", "%%%.%%%"])
def test_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(TokenInvalid):
        verify_token(KEY, token, 0)

"""``adapters.secrets.CachedSecret``: a secret re-read every ``max_age_s`` (issue 26: rotation reaches warm
functions), the last value kept over a transient failure, never over a withdrawn secret."""

from __future__ import annotations

import pytest

from rightsizer.adapters.secrets import CachedSecret
from rightsizer.domain.errors import ConfigError, PermanentError, TransientError


class Source:
    def __init__(self) -> None:
        self.value: str | Exception = "v1"
        self.reads = 0

    def __call__(self) -> str:
        self.reads += 1
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_value_is_reused_until_it_is_older_than_max_age_then_read_again() -> None:
    source, clock = Source(), Clock()
    secret = CachedSecret(source, max_age_s=300, clock=clock)
    assert (secret(), secret(), source.reads) == ("v1", "v1", 1)
    source.value = "v2"  # rotated
    clock.now += 299
    assert secret() == "v1" and source.reads == 1
    clock.now += 1
    assert secret() == "v2" and source.reads == 2


def test_a_transient_failure_keeps_the_last_value_30_s_more() -> None:
    source, clock = Source(), Clock()
    secret = CachedSecret(source, max_age_s=300, clock=clock)
    secret()
    source.value = TransientError("throttled")
    clock.now += 300
    assert secret() == "v1" and source.reads == 2
    clock.now += 29
    assert secret() == "v1" and source.reads == 2  # not re-read within 30 s
    clock.now += 1
    source.value = "v2"
    assert secret() == "v2" and source.reads == 3


@pytest.mark.parametrize("error", [ConfigError("deleted"), PermanentError("AccessDenied")])
def test_a_withdrawn_secret_is_never_served_on(error: Exception) -> None:
    source, clock = Source(), Clock()
    secret = CachedSecret(source, max_age_s=300, clock=clock)
    secret()
    source.value = error
    clock.now += 300
    with pytest.raises(type(error)):
        secret()


def test_the_first_read_fails_closed_even_when_transient() -> None:
    source = Source()
    source.value = TransientError("throttled")
    with pytest.raises(TransientError):
        CachedSecret(source, clock=Clock())()

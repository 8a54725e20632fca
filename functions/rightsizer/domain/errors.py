"""The small error taxonomy every adapter maps SDK errors onto (style guide, "Boundaries").

- ``ConfigError``: bad configuration or input; fail closed, take no action (CLI exit 2).
- ``SnapshotError``: a snapshot file that is missing or does not match its schema (CLI exit 2).
- ``StalePlan``: a precondition changed since the plan; abandon quietly (CLI exit 0).
- ``TransientError(retry_after)``: retry later; ``EvictionBlocked`` is the 429 of the Eviction API.
- ``PermanentError``: 403, validation errors, anything retrying cannot fix; alarm (CLI exit 1).
- ``MetricsFailed``: most metric queries of an assessment failed; a failed run, never a plan of unknowns.
"""

from __future__ import annotations


class RightsizerError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(RightsizerError):
    """Configuration or input is invalid; ``source`` names the file and ``field`` the key (dotted path) of
    the first mistake, ``problems`` every mistake found (``rightsizer.domain.validation``)."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        field: str | None = None,
        problems: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.source = source
        self.field = field
        where = ": ".join(part for part in (source, field) if part)
        super().__init__(f"{where}: {message}" if where else message)
        #: every mistake found in one pass, one line each (``rightsizer validate`` prints them all)
        self.problems: tuple[str, ...] = tuple(problems) or (str(self),)


class SnapshotError(ConfigError):
    """A snapshot directory file is missing, not JSON, or does not match its schema (docs/architecture.md §5)."""


class StalePlan(RightsizerError):
    """The world changed since the decision (node gone, pods landed, lease lost); abandon without acting."""


class TransientError(RightsizerError):
    """A temporary failure; retry after ``retry_after`` seconds (throttling, 5xx, timeouts)."""

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class EvictionBlocked(TransientError):
    """policy/v1 Eviction answered 429: a PodDisruptionBudget allows no disruption right now."""


class PermanentError(RightsizerError):
    """A failure retrying cannot fix (403 Forbidden, AWS validation errors, exhausted retries)."""


class MetricsFailed(PermanentError):
    """Most of an assessment's metric queries failed (refused, timed out, unreadable): the run fails
    loudly (CLI exit 1, the assess function's ``AssessmentsFailed`` metric and alarm) instead of
    deciding every node ``unknown`` and exiting 0 (issue 27)."""

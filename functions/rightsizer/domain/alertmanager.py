"""The Alertmanager webhook payload, version 4, as pydantic models (docs/architecture.md §5 "Webhook").

Source of the shape: Alertmanager ``docs/configuration.md`` (``webhook_config``) and
``template/template.go`` (``Data``/``Alert``); real deliveries of Alertmanager 0.25 are kept in
``tests/fixtures/alertmanager/``.

Forward compatible, strict where it matters: unknown keys are kept (``extra="allow"``; newer
Alertmanagers add fields such as ``notification_reason`` or ``routeLabels``), while the fields the intake
acts on — ``version``, ``truncatedAlerts``, ``alerts[].status``, ``labels``, ``startsAt`` and
``fingerprint`` — are validated strictly (no coercion of numbers into strings, timestamps must carry an
offset). Alertmanager blanks ``endsAt`` of an alert that is still firing to Go's zero time
``0001-01-01T00:00:00Z`` (BUG-10); every timestamp equal to it reads as ``None`` ("not set"), so nothing
ever computes a duration from year 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StrictStr

__all__ = ["GO_ZERO_TIME", "Alert", "AlertStatus", "WebhookPayload", "node_of"]

#: Go's ``time.Time{}`` marshalled to JSON: what Alertmanager sends as ``endsAt`` of a firing alert.
GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

AlertStatus = Literal["firing", "resolved"]


def _zero_is_unset(value: datetime | None) -> datetime | None:
    # Compare as instants: the zero time may arrive with any offset or fraction ("…00.000Z").
    if value is None or value == GO_ZERO_TIME:
        return None
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:  # year 1 with a positive offset lies before datetime.min in UTC
        raise ValueError("timestamp out of range") from exc


#: An RFC 3339 timestamp with an offset; Go's zero time becomes ``None``; others are normalised to UTC.
GoTime = Annotated[AwareDatetime | None, AfterValidator(_zero_is_unset)]


class Alert(BaseModel):
    """One alert of a notification; its own ``status`` counts, never the group's (groups mix both).

    Attributes:
        status: ``firing`` or ``resolved``.
        labels: the alert's label set (strings only); the node name is one of them (:func:`node_of`).
        annotations: free text (summary, description).
        starts_at: when the alert started firing (UTC); ``None`` only for Go's zero time.
        ends_at: when it resolved (UTC); ``None`` while firing (Go's zero time, BUG-10).
        generator_url: back-link to the rule's expression in Prometheus.
        fingerprint: Alertmanager's hash of the label set (hex); with ``starts_at`` it identifies one
            alert instance across repeated deliveries (BUG-13).
    """

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    status: AlertStatus
    labels: dict[StrictStr, StrictStr]
    annotations: dict[str, Any] = Field(default_factory=dict)
    starts_at: GoTime = Field(alias="startsAt")
    ends_at: GoTime = Field(None, alias="endsAt")
    generator_url: str = Field("", alias="generatorURL")
    fingerprint: StrictStr = Field(min_length=1, max_length=128)

    @property
    def starts_at_key(self) -> str:
        """``starts_at`` in one canonical spelling (UTC, µs) for idempotency keys; ``""`` when unset."""
        return "" if self.starts_at is None else self.starts_at.isoformat(timespec="microseconds")


class WebhookPayload(BaseModel):
    """A webhook notification (payload ``version`` "4"): one alert group, maybe truncated.

    Attributes:
        version: always ``"4"``; anything else is refused (another shape we do not know).
        group_key: identifies the alert group (``{}:{alertname="GPUNodeIdle"}``).
        truncated_alerts: alerts left out by the receiver's ``max_alerts`` (BUG-12: they are not sent
            later, and a missing alert is never a resolved one).
        status: the group's status — informational only.
        alerts: the alerts present, each with its own status.
    """

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    version: Literal["4"]
    group_key: str = Field("", alias="groupKey")
    truncated_alerts: int = Field(0, alias="truncatedAlerts", ge=0, strict=True)
    status: AlertStatus | None = None
    receiver: str = ""
    group_labels: dict[str, Any] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, Any] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, Any] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field("", alias="externalURL")
    alerts: list[Alert]


def node_of(labels: Mapping[str, str], node_labels: Sequence[str]) -> str | None:
    """The node name: the value of the first of ``node_labels`` the alert carries (policy
    ``alert_node_labels``); empty values count as absent. ``None`` when no label names a node.

    The name is not checked against Kubernetes here: validate, the workflow's first step, does that.
    """
    for label in node_labels:
        value = labels.get(label)
        if value:
            return value
    return None

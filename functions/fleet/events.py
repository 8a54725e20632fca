"""The fleet state machine's task events (``infra/statemachine/fleet.asl.json``): imported by the first
request of :mod:`fleet.app`, not at its cold start (issue 33)."""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from rightsizer.domain.fleet import FleetTarget
from rightsizer.services.fleet import ManifestRef


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Run(_Event):
    """The fleet execution: its name (``$$.Execution.Name``) and start time (``$$.Execution.StartTime``)."""

    id: str = Field(min_length=1, max_length=80)
    at: AwareDatetime


class DiscoverEvent(_Event):
    run: Run


class MemberEvent(_Event):
    target: FleetTarget
    run: Run


class SummarizeEvent(_Event):
    run: Run
    manifest: ManifestRef
    results: dict[str, Any] | None = None
    map_error: dict[str, Any] | None = None

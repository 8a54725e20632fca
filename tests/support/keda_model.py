"""KEDA's Prometheus scaler and its activation, as the KEDA operator computes them (issue 32), to prove
the shipped ScaledObject against a real Prometheus.

Ported from kedacore/keda ``pkg/scalers/prometheus_scaler.go`` (``ExecutePromQuery``: one instant query
``GET /api/v1/query?query=<query>&time=<now, RFC 3339>``; an empty result is 0 with ``ignoreNullValues``
true (the default) and an error with ``"false"``; more than one element is an error; ±Inf follows the
same rule as empty) and ``pkg/scaling/executor/scale_scaledobjects.go`` (a ScaledObject at 0 replicas goes
to ``max(minReplicaCount, 1)`` when any trigger's value is above its ``activationThreshold``; a trigger in
error does not change the replica count).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import httpx

__all__ = ["KedaQueryError", "scaler_value", "wake_replicas"]


class KedaQueryError(Exception):
    """The scaler's query failed as KEDA reports it (the ScaledObject's trigger is in error)."""


def scaler_value(server: str, metadata: dict[str, Any], now: datetime) -> float:
    """The value KEDA's prometheus scaler reads for a trigger's ``metadata`` from ``server``.

    Raises:
        KedaQueryError: an empty or ±Inf answer with ``ignoreNullValues: "false"``, several series, or an
            HTTP/status error.
    """
    ignore_null = str(metadata.get("ignoreNullValues", "true")).lower() != "false"
    answer = httpx.get(
        f"{server}/api/v1/query",
        params={"query": metadata["query"], "time": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        timeout=10.0,
    )
    if answer.status_code != 200:
        raise KedaQueryError(f"prometheus query api returned error. status: {answer.status_code}")
    result = answer.json()["data"]["result"]
    if not result:
        if ignore_null:
            return 0.0
        raise KedaQueryError("prometheus metrics target may be lost, the result is empty")
    if len(result) > 1:
        raise KedaQueryError(f"prometheus query {metadata['query']} returned multiple elements")
    value = float(result[0]["value"][1])
    if math.isinf(value):
        if ignore_null:
            return 0.0
        raise KedaQueryError("prometheus query returned Inf")
    return value


def wake_replicas(scaled_object: dict[str, Any], current: int, server: str, now: datetime) -> int:
    """The replica count the KEDA operator sets for a ScaledObject at ``current`` = 0 replicas: its
    ``minReplicaCount`` unless a trigger is active (value above ``activationThreshold``), then
    max(minReplicaCount, 1). A trigger in error is skipped; when every trigger errs the count is kept."""
    assert current == 0, "this model covers waking from zero (the HPA takes over from 1 replica)"
    spec = scaled_object["spec"]
    active, answered = False, False
    for trigger in spec["triggers"]:
        meta = dict(trigger["metadata"], serverAddress=server)
        try:
            value = scaler_value(server, meta, now)
        except KedaQueryError:
            continue
        answered = True
        active = active or value > float(meta.get("activationThreshold", "0"))
    if not answered:
        return current
    return max(int(spec.get("minReplicaCount", 0)), 1) if active else int(spec.get("minReplicaCount", 0))

"""Loud failure (issue 27 item 1): every duration the client sends is one Prometheus parses, a timeout past
the deadline is refused when the config loads, and a collection whose queries mostly failed fails.

Prometheus parses ``timeout`` and ``step`` with ``web/api/v1/api.go`` ``parseDuration`` (a float, else
``prometheus/common/model.ParseDuration``: whole numbers per unit) and a range selector with
``model.ParseDuration`` alone: ``89.006s`` is a 400. ``DURATION`` below is that grammar's ``ms``/``s`` part,
which the client must stay inside wherever a duration goes (``timeout``, ``step``, ``[...]`` ranges).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest

from rightsizer.adapters.prometheus import PrometheusClient, collect_live
from rightsizer.config import load_config
from rightsizer.domain.errors import ConfigError, MetricsFailed
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.observation import observation_queries, prometheus_duration
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import Window
from tests.builders import AT, STEP, WINDOW

DURATION = re.compile(r"^[1-9][0-9]*(ms|s)$")
RANGE = re.compile(r"\[([^\]:]+)(?::([^\]]+))?\]")
END = AT.timestamp()
EMPTY = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "30s"),
        (30.0, "30s"),
        (89.006, "89006ms"),
        (59.999, "59999ms"),
        (0.0504, "50ms"),
        (0.001, "1ms"),
        (1799.999, "1799999ms"),
        (86400, "86400s"),
        (29.99999, "29999ms"),  # floored: a budget is never exceeded
    ],
)
def test_durations_are_whole_seconds_or_whole_milliseconds(seconds: float, text: str) -> None:
    assert prometheus_duration(seconds) == text
    assert DURATION.match(text)


@pytest.mark.parametrize("seconds", [0, 0.0009, -1])
def test_a_duration_under_one_millisecond_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="1 ms"):
        prometheus_duration(seconds)


def recorder(
    forms: list[dict[str, str]], answer: Callable[[dict[str, str]], httpx.Response]
) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        forms.append(form)
        return answer(form)

    return httpx.MockTransport(handle)


class SlowClock:
    """A monotonic clock that moves 0.3337 s at every reading: every budget the collection hands a
    request is fractional, as when the cycle deadline cuts a query's timeout short."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.3337
        return self.now


def test_every_duration_a_collection_sends_at_the_deadline_edge_is_one_prometheus_parses() -> None:
    # GIVEN timeout == deadline (the case: every request's timeout is cut to what is left)
    forms: list[dict[str, str]] = []
    transport = recorder(forms, lambda _f: httpx.Response(200, content=EMPTY))
    with PrometheusClient("http://prometheus.test", transport=transport, timeout=30.0) as client:
        # WHEN a whole collection runs with sub-windows (split) and a fractional step
        collect_live(
            client,
            NodeJoiner([], []),
            Window(END, WINDOW, STEP),
            Policy(),
            split_seconds=600,
            deadline_seconds=30.0,
            clock=SlowClock(),
        )
        client.query_range("up", END - 60, END, 15.5, budget=29.4567)
    # THEN every timeout, step and range selector is whole seconds or whole milliseconds
    assert len(forms) > len(observation_queries())
    for form in forms:
        assert DURATION.match(form["timeout"]), form
        assert DURATION.match(form["step"]), form
        for rng, sub in RANGE.findall(form["query"]):
            assert DURATION.match(rng), form["query"]
            assert not sub or DURATION.match(sub), form["query"]
    assert {f["step"] for f in forms} == {f"{STEP}s", "15500ms"}
    assert any(f["timeout"].endswith("ms") for f in forms)  # the cut-short timeouts were fractional


def refusing(failed: int) -> Callable[[dict[str, str]], httpx.Response]:
    """An answer that refuses (400 bad_data) the queries of the first ``failed`` observation queries."""
    refused = {q.expr(STEP, WINDOW) for q in observation_queries()[:failed]}

    def answer(form: dict[str, str]) -> httpx.Response:
        if form["query"] in refused:
            return httpx.Response(
                400, json={"status": "error", "errorType": "bad_data", "error": "cannot parse duration"}
            )
        return httpx.Response(200, content=EMPTY)

    return answer


def collect(failed: int, fail_share: float | None) -> tuple[int, tuple[str, ...]]:
    forms: list[dict[str, str]] = []
    with PrometheusClient("http://prometheus.test", transport=recorder(forms, refusing(failed))) as client:
        signals = collect_live(
            client, NodeJoiner([], []), Window(END, WINDOW, STEP), Policy(), fail_share=fail_share
        )
    return len(forms), signals.problems


def test_a_collection_with_most_queries_refused_fails_naming_the_count_and_the_first() -> None:
    total = len(observation_queries())
    with pytest.raises(
        MetricsFailed, match=rf"^{total // 2 + 1} of {total} Prometheus queries failed, first "
    ):
        collect(total // 2 + 1, 0.5)


def test_half_or_fewer_refused_queries_leave_their_metrics_unknown() -> None:
    total = len(observation_queries())
    _sent, problems = collect(total // 2, 0.5)
    assert problems  # their metrics are problems: the nodes they feed are unknown, never idle


def test_one_nodes_read_keeps_every_failure_a_problem() -> None:
    # fail_share None: the drain's per-node read, whose node then is unknown and not drained
    _sent, problems = collect(len(observation_queries()), None)
    assert problems


@pytest.mark.parametrize(("timeout", "deadline", "ok"), [("90s", "90s", True), ("91s", "90s", False)])
def test_a_timeout_past_the_deadline_is_refused_when_the_config_loads(
    tmp_path: Path, timeout: str, deadline: str, ok: bool
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"cluster:\n  name: c\nprometheus:\n  timeout: {timeout}\n  deadline: {deadline}\n", encoding="utf-8"
    )
    if ok:
        assert load_config(path).prometheus.timeout == 90
        return
    with pytest.raises(ConfigError, match=r"prometheus\.timeout: 91 s must be ≤ prometheus.deadline"):
        load_config(path)

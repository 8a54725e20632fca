"""Issue 14 item 4: inputs are validated and bounded — node names, alert counts, credentials, workers.

Each fault is tested with other inputs of its class: every spelling of a name that could address another
API path or field selector, alert counts at and beyond the cap (in one body under 1 MiB), every way two
``Authorization`` headers can arrive, and a flood of starts on the background runner.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from rightsizer.domain.names import dns1123_label_problem, dns1123_subdomain_problem
from rightsizer.services.drain import DrainRequest, StepResult
from rightsizer.services.runner import InProcessRunner
from rightsizer.services.webhook import MAX_ALERTS, MAX_BODY_BYTES, WebhookRequest, bearer_token_matches
from tests.unit.test_webhook import AUTH, TOKEN, Harness, alert, payload, post

#: Names that must never reach a request path or a field selector, with the reason given.
BAD_NAMES = [
    (".", "not_dns1123_subdomain"),
    ("..", "not_dns1123_subdomain"),
    ("../secrets", "not_dns1123_subdomain"),
    ("a/b", "not_dns1123_subdomain"),
    ("/", "not_dns1123_subdomain"),
    ("%2e%2e", "not_dns1123_subdomain"),
    ("nodes/..", "not_dns1123_subdomain"),
    ("a..b", "not_dns1123_subdomain"),
    (".a", "not_dns1123_subdomain"),
    ("a.", "not_dns1123_subdomain"),
    ("-a", "not_dns1123_subdomain"),
    ("a-", "not_dns1123_subdomain"),
    ("Node-1", "not_dns1123_subdomain"),
    ("a b", "not_dns1123_subdomain"),
    ("a\n", "not_dns1123_subdomain"),
    ("a,metadata.name=b", "not_dns1123_subdomain"),
    ("a?watch=true", "not_dns1123_subdomain"),
    ("a#frag", "not_dns1123_subdomain"),
    ("a\\b", "not_dns1123_subdomain"),
    ("nöde", "not_dns1123_subdomain"),
    ("a_b", "not_dns1123_subdomain"),
    ("", "empty"),
    ("a" * 254, "too_long"),
]
GOOD_NAMES = [
    "a",
    "0",
    "gpu-1",
    "ip-10-0-1-23.ec2.internal",
    "i-0abc.us-east-1.compute.internal",
    "a" * 253,
    "a.b-c.d",
]


@pytest.mark.parametrize(("name", "why"), BAD_NAMES)
def test_names_that_are_not_dns1123_subdomains_are_refused_with_the_reason(name: str, why: str) -> None:
    assert dns1123_subdomain_problem(name) == why


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_dns1123_subdomains_pass(name: str) -> None:
    assert dns1123_subdomain_problem(name) is None


@pytest.mark.parametrize(
    ("namespace", "why"),
    [("kube-system", None), ("a.b", "not_dns1123_label"), ("a" * 64, "too_long"), ("", "empty")],
)
def test_namespaces_are_dns1123_labels(namespace: str, why: str | None) -> None:
    assert dns1123_label_problem(namespace) == why


# ------------------------------------------------------------------------------------- webhook intake


@pytest.mark.parametrize(("name", "why"), [*BAD_NAMES[:-2], ("a" * 254, "too_long")])
def test_an_alert_naming_an_invalid_node_is_ignored_with_the_reason(name: str, why: str) -> None:
    # GIVEN one alert with an invalid node name and one with a valid one, in one group
    h = Harness()
    body = payload(alert("firing", name, "fp-bad"), alert("firing", "gpu-1", "fp-good"))

    answer = h.handle(post(body))

    # THEN the valid one starts, the invalid one never reaches the workflow and is reported
    assert answer.status_code == 202
    assert h.starter.nodes == ["gpu-1"]
    assert answer.body["ignored"] == [
        {"fingerprint": "fp-bad", "node": name[:253], "reason": f"invalid_node_name:{why}"}
    ]


@pytest.mark.parametrize("count", [MAX_ALERTS + 1, 2 * MAX_ALERTS, 10_000])
def test_more_alerts_than_the_cap_are_refused_before_any_is_acted_on(count: int) -> None:
    h = Harness()
    alerts = [
        {
            "status": "firing",
            "labels": {"node": f"n{i}"},
            "startsAt": "2024-05-14T09:20:00Z",
            "fingerprint": f"{i:x}",
        }
        for i in range(count)
    ]
    body = json.dumps(payload(*alerts), separators=(",", ":"))
    assert len(body.encode()) <= MAX_BODY_BYTES  # within the 413 limit: only the cap refuses it

    answer = h.handle(post(body))

    assert (answer.status_code, answer.body["error"]) == (400, "too_many_alerts")
    assert f"{count} alerts" in answer.body["detail"] and f"limit is {MAX_ALERTS}" in answer.body["detail"]
    assert "max_alerts" in answer.body["detail"]
    assert h.starter.requests == [] and h.guard.seen() == []


def test_exactly_the_cap_is_handled() -> None:
    h = Harness()
    alerts = [alert("firing", f"gpu-{i}", f"fp{i}") for i in range(MAX_ALERTS)]

    answer = h.handle(post(payload(*alerts)))

    assert answer.status_code == 202
    assert len(h.starter.requests) == MAX_ALERTS


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {TOKEN}", "authorization": f"Bearer {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}", "AUTHORIZATION": "Bearer wrong"},
        {"authorization": "Bearer wrong", "Authorization": f"Bearer {TOKEN}"},
        {"authorization": f"Bearer {TOKEN},Bearer {TOKEN}"},  # a Function URL joins repeated headers
        {"authorization": f"Bearer wrong,Bearer {TOKEN}"},
        {"authorization": f"Bearer {TOKEN}, Bearer wrong"},
    ],
)
def test_two_authorization_headers_never_authenticate(headers: dict[str, str]) -> None:
    h = Harness()
    assert not bearer_token_matches(headers, TOKEN)
    answer = h.handle(WebhookRequest(headers, json.dumps(payload(alert("firing", "gpu-1", "fp")))))
    assert answer.status_code == 401
    assert h.starter.requests == []


def test_one_authorization_header_still_authenticates() -> None:
    assert bearer_token_matches(AUTH, TOKEN)
    assert bearer_token_matches({"AUTHORIZATION": f"bearer {TOKEN}"}, TOKEN)


# ---------------------------------------------------------------------------------------- drain start


@pytest.mark.parametrize(
    ("name", "why"), [("..", "not_dns1123_subdomain"), ("a/b", "not_dns1123_subdomain"), ("", "empty")]
)
def test_a_drain_of_an_invalid_node_name_ends_at_validate_without_reading_the_cluster(
    name: str, why: str
) -> None:
    from tests.unit.test_drain import make_world

    world = make_world()
    world.writer.calls.clear()
    runner = world.runner()

    result = runner.start(DrainRequest(name, "exec-bad"))

    final = runner.results["exec-bad"]
    assert result == "exec-bad"
    assert (final.status, final.message) == ("abandoned", f"invalid_node_name:{why}")
    assert world.writer.calls == []  # not even a GET: the name never reached the cluster port
    assert world.state.get(name) is None


# ------------------------------------------------------------------------------------- bounded runner


class _BlockingWorkflow:
    """A workflow whose every step blocks until released; counts steps running at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.started: list[str] = []

    def start(self, request: DrainRequest) -> Any:
        self.started.append(request.execution_id)
        return SimpleNamespace(status="running")  # the record, as far as the runner reads it

    def step(self, execution_id: str) -> StepResult:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.release.wait(10)
        with self.lock:
            self.running -= 1
        return StepResult(execution_id, "validate", None, "abandoned", 0.0, "done")


@pytest.mark.parametrize("starts", [3, 50, 400])
def test_background_workflows_run_on_a_bounded_pool(starts: int) -> None:
    workflow = _BlockingWorkflow()
    runner = InProcessRunner(workflow, background=True, background_workers=3)  # type: ignore[arg-type]
    before = threading.active_count()

    for i in range(starts):
        runner.start(DrainRequest(f"gpu-{i}", f"exec-{i}"))  # answers at once

    assert len(workflow.started) == starts
    assert threading.active_count() - before <= 3
    workflow.release.set()
    runner.join(30)
    assert len(runner.results) == starts
    assert workflow.peak <= 3

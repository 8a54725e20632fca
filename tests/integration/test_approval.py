"""Human approval of a drain (issue 15 item 4), through the drain state machine's ASL and the webhook.

GIVEN policy ``approval: required`` and one idle node of an opted-in group, a drain runs state by state
through ``infra/statemachine/drain.asl.json`` against ``functions/drain/app.handler`` (the interpreter of
``test_statemachine``, which plays Step Functions' task tokens), and the person acts through the real
webhook handler (``function_url_handler``) on the links the approval request carries — GET shows a
confirm page, POST decides. THEN approve drains; reject, snooze and the timeout abandon with nothing
cordoned; a forged or expired link answers 401 and a reused one 409; a snooze keeps the node
``protected`` (``snoozed``) in the assessment's plan until it ends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from rightsizer.adapters.memory_state import MemoryApprovals, MemoryState
from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.cli import example_snapshot_dir
from rightsizer.domain.approval import ApprovalClaims, derive_key, sign_token
from rightsizer.domain.policy import Policy
from rightsizer.localserve import function_url_event
from rightsizer.services.approval import ApprovalDesk, ApprovalGate
from rightsizer.services.assess import AssessmentDeps, run_assessment
from rightsizer.services.drain import DrainDeps, DrainWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.services.webhook import MemoryDuplicateGuard, WebhookIntake
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from rightsizer.webhook_handler import function_url_handler
from tests.builders import AT, gpu_node
from tests.integration.test_statemachine import ASG, INSTANCE, NODE, IdleAssessor, request
from tests.support.asl import (
    ROOT,
    AslInterpreter,
    Execution,
    LambdaContext,
    TaskTokens,
    drain_machine,
    load_asl,
    serving,
)

pytestmark = pytest.mark.integration

SECRET = "webhook-bearer-token-of-the-stack"
BASE_URL = "https://abc123.lambda-url.us-east-1.on.aws/"
EXECUTION = "gpu-node-k-0123456789abcdef"


class Notifier:
    """The SNS topic: keeps what was published."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    def publish(self, subject: str, message: str) -> None:
        self.messages.append((subject, message))

    def link(self, action: str) -> str:
        (_subject, message), *_ = self.messages
        match = re.search(rf"^{action.capitalize()}[^:]*:\s+(https://\S+)$", message, re.MULTILINE)
        assert match, message
        return match.group(1)


@dataclass
class World:
    clock: FakeClock
    cluster: FakeClusterWriter
    scaler: FakeNodeScaler
    state: MemoryState
    approvals: MemoryApprovals
    notifier: Notifier
    tokens: TaskTokens
    desk: ApprovalDesk
    interpreter: AslInterpreter
    workflow: DrainWorkflow

    def http(self, method: str, url: str, body: str = "") -> dict[str, Any]:
        """One request to the webhook's Function URL, through the real handler."""
        intake = WebhookIntake(
            token=SECRET,
            starter=InProcessRunner(self.workflow),
            leases=self.state,
            guard=MemoryDuplicateGuard(),
            approvals=self.desk,
        )
        parts = urlsplit(url)
        event = function_url_event(
            method=method,
            path=parts.path,
            query=parts.query,
            headers={"content-type": "application/x-www-form-urlencoded"} if body else {},
            body=body.encode(),
        )
        answer: dict[str, Any] = function_url_handler(lambda: intake)(event, LambdaContext())
        return answer

    def click(self, action: str) -> dict[str, Any]:
        """Open the link of ``action`` (the confirm page), then confirm it (POST with its token)."""
        url = self.notifier.link(action)
        page = self.http("GET", url)
        assert page["statusCode"] == 200 and "Confirm" in page["body"], page
        token = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["token"]
        return self.http("POST", BASE_URL.rstrip("/") + "/approval", urlencode({"token": _unquote(token)}))

    def run(self) -> Execution:
        return self.interpreter.run(request(EXECUTION), EXECUTION)

    def never_cordoned(self) -> bool:
        return not any(call[0] == "cordon" for call in self.cluster.calls)


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def make_world(policy: dict[str, Any] | None = None) -> World:
    clock = FakeClock(AT)
    cluster = FakeClusterWriter(clock=clock)
    cluster.add_node(gpu_node(NODE, instance_id=INSTANCE, created=AT - timedelta(days=2)))
    scaler = FakeNodeScaler()
    scaler.add_group(ASG, min_size=1, desired=3, max_size=6, instance_ids=[INSTANCE, "i-0a", "i-0c"])
    state, approvals, notifier, tokens = MemoryState("prod-eks"), MemoryApprovals(), Notifier(), TaskTokens()
    settings = {"dry_run": False, "max_decision_age": 3600, "approval": "required", **(policy or {})}
    gate = ApprovalGate("prod-eks", approvals, notifier, derive_key(SECRET), BASE_URL)
    workflow = DrainWorkflow(
        DrainDeps(
            cluster, scaler, IdleAssessor(), state, Policy.model_validate(settings), dry_run=False,
            clock=clock.now, approvals=gate,
        )
    )  # fmt: skip
    desk = ApprovalDesk("prod-eks", approvals, tokens, derive_key(SECRET), clock=clock.now)
    interpreter = drain_machine(clock, tokens=tokens)
    return World(clock, cluster, scaler, state, approvals, notifier, tokens, desk, interpreter, workflow)


@pytest.fixture
def world() -> Iterator[World]:
    w = make_world()
    with serving(w.workflow):
        yield w


def test_approve_by_link_drains_through_the_state_machine(world: World) -> None:
    answers: list[dict[str, Any]] = []
    cordoned_before_approval: list[bool] = []

    def person(_token: str) -> None:
        cordoned_before_approval.append(not world.never_cordoned())
        answers.append(world.click("approve"))

    world.tokens.while_waiting = person
    run = world.run()

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.output["drain"]["status"] == "succeeded"
    assert [a["statusCode"] for a in answers] == [200]
    assert "Done: approved" in answers[0]["body"]
    # the request was published once, with what a person needs to decide, before anything was cordoned
    [(subject, message)] = world.notifier.messages
    assert NODE in subject
    for text in (f"node {NODE}", "Verdict:     idle", "idle_window_clean", "gpu-a10g", INSTANCE, "5.672 USD/h",
                 "rightsizer approve " + EXECUTION):  # fmt: skip
        assert text in message, text
    assert run.states.count("AwaitApproval") == 1 and cordoned_before_approval == [False]
    assert not world.never_cordoned() and world.scaler.terminated == [INSTANCE]
    # and the wake-up was SendTaskSuccess on the task's token
    [(kind, output)] = world.tokens.outcomes.values()
    assert (kind, output["decision"]) == ("success", "approved")


def test_reject_by_link_abandons_with_nothing_cordoned(world: World) -> None:
    world.tokens.while_waiting = lambda _token: world.click("reject")

    run = world.run()

    assert run.status == "SUCCEEDED"  # abandoned is a normal end (exit 0), not a failed drain
    assert run.output["drain"]["status"] == "abandoned"
    # the decider is the link and where its request came from (issue 26), never a declared name
    decider = "link from 127.0.0.1 (request "
    assert run.output["drain"]["message"].startswith(f"approval_rejected:{decider}"), run.output
    assert world.never_cordoned() and world.scaler.terminated == []
    assert world.state.get(NODE) is None and world.state.slots() == []  # lease and slot given back
    [(kind, (error, _cause))] = world.tokens.outcomes.values()
    assert (kind, error) == ("failure", "ApprovalRejected")
    [entry] = world.state.entries(EXECUTION)
    assert (entry.step, entry.result) == ("approval", "abandoned")
    assert entry.reason.startswith(f"approval_rejected:{decider}"), entry.reason
    stored = world.approvals.get_approval(EXECUTION)
    assert stored is not None and (stored.decided_by or "").startswith(decider)


def test_unanswered_request_times_out_and_abandons(world: World) -> None:
    run = world.run()  # nobody answers

    assert run.output["drain"]["status"] == "abandoned"
    assert run.output["drain"]["message"] == "approval_timeout"
    assert world.never_cordoned() and world.scaler.terminated == []
    assert world.approvals.get_approval(EXECUTION).status == "expired"  # type: ignore[union-attr]
    # the wait lasted the policy's approval_timeout (default 1 h)
    assert world.clock.now() - AT >= timedelta(hours=1)
    # a click after the timeout is refused (the link expired with the request: 401), and a late
    # decision from the CLI finds the request decided (expired: 409); nothing is cordoned
    assert world.http("GET", world.notifier.link("approve"))["statusCode"] == 401
    late = world.desk.decide(EXECUTION, "approve", by="cli:alice")
    assert (late.status, late.outcome) == (409, "already_expired")
    assert world.never_cordoned()


def test_snooze_abandons_and_keeps_the_node_out_of_plans_until_it_ends(world: World) -> None:
    world.tokens.while_waiting = lambda _token: world.click("snooze")

    run = world.run()

    assert run.output["drain"]["status"] == "abandoned"
    until = (world.clock.now() + timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert run.output["drain"]["message"] == f"approval_snoozed:until:{until}"
    assert world.never_cordoned()
    snoozes = world.approvals.snoozes(world.clock.now())
    assert list(snoozes) == [NODE]
    assert snoozes[NODE] - world.clock.now() == pytest.approx(timedelta(hours=24), abs=timedelta(seconds=5))


@pytest.mark.parametrize("tamper", ["forged", "expired", "other_cluster", "garbage"])
def test_a_forged_or_expired_link_is_refused_with_401(world: World, tamper: str) -> None:
    tokens_seen: list[dict[str, Any]] = []

    def person(_token: str) -> None:
        url = world.notifier.link("approve")
        claims = ApprovalClaims(
            "approve", "prod-eks", EXECUTION, world.approvals.get_approval(EXECUTION).nonce,  # type: ignore[union-attr]
            int((world.clock.now() + timedelta(hours=1)).timestamp()),
        )  # fmt: skip
        if tamper == "forged":  # the right claims, signed with another key
            token = sign_token(derive_key("guessed-secret"), claims)
        elif tamper == "expired":  # a genuine link, opened after its request expired
            world.clock.advance(3601)
            token = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["token"]
            token = _unquote(token)
        elif tamper == "other_cluster":
            token = sign_token(derive_key(SECRET), ApprovalClaims(**{**claims.__dict__, "cluster": "dev"}))
        else:
            token = "not-a-token"
        for method, body in (("GET", ""), ("POST", urlencode({"token": token}))):
            target = (
                BASE_URL + "approval?" + urlencode({"token": token})
                if method == "GET"
                else BASE_URL + "approval"
            )
            tokens_seen.append(world.http(method, target, body))

    world.tokens.while_waiting = person
    run = world.run()

    assert [a["statusCode"] for a in tokens_seen] == [401, 401]
    assert run.output["drain"]["message"] == "approval_timeout"
    assert world.never_cordoned()


def test_a_reused_link_answers_409_and_changes_nothing(world: World) -> None:
    answers: list[dict[str, Any]] = []

    def person(_token: str) -> None:
        answers.append(world.click("approve"))
        url = world.notifier.link("reject")  # then someone else rejects, and the approve link is replayed
        token = _unquote(dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["token"])
        answers.append(world.http("POST", BASE_URL + "approval", urlencode({"token": token})))
        answers.append(world.http("GET", world.notifier.link("approve")))

    world.tokens.while_waiting = person
    run = world.run()

    assert [a["statusCode"] for a in answers] == [200, 409, 409]
    assert run.output["drain"]["status"] == "succeeded"  # the first decision stands
    assert world.approvals.get_approval(EXECUTION).status == "approved"  # type: ignore[union-attr]


def test_a_node_group_override_decides_and_dry_run_asks_nobody() -> None:
    # no approval for this group (override), although the global setting requires it
    w = make_world({"approval_node_groups": {ASG: "none"}})
    with serving(w.workflow):
        run = w.run()
    assert run.output["drain"]["status"] == "succeeded"
    assert "AwaitApproval" not in run.states and w.notifier.messages == []
    # and the policy names a wrong value's key
    with pytest.raises(ValueError, match="approval_node_groups"):
        Policy.model_validate({"approval_node_groups": {ASG: "maybe"}})


def test_in_process_runner_waits_for_the_cli_decision() -> None:
    # The CLI path: the operator's credentials decide in the store; the runner polls the decision.
    w = make_world()
    decided: list[int] = []

    def sleep(seconds: float) -> None:
        w.clock.advance(seconds)
        if w.approvals.get_approval(EXECUTION) is not None and not decided:
            decided.append(w.desk.decide(EXECUTION, "approve", by="cli:alice").status)

    runner = InProcessRunner(w.workflow, sleep=sleep)
    from rightsizer.services.drain import DrainRequest

    runner.start(DrainRequest(NODE, EXECUTION, "cli", 5.672))
    assert decided == [200]
    assert runner.results[EXECUTION].status == "succeeded"
    assert w.desk.decide(EXECUTION, "reject", by="cli:bob").status == 409


def test_a_snooze_makes_the_node_protected_in_the_assessment_until_it_ends() -> None:
    snapshot = load_snapshot(example_snapshot_dir())
    at = snapshot.meta.taken_at
    idle = "ip-10-0-83-246.ec2.internal"
    approvals = MemoryApprovals()
    approvals.snooze(idle, at + timedelta(hours=24), by="link", now=at)
    started: list[str] = []

    class Starter:
        def start(self, req: Any) -> str:
            started.append(req.node)
            return str(req.execution_id)

    def assess(now: datetime, snoozes: MemoryApprovals) -> Any:
        deps = AssessmentDeps(
            cluster_name="demo", observe=lambda _at: snapshot, policy=Policy(), cluster=FakeClusterWriter(),
            state=MemoryState("demo"), starter=Starter(), snoozes=snoozes,
        )  # fmt: skip
        return run_assessment(deps, now, f"tick-{now.timestamp()}")

    during = assess(at, approvals)
    record = next(r for r in during.records if r.node == idle)
    until = (at + timedelta(hours=24)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (record.verdict, record.action) == ("protected", "none")
    assert f"snoozed:until:{until}" in record.reasons
    assert idle not in started

    # The snapshot's metrics hold at ``at`` only, so the end is shown at ``at``: a snooze until exactly
    # the plan's instant has ended (``until > at`` is the rule), and the node is a candidate again.
    ended = MemoryApprovals()
    ended.snooze(idle, at, by="link", now=at - timedelta(hours=24))
    after = assess(at, ended)
    record = next(r for r in after.records if r.node == idle)
    assert not any(r.startswith("snoozed") for r in record.reasons)
    assert idle in started  # eligible again once the snooze ended


def test_the_approval_task_payload_is_what_the_handler_parses() -> None:
    from rightsizer.handler_io import RequestApprovalTask, parse_drain_task

    payload = load_asl()["States"]["AwaitApproval"]["Parameters"]["Payload"]
    assert payload == {"action": "request_approval", "execution_id.$": "$.execution_id",
                       "task_token.$": "$$.Task.Token"}  # fmt: skip
    sample = json.loads((ROOT / "events" / "drain-request-approval.json").read_text(encoding="utf-8"))
    assert isinstance(parse_drain_task(sample), RequestApprovalTask)
    with pytest.raises(ValueError):
        parse_drain_task({"action": "request_approval", "execution_id": EXECUTION})  # no token


def _approval_events(cluster: FakeClusterWriter) -> list[tuple[str, str, str]]:
    return [
        (e["reason"], e["type"], e["message"])
        for e in cluster.events
        if e["involvedObject"]["name"] == NODE and e["reason"].startswith("Approval")
    ]


@pytest.mark.parametrize(
    ("action", "reason", "kind", "says"),
    [
        ("approve", "ApprovalGranted", "Normal", ") approved draining the node"),
        ("reject", "ApprovalRejected", "Normal", ") rejected draining the node"),
        ("snooze", "ApprovalSnoozed", "Normal", ") snoozed the node's removal until 2026-11-0"),
        (None, "ApprovalTimedOut", "Warning", "nobody approved draining the node in time"),
    ],
)
def test_each_approval_outcome_is_one_event_on_the_node(
    world: World, action: str | None, reason: str, kind: str, says: str
) -> None:
    # GIVEN a drain waiting for a person, who answers by link (or nobody does)
    if action is not None:
        world.tokens.while_waiting = lambda _token: world.click(action)

    # WHEN the drain runs through the state machine
    world.run()

    # THEN the node carries the request and its outcome, once each, like the drain's other Events
    [(requested, normal, asked), (outcome, outcome_kind, told)] = _approval_events(world.cluster)
    assert (requested, normal) == ("ApprovalRequested", "Normal")
    assert (
        f"approve draining the node ({EXECUTION}); unanswered by 2026-11-02T11:00:00Z it is abandoned"
        in asked
    )
    assert (outcome, outcome_kind) == (reason, kind) and says in told and EXECUTION in told
    if action is not None:  # decided by the link, from where its request came (issue 26)
        assert told.startswith("link from 127.0.0.1 (request "), told
    if action != "approve":
        assert told.endswith("the drain is abandoned, nothing was cordoned")
    else:  # approved before the cordon's own Event
        reasons = [e["reason"] for e in world.cluster.events]
        assert reasons.index("ApprovalGranted") < reasons.index("CordonedIdle")


def test_a_request_that_could_not_be_published_is_a_warning_event() -> None:
    # GIVEN the topic refuses the request (nobody is asked)
    w = make_world()

    def refuse(_subject: str, _message: str) -> None:
        raise RuntimeError("sns:Publish denied")

    w.notifier.publish = refuse  # type: ignore[method-assign,assignment]
    with serving(w.workflow):
        run = w.run()

    # THEN the drain is abandoned with nothing cordoned, and the node says why
    assert run.output["drain"]["message"] == "approval_request_failed" and w.never_cordoned()
    [(reason, kind, message)] = _approval_events(w.cluster)
    assert (reason, kind) == ("ApprovalRequestFailed", "Warning") and "could not ask for approval" in message


def test_the_drains_cluster_role_may_record_the_approval_events(clock_double: Any) -> None:
    """Against the Kubernetes double authorized by exactly the ClusterRole ``rightsizer`` of
    infra/k8s/rbac.yaml (the drain's identity): its ``events create`` covers the approval Events."""
    from botocore.credentials import ReadOnlyCredentials

    from rightsizer.adapters.eks_auth import EksTokenSource
    from rightsizer.adapters.kubernetes import KubernetesCluster
    from rightsizer.services.drain import DrainRequest
    from tests.integration.test_drain_safety_k8s import cluster_role

    clock, double = clock_double
    double.bind_cluster_role(cluster_role("rightsizer"))
    double.add_node(gpu_node(NODE, instance_id=INSTANCE, created=AT - timedelta(days=2)))
    w = make_world()
    cluster = KubernetesCluster.for_eks(
        double.base_url,
        EksTokenSource("prod-eks", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
    )
    deps = w.workflow.deps
    workflow = DrainWorkflow(DrainDeps(cluster, deps.scaler, deps.assessor, deps.state, deps.policy,
                                       dry_run=False, clock=clock.now, approvals=deps.approvals))  # fmt: skip

    def sleep(seconds: float) -> None:  # the person rejects from the CLI while the runner waits
        clock.advance(seconds)
        if w.approvals.get_approval(EXECUTION) is not None:
            w.desk.decide(EXECUTION, "reject", by="cli:alice")

    InProcessRunner(workflow, sleep=sleep).start(DrainRequest(NODE, EXECUTION, "cli", 5.672))

    assert [e["reason"] for e in double.events(involved_name=NODE)] == [
        "ApprovalRequested",
        "ApprovalRejected",
    ]
    assert [r for r in double.requests if r.status == 403] == []


@pytest.fixture
def clock_double() -> Iterator[tuple[FakeClock, Any]]:
    from rightsizer.testing.k8s import KubernetesDouble

    clock = FakeClock(AT)
    with KubernetesDouble(seed=7, resource_api_versions=None, clock=clock) as double:
        yield clock, double

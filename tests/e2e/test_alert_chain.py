"""The real alert chain (docs/architecture.md §2, §4, §7): dcgm-exporter → Prometheus → Alertmanager → ``serve`` → drain.

GIVEN EKS cluster ``prod-eks`` on moto (node group ``gpu-a10g``: min 1, desired 3, g5.2xlarge), the
Kubernetes double with its three Nodes, a local dcgm-exporter endpoint whose values move with time
(A idle; B busy with a training pod; C busy, running a StatefulSet pod with a 240 s grace period), a real
Prometheus (Debian) scraping it every second and evaluating the checked-in ``GPUNodeIdle`` rule (its
``for`` set to the test policy's 10 s idle window), a real Alertmanager (Debian) routing with the
checked-in receiver to ``rightsizer serve`` (bearer token from ``credentials_file``), which starts drains
in process over the product's adapters (Kubernetes by kubeconfig, Auto Scaling on moto, the live
Prometheus collection, DynamoDB state on moto) with ``--execute`` and the policy's ``dry_run: false``:

1. WHEN A has been idle for the window THEN Alertmanager delivers ``firing`` for A; the workflow
   validates A against the real Prometheus, cordons and drains it on the double and terminates exactly
   A's instance on moto (desired 3 → 2); B and C are untouched; the ledger holds the outcome.
   AND when A's exporter goes with its instance, the alert resolves and the ``resolved`` delivery is a
   no-op (200: no lease).
2. WHEN C turns idle THEN it is alerted and its drain cordons it and evicts its pod, which takes 240 s
   to terminate; WHEN C turns busy before that THEN the rule resolves, Alertmanager delivers ``resolved``,
   the webhook records a cancel for the lease epoch (202) and the workflow rolls back: C is uncordoned
   and its instance stays in service (desired still 2).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from alert_webhook import app
from rightsizer import wiring
from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.config import load_config
from rightsizer.domain.model import ANN_CORDONED_BY
from rightsizer.localserve import WebhookHTTPServer, build_serve_starter, build_webhook_server
from rightsizer.services.runner import InProcessRunner
from tests.support.binaries import require_binary
from tests.support.e2e_cluster import (
    AWS_ENV,
    CLUSTER,
    REGION,
    TABLE,
    DcgmExporter,
    ExtraPod,
    GpuCluster,
    GpuNode,
    Process,
    free_port,
    gpu_cluster,
    render_alertmanager,
    render_rules,
    start_alertmanager,
    start_scraping_prometheus,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "e2e-webhook-token-5c1f0b7a"
IDLE_WINDOW = "10s"  # tests/e2e/policy.yaml
GRACE_S = 240


@dataclass(frozen=True)
class Delivery:
    """One POST ``serve`` answered: what Alertmanager sent and what the webhook said."""

    at: float
    user_agent: str
    authorization: str
    payload: dict[str, Any]
    status: int
    answer: dict[str, Any]

    def alerts(self) -> list[tuple[str, str]]:
        """(status, node label) of every alert in the payload."""
        return [(a["status"], a["labels"].get("node", "")) for a in self.payload.get("alerts", [])]


@dataclass
class Chain:
    """Everything running, and what ``serve`` received."""

    cluster: GpuCluster
    exporter: DcgmExporter
    prometheus: Process
    alertmanager: Process
    server: WebhookHTTPServer
    runner: InProcessRunner
    state: DynamoDbState
    started_at: float
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self, status: str, node: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if (status, node) in d.alerts()]

    def describe(self) -> str:
        """What to look at when a wait times out."""
        with self.lock:
            seen = [
                (round(d.at - self.started_at, 1), d.status, d.alerts(), d.answer) for d in self.deliveries
            ]
        nodes = {
            n["metadata"]["name"]: (n["spec"].get("unschedulable"), n["metadata"].get("annotations", {}))
            for n in self.cluster.double.list_nodes()
        }
        return (
            f"deliveries: {json.dumps(seen, default=str)}\nresults: {self.runner.results}\nnodes: {nodes}\n"
            f"exporter scrapes: {self.exporter.scrapes}\n"
            f"--- alertmanager log ---\n{self.alertmanager.log_tail(2500)}\n"
            f"--- prometheus log ---\n{self.prometheus.log_tail(1500)}"
        )


def _check(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "SUCCESS" in done.stdout + done.stderr, done.stdout + done.stderr


def _cancel_running_drains(chain_ref: list[Chain]) -> None:
    """After a failure mid-drain: cancel what still runs (as a resolved alert would) so its thread ends
    with a rollback before the servers it talks to go away."""
    if not chain_ref:
        return
    chain = chain_ref[0]
    with chain.lock:
        started = [s for d in chain.deliveries for s in d.answer.get("started", [])]
    for entry in started:
        if entry["execution_id"] in chain.runner.results:
            continue
        lease = chain.state.get(entry["node"])
        if lease is not None and lease.owner == entry["execution_id"]:
            chain.state.request_cancel(entry["node"], lease.epoch)


def _record(chain_ref: list[Chain], server: WebhookHTTPServer) -> None:
    """Keep every request ``serve`` hands to the Lambda handler and the handler's answer (the handler
    itself is the product's, unchanged)."""
    handler = server.lambda_handler

    def recording(event: dict[str, Any], context: Any) -> dict[str, Any]:
        answer = handler(event, context)
        headers = event.get("headers") or {}
        try:
            payload = json.loads(event.get("body") or "{}")
            body = json.loads(answer.get("body") or "{}")
        except ValueError:
            payload, body = {}, {}
        delivery = Delivery(
            time.monotonic(),
            headers.get("user-agent", ""),
            headers.get("authorization", ""),
            payload,
            int(answer.get("statusCode", 0)),
            body,
        )
        with chain_ref[0].lock:
            chain_ref[0].deliveries.append(delivery)
        return answer

    server.lambda_handler = recording


@pytest.fixture
def chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Chain]:
    prometheus_bin = require_binary("prometheus")
    promtool = require_binary("promtool")
    alertmanager_bin = require_binary("alertmanager")
    amtool = require_binary("amtool")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    pods = [
        ExtraPod("trainer-7d9f5-x2kqp", 1, {"gpus": 1, "cpu": "6", "memory": "24Gi", "grace": 30}),
        ExtraPod("model-cache-0", 2, {"owner": ("StatefulSet", "apps/v1"), "grace": GRACE_S}),
    ]

    def exporter_for(nodes: list[GpuNode]) -> DcgmExporter:
        a, b, c = nodes
        return DcgmExporter(nodes, {a.name: "idle", b.name: "busy", c.name: "busy"})

    with contextlib.ExitStack() as stack:
        cluster, exporter = stack.enter_context(
            gpu_cluster(tmp_path, nodes=3, extra_pods=pods, exporter=exporter_for)
        )
        assert exporter is not None
        exporter.start()
        prometheus_port = free_port()
        config = load_config(
            write_config(tmp_path / "config.yaml", cluster, f"http://127.0.0.1:{prometheus_port}")
        )
        # serve, as `rightsizer serve --execute` builds it; the starter is kept to read drain outcomes.
        client = boto3.session.Session(region_name=REGION).client(
            "dynamodb", endpoint_url=cluster.moto.endpoint_url
        )
        state = DynamoDbState(client, TABLE, CLUSTER)
        runner = build_serve_starter(config, state, execute=True)
        assert isinstance(runner, InProcessRunner)
        server = build_webhook_server(
            config, port=0, execute=True, starter=runner, state=state, environ={wiring.TOKEN_ENV: TOKEN}
        )
        stack.callback(app.use_intake, None)
        stack.callback(runner.join, 15)
        stack.callback(server.server_close)
        chain_ref: list[Chain] = []
        stack.callback(_cancel_running_drains, chain_ref)
        _record(chain_ref, server)
        serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        serving.start()
        stack.callback(serving.join, 10)
        stack.callback(server.shutdown)
        # Alertmanager: the checked-in receiver pointed at serve, the token in a file as mounted in life.
        token_file = tmp_path / "gpu-rightsizer-token"
        token_file.write_text(TOKEN)
        token_file.chmod(0o600)
        am_config = render_alertmanager(tmp_path / "alertmanager.yml", server.url, token_file)
        _check([amtool, "check-config", str(am_config)])
        alertmanager = start_alertmanager(alertmanager_bin, tmp_path / "alertmanager", am_config)
        stack.callback(alertmanager.stop)
        # Prometheus: the checked-in rule with `for` = the test policy's idle window.
        rules = render_rules(tmp_path / "gpu-idle-rules.yaml", IDLE_WINDOW)
        _check([promtool, "check", "rules", str(rules)])
        (tmp_path / "prometheus").mkdir()
        prometheus = start_scraping_prometheus(
            prometheus_bin,
            tmp_path / "prometheus",
            port=prometheus_port,
            target=exporter.target,
            rules=rules,
            alertmanager=alertmanager.url.removeprefix("http://"),
        )
        stack.callback(prometheus.stop)
        started = Chain(cluster, exporter, prometheus, alertmanager, server, runner, state, time.monotonic())
        chain_ref.append(started)
        yield started


def _cordoned_by(cluster: GpuCluster, node: str) -> str | None:
    obj = cluster.node(node)
    if obj is None or not obj["spec"].get("unschedulable"):
        return None
    annotation: str | None = obj["metadata"].get("annotations", {}).get(ANN_CORDONED_BY)
    return annotation


def test_idle_alert_drains_and_removes_and_a_resolved_alert_rolls_back(chain: Chain) -> None:
    cluster, state = chain.cluster, chain.state
    a, b, c = cluster.nodes
    timings: dict[str, float] = {}
    assert cluster.asg()["DesiredCapacity"] == 3

    # 1. A idle for the window: the real Alertmanager delivers `firing` for A with the bearer token.
    timings["firing A"] = wait_until(
        lambda: bool(chain.delivered("firing", a.name)),
        60,
        "Alertmanager's firing for A",
        describe=chain.describe,
    )
    [firing] = chain.delivered("firing", a.name)
    assert firing.user_agent.startswith("Alertmanager/0.25"), firing.user_agent
    assert firing.authorization == f"Bearer {TOKEN}"
    assert firing.payload["version"] == "4" and firing.payload["receiver"] == "gpu-rightsizer"
    assert firing.payload["groupLabels"] == {"alertname": "GPUNodeIdle", "node": a.name}
    assert firing.status == 202, firing.answer
    [started] = firing.answer["started"]
    assert started["node"] == a.name
    execution_a = started["execution_id"]

    # THEN the workflow validated A on the real Prometheus, drained it and removed exactly its instance.
    wait_until(lambda: execution_a in chain.runner.results, 60, "A's drain to end", describe=chain.describe)
    result_a = chain.runner.results[execution_a]
    assert (result_a.status, result_a.step) == ("succeeded", "verify"), (result_a, chain.describe())
    timings["A removed"] = time.monotonic() - chain.started_at
    group = cluster.asg()
    assert group["DesiredCapacity"] == 2
    assert cluster.in_service() == {b.instance_id, c.instance_id}
    assert cluster.instance_state(a.instance_id) in ("shutting-down", "terminated")
    reasons_a = [e["reason"] for e in cluster.double.events(involved_name=a.name)]
    assert reasons_a == ["CordonedIdle", "ScaledIn"], reasons_a
    record_a = state.load(execution_a)
    assert (
        record_a is not None
        and record_a.details["trigger"] == f"alert:{firing.payload['alerts'][0]['fingerprint']}"
    )
    assert record_a.details["dry_run"] is False and record_a.instance_id == a.instance_id
    final_a = state.entries(execution_id=execution_a)[-1]
    assert (final_a.node, final_a.instance_id, final_a.step, final_a.result) == (
        a.name,
        a.instance_id,
        "verify",
        "applied",
    )
    assert final_a.hourly_savings_usd == pytest.approx(1.212)
    assert state.get(a.name) is None
    # AND B and C were never touched
    for other in (b, c):
        node = cluster.node(other.name)
        assert node is not None and not node["spec"].get("unschedulable"), other.name
        assert cluster.double.events(involved_name=other.name) == []
    assert not [r for r in cluster.double.requests if r.path.endswith("/eviction")]
    assert cluster.double.get_pod("default", "model-cache-0") is not None

    # AND A's Node and series go with its instance; the alert resolves and that delivery is a no-op.
    wait_until(
        lambda: cluster.node(a.name) is None and not chain.exporter.serves(a.name), 30, "A's Node to go"
    )
    wait_until(
        lambda: bool(chain.delivered("resolved", a.name)), 45, "resolved for A", describe=chain.describe
    )
    [resolved_a] = chain.delivered("resolved", a.name)
    assert resolved_a.status == 200, resolved_a.answer
    assert resolved_a.answer.get("cancelled", []) == [] and resolved_a.answer.get("started", []) == []

    # 2. C turns idle: alerted once the window is clean; its drain cordons C and evicts the slow pod.
    chain.exporter.set_profile(c.name, "idle")
    switched = time.monotonic()
    wait_until(lambda: bool(chain.delivered("firing", c.name)), 60, "firing for C", describe=chain.describe)
    timings["firing C after idle"] = time.monotonic() - switched
    [firing_c] = chain.delivered("firing", c.name)
    assert firing_c.status == 202, firing_c.answer
    [started_c] = firing_c.answer["started"]
    execution_c = started_c["execution_id"]

    def c_draining() -> bool:
        cache = cluster.double.get_pod("default", "model-cache-0")
        terminating = cache is not None and bool(cache["metadata"].get("deletionTimestamp"))
        return _cordoned_by(cluster, c.name) == execution_c and terminating

    wait_until(c_draining, 45, "C cordoned with its pod terminating", describe=chain.describe)
    assert execution_c not in chain.runner.results
    lease = state.get(c.name)
    assert lease is not None and lease.owner == execution_c and not lease.cancel_requested

    # WHEN C is busy again before its pod is gone THEN the rule resolves and Alertmanager says so.
    chain.exporter.set_profile(c.name, "busy")
    switched = time.monotonic()
    wait_until(
        lambda: bool(chain.delivered("resolved", c.name)), 45, "resolved for C", describe=chain.describe
    )
    timings["resolved C after busy"] = time.monotonic() - switched
    [resolved_c] = chain.delivered("resolved", c.name)
    assert resolved_c.status == 202, resolved_c.answer
    assert resolved_c.answer["cancelled"] == [
        {"node": c.name, "epoch": lease.epoch, "fingerprint": resolved_c.payload["alerts"][0]["fingerprint"]}
    ]
    # THEN the drain honours the cancel of its epoch: rolled back, C uncordoned, nothing scaled.
    wait_until(
        lambda: execution_c in chain.runner.results, 30, "C's drain to roll back", describe=chain.describe
    )
    result_c = chain.runner.results[execution_c]
    assert result_c.status == "abandoned" and "cancelled" in result_c.message, result_c
    timings["C rolled back"] = time.monotonic() - chain.started_at
    node_c = cluster.node(c.name)
    assert node_c is not None and not node_c["spec"].get("unschedulable")
    assert ANN_CORDONED_BY not in node_c["metadata"].get("annotations", {})
    reasons_c = [e["reason"] for e in cluster.double.events(involved_name=c.name)]
    assert reasons_c == ["CordonedIdle", "RolledBack"], reasons_c
    assert cluster.asg()["DesiredCapacity"] == 2
    assert cluster.in_service() == {b.instance_id, c.instance_id}
    final_c = state.entries(execution_id=execution_c)[-1]
    assert (final_c.node, final_c.result) == (c.name, "abandoned") and "cancelled" in final_c.reason
    assert state.get(c.name) is None

    # AND B was never alerted nor touched, from start to end.
    assert not [d for d in chain.deliveries if any(node == b.name for _, node in d.alerts())]
    node_b = cluster.node(b.name)
    assert node_b is not None and not node_b["spec"].get("unschedulable")
    assert cluster.double.events(involved_name=b.name) == []
    assert all(d.status in (200, 202) for d in chain.deliveries), chain.describe()
    timings["total"] = time.monotonic() - chain.started_at
    print("e2e timings (s):", {k: round(v, 1) for k, v in timings.items()})

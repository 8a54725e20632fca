"""Issue 14 item 4: no log level of a Lambda function prints a credential — the real handlers at DEBUG.

Each function runs in its own interpreter as the Lambda Python runtime runs it
(``tests/support/lambda_at_debug.py``: root handler at DEBUG installed before the import, Powertools at
DEBUG, uncaught errors printed by the runtime), against moto in server mode, the Kubernetes API double and
a real Prometheus, with a credential of every kind planted:

* the role's AWS access key, secret key and session token (the environment, as Lambda provides them);
* the Kubernetes bearer token (kubeconfig; the double accepts only it);
* Prometheus' bearer token (Secrets Manager, ``RIGHTSIZER_PROMETHEUS_AUTH=bearer``);
* the webhook token (Secrets Manager), the approval links' HMAC key derived from it and the links'
  signed tokens; the Step Functions task token a drain waits on; a wrong token an attacker sends.

The flow covers every handler and every path that handles a credential: the scheduled assessment, a drain
that asks for approval (validate, request with SNS links), the webhook (an alert with the right and the
wrong token, the approval link shown and decided, then reused), the approved drain's steps (cordon,
evictions, …) and an off-hours tick acting on a node group. No secret may appear in any captured output.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

import boto3
import pytest

from rightsizer.domain.approval import derive_key
from rightsizer.localserve import function_url_event
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
from tests.builders import AT, STEP
from tests.integration.test_handlers import OFFHOURS_A10G
from tests.integration.test_snapshot_cli import dcgm_families, seed_cluster
from tests.integration.test_statemachine import load_asl
from tests.unit.test_webhook import alert, payload

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TABLE = "rightsizer-state"
NODE = "gpu-idle"
EXECUTION = "gpu-idle-5ec7e7c0ffee0001"
SECRETS = {
    "aws_access_key": "AKIAPLANTED0LAMBDA77",
    "aws_secret_key": "planted/Lambda+Secret0Key7xYz9aBcDeFgHiJkLmNo",
    "aws_session_token": "IQoJb3JpZ2luX2VjEPlantedLambdaSession0Token7//////////wEaCXVzLWVhc3QtMSJH",
    "kube_token": "kubePlantedLambda0Bearer7-AbCdEfGhIjKlMnOpQr",
    "prometheus_token": "promPlantedLambda0Bearer7-StUvWxYz01234567",
    "webhook_token": "webhookPlantedLambda0Token7-QrStUvWxYz012345",
    "task_token": "AQCEAAAAKgAAAAMPlantedLambdaTaskToken0Seven7777AAAAAAAAAAAAAAA=",
    "wrong_token": "attackerPlantedLambda0Token7-wrong-98765432",
    "approval_link_key": "linkKeyPlantedLambda0Secret7-AbCdEfGhIjKlMnOp",
}
# The approval links' HMAC key (from its own secret, issue 26), as bytes would print: hex and base64.
_KEY = derive_key(SECRETS["approval_link_key"])
SECRETS["approval_key_hex"] = _KEY.hex()
SECRETS["approval_key_b64"] = base64.urlsafe_b64encode(_KEY).decode().rstrip("=")


def families_at_tick_and_from_now() -> dict[str, list[Any]]:
    """The DCGM history of ``test_snapshot_cli`` before the tick of ``events/assess-tick.json`` and again
    around the real now, reaching 10 minutes past it: drain steps take their time from the clock, and on a
    loaded machine minutes pass between the fixture and the last step — the newest sample stays fresh."""
    shift = (int(time.time()) // STEP * STEP) + 600 - AT.timestamp()
    both: dict[str, list[Any]] = {}
    for metric, series in dcgm_families().items():
        for labels, samples in series:
            both.setdefault(metric, []).append((labels, [*samples, *((t + shift, v) for t, v in samples)]))
    return both


def leaked(text: str) -> list[str]:
    """The names of the planted secrets that appear in ``text`` (whole, or any 12-character piece)."""
    found = []
    for name, secret in SECRETS.items():
        pieces = {secret[i : i + 12] for i in range(0, len(secret) - 11, 4)}
        if any(piece in text for piece in pieces):
            found.append(name)
    return found


@dataclass
class Stack:
    """What ``sam deploy`` would have created, on the local servers, and each function's environment."""

    env: dict[str, str]
    queue_url: str
    sqs: Any
    double: KubernetesDouble
    tmp: Path
    logs: list[str]

    def invoke(self, function: str, events: list[dict[str, Any]], **extra_env: str) -> list[dict[str, Any]]:
        """Run ``function`` with ``events`` in its own interpreter at DEBUG; keeps everything it printed."""
        index = len(self.logs)
        events_path, results_path = self.tmp / f"events-{index}.json", self.tmp / f"results-{index}.json"
        events_path.write_text(json.dumps(events), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests/support/lambda_at_debug.py"), function, str(events_path),
             str(results_path)],
            cwd=ROOT,
            env={**self.env, **extra_env},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )  # fmt: skip
        self.logs.append(f"== {function}\n{done.stdout}\n{done.stderr}")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        results: list[dict[str, Any]] = json.loads(results_path.read_text(encoding="utf-8"))
        return results

    def approval_links(self) -> dict[str, str]:
        """action → link, from the approval request the drain published (SNS → SQS)."""
        messages = self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=2
        )
        (message,) = messages.get("Messages", [])
        text = json.loads(message["Body"])["Message"]
        return {
            m.group(1).lower(): m.group(2)
            for m in re.finditer(r"^(Approve|Reject|Snooze)[^:]*:\s+(https://\S+)$", text, re.MULTILINE)
        }


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: double\n"
        f"clusters:\n- name: double\n  cluster:\n    server: {server}\n"
        f"users:\n- name: rightsizer\n  user:\n    token: {SECRETS['kube_token']}\n"
        "contexts:\n- name: double\n  context:\n    cluster: double\n    user: rightsizer\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def stack(
    tmp_path: Path, moto_server: MotoServer, gpu_cluster: BuiltCluster, prometheus_factory: Any
) -> Iterator[Stack]:
    session = boto3.session.Session(region_name="us-east-1")
    client = lambda name: session.client(name, endpoint_url=moto_server.endpoint_url)  # noqa: E731
    create_state_table(client("dynamodb"), TABLE)
    machine = client("stepfunctions").create_state_machine(
        name="rightsizer-drain",
        definition=json.dumps(load_asl("arn:aws:lambda:us-east-1:123456789012:function:rightsizer-drain")),
        roleArn="arn:aws:iam::123456789012:role/rightsizer-drain-machine",
    )
    secrets = client("secretsmanager")
    secrets.create_secret(Name="rightsizer/webhook-token", SecretString=SECRETS["webhook_token"])
    secrets.create_secret(Name="rightsizer/approval-link-key", SecretString=SECRETS["approval_link_key"])
    secrets.create_secret(Name="rightsizer/prometheus", SecretString=SECRETS["prometheus_token"])
    sns, sqs = client("sns"), client("sqs")
    topic = sns.create_topic(Name="rightsizer-alarms")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="approvals")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    autoscaling = client("autoscaling")
    for group in gpu_cluster.nodegroups.values():  # the node groups opted in (terminate, off-hours)
        autoscaling.create_or_update_tags(
            Tags=[
                {"ResourceId": group.asg_name, "ResourceType": "auto-scaling-group", "Key": key,
                 "Value": value, "PropagateAtLaunch": False}
                for key, value in (("rightsizer.io/enabled", "true"),
                                   (f"k8s.io/cluster-autoscaler/{gpu_cluster.cluster}", "owned"))
            ]
        )  # fmt: skip
    prometheus: PrometheusServer = prometheus_factory(families_at_tick_and_from_now())
    with KubernetesDouble(seed=7, resource_api_versions=None) as double:
        double.accept_tokens(SECRETS["kube_token"])
        seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
        base = {
            k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RIGHTSIZER_", "POWERTOOLS_"))
        }
        env = {
            **base,
            "PYTHONPATH": str(ROOT),
            # the Lambda environment: the role's session credentials, the log levels
            "AWS_ACCESS_KEY_ID": SECRETS["aws_access_key"],
            "AWS_SECRET_ACCESS_KEY": SECRETS["aws_secret_key"],
            "AWS_SESSION_TOKEN": SECRETS["aws_session_token"],
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_LAMBDA_LOG_LEVEL": "DEBUG",
            "POWERTOOLS_LOG_LEVEL": "DEBUG",
            "LOG_LEVEL": "DEBUG",
            "POWERTOOLS_METRICS_NAMESPACE": "GPURightsizer",
            # the template's variables, live (DryRun=false), approval required
            "RIGHTSIZER_CLUSTER_NAME": gpu_cluster.cluster,
            "RIGHTSIZER_TABLE": TABLE,
            "RIGHTSIZER_DRY_RUN": "false",
            "RIGHTSIZER_PROMETHEUS_URL": prometheus.url,
            "RIGHTSIZER_PROMETHEUS_AUTH": "bearer",
            "RIGHTSIZER_PROMETHEUS_SECRET": "secretsmanager:rightsizer/prometheus",
            "RIGHTSIZER_POLICY_INLINE": (
                "dry_run: false\napproval: required\nmax_nodes_per_run: 10\nmax_nodes_per_node_group: 10\n"
                "cooldown: 0s\ndrain_failure_backoff: 0s\n"
            ),
            "RIGHTSIZER_OFFHOURS": "{}",
            "RIGHTSIZER_STATE_MACHINE_ARN": machine["stateMachineArn"],
            "RIGHTSIZER_WEBHOOK_TOKEN_SECRET": "rightsizer/webhook-token",
            "RIGHTSIZER_APPROVAL_KEY_SECRET": "rightsizer/approval-link-key",
            "RIGHTSIZER_APPROVAL_TOPIC_ARN": topic,
            "RIGHTSIZER_APPROVAL_URL": "https://abc123.lambda-url.us-east-1.on.aws/",
            "RIGHTSIZER_TRACING": "false",
            # test-only: moto for every client, the double through a kubeconfig
            "RIGHTSIZER_AWS_ENDPOINT_URL": moto_server.endpoint_url,
            "RIGHTSIZER_KUBE_CONTEXT": "double",
            "KUBECONFIG": str(_kubeconfig(tmp_path / "kubeconfig", double.base_url)),
        }
        yield Stack(env, queue_url, sqs, double, tmp_path, [])


def _link_event(link: str, method: str) -> dict[str, Any]:
    """Opening an approval link (GET, the confirm page) or confirming it (POST, the token as a form)."""
    parts = urlsplit(link)
    if method == "GET":
        return function_url_event(method="GET", path=parts.path, query=parts.query, headers={}, body=b"")
    token = parse_qs(parts.query)["token"][0]
    form = {"content-type": "application/x-www-form-urlencoded"}
    return function_url_event(
        method="POST", path=parts.path, headers=form, body=urlencode({"token": token}).encode()
    )


def _alert_event(token: str) -> dict[str, Any]:
    body = json.dumps(payload(alert("firing", "gpu-idle-2", "5ec7e7f1a9e2b001"))).encode()
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    return function_url_event(method="POST", path="/", headers=headers, body=body)


@pytest.mark.timeout(900)  # five interpreters, each importing boto3, Powertools and the product
def test_every_lambda_handler_at_debug_logs_no_credential(stack: Stack) -> None:
    events = ROOT / "events"
    tick = json.loads((events / "assess-tick.json").read_text(encoding="utf-8"))
    offhours_tick = json.loads((events / "offhours-tick.json").read_text(encoding="utf-8"))

    # WHEN the scheduled assessment runs (it plans over Prometheus with the bearer token, starts drains)
    (assessed,) = stack.invoke("assess", [tick])
    assert assessed["result"]["verdicts"].get("idle", 0) >= 1, assessed

    # AND a drain of the idle node validates and asks for approval (SNS, with signed links)
    request = {"execution_id": EXECUTION, "node": NODE, "trigger": "schedule", "hourly_savings_usd": 1.2}
    started, validated, asked = stack.invoke(
        "drain",
        [
            {"action": "start", "request": request},
            {"action": "step", "execution_id": EXECUTION},
            {"action": "request_approval", "execution_id": EXECUTION, "task_token": SECRETS["task_token"]},
        ],
    )
    assert started["result"]["status"] == "running", started
    assert "result" in validated and "result" in asked, (validated, asked)
    links = stack.approval_links()
    assert set(links) >= {"approve", "reject"}, links

    # AND the webhook takes an alert with the right token and one with a wrong token, shows the approval
    # page, takes the approval and refuses its reuse
    right, wrong, shown, approved, reused = stack.invoke(
        "alert_webhook",
        [
            _alert_event(SECRETS["webhook_token"]),
            _alert_event(SECRETS["wrong_token"]),
            _link_event(links["approve"], "GET"),
            _link_event(links["approve"], "POST"),
            _link_event(links["approve"], "POST"),
        ],
    )
    codes = [r["result"]["statusCode"] for r in (right, wrong, shown, approved, reused)]
    assert codes == [202, 401, 200, 200, 409], (codes, approved)

    # AND the approved drain steps on: cordon, evictions; once the evicted pod is gone, removal of the
    # instance from its Auto Scaling group
    step = {"action": "step", "execution_id": EXECUTION}
    steps = stack.invoke("drain", [step] * 5)
    assert [s["result"]["step"] for s in steps] == ["approval", "cordon", "revalidate", "evict", "wait"], (
        steps
    )
    stack.double.advance(600)  # the evicted pod's grace period ends
    steps = stack.invoke("drain", [step] * 4)
    outcomes = [s["result"] for s in steps if "result" in s]
    assert outcomes and outcomes[-1]["status"] == "succeeded", steps
    assert stack.double.get_node(NODE)["spec"].get("unschedulable") is True  # type: ignore[index]

    # AND an off-hours tick scales a node group down (drains through the state machine, saves its size)
    (converged,) = stack.invoke("offhours", [offhours_tick], RIGHTSIZER_OFFHOURS=json.dumps(OFFHOURS_A10G))
    assert converged["result"]["groups"], converged

    # AND an assessment whose Kubernetes token was revoked fails, its error printed by the runtime itself
    stack.double.revoke_token(SECRETS["kube_token"])
    (refused,) = stack.invoke("assess", [tick])
    assert refused.get("errorType"), refused

    # THEN every function logged at DEBUG (each Powertools logger at DEBUG too: lambda_at_debug checks),
    # and no planted credential is anywhere
    logs = "\n".join(stack.logs)
    (stack.tmp / "logs.txt").write_text(logs, encoding="utf-8")  # kept with the test's tmp_path
    assert re.search(r"^\[DEBUG\]\t[^\t]+\trightsizer", logs, re.MULTILINE), "no DEBUG line of ours"
    services = {json.loads(line).get("service") for line in logs.splitlines() if line.startswith('{"level"')}
    assert services == {"assess", "drain", "alert_webhook", "offhours"}  # Powertools output is in the logs
    assert leaked(logs) == []
    # nor are the approval links' tokens (each decides a drain), which only the SNS message carries
    tokens = [parse_qs(urlsplit(link).query)["token"][0] for link in links.values()]
    assert tokens and [t for t in tokens if t[-24:] in logs] == []

"""Issue 26 item 2: credentials are stripped from URLs at the source — no logger (ours, httpx, botocore,
urllib3) and no output stream ever shows one, at any verbosity.

A Prometheus URL with ``user:password@`` printed the password 14 times at default verbosity through
httpx's INFO request lines. Here distinct secrets are planted in every place a user can put one — the
Prometheus URL's userinfo and a credential query parameter, the Kubernetes bearer token, the AWS access
key, secret key and session token, the webhook token, all through the environment and the config — and
the real ``rightsizer`` entry point runs in its own interpreter (``plan --config`` and ``snapshot``, live,
against a real Prometheus, the Kubernetes double and moto), at default verbosity and at ``-v``. Its
stdout, its stderr and every file it wrote are grepped for each secret (whole or any 12-character piece).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
from tests.builders import AT, STEP, rfc
from tests.integration.test_log_secrets import _env
from tests.support.planted_cluster import JOB, dcgm_families, seed_cluster

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PLANTED = {
    "url_password": "urlPassw0rd-Planted26-QrStUvWx",
    "url_user": "urlUserPlanted26-AbCd",
    "query_token": "queryTok3n-Planted26-EfGhIjKlMn",
    "kube_token": "kubeBearer-Planted26-OpQrStUvWxYz",
    "webhook_token": "webhookTok-Planted26-0123456789ab",
    "aws_access_key": "AKIAPLANTED26XYZ0123",
    "aws_secret_key": "planted26/Secret+Key0aBcDeFgHiJkLmNoPqRsTu",
    "aws_session_token": "IQoJb3JpZ2luX2VjEPlanted26SessionToken0//////////wEaCXVzLWVhc3QtMSJH",
}


def leaked(text: str) -> list[str]:
    """The planted secrets in ``text``, whole or as any 12-character piece."""
    return [
        name
        for name, secret in PLANTED.items()
        if any(secret[i : i + 12] in text for i in range(0, len(secret) - 11, 3))
    ]


@pytest.fixture
def double() -> Any:
    with KubernetesDouble(seed=26, resource_api_versions=None) as d:
        d.accept_tokens(PLANTED["kube_token"])
        yield d


@pytest.fixture
def prometheus(prometheus_factory: Any) -> PrometheusServer:
    server: PrometheusServer = prometheus_factory(dcgm_families())
    return server


@pytest.mark.timeout(900)
def test_no_planted_credential_reaches_any_output_at_any_verbosity(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    prometheus: PrometheusServer,
) -> None:
    # GIVEN a config whose Prometheus URL carries userinfo and a credential query parameter, a kubeconfig
    # with a planted bearer token, planted AWS credentials and webhook token in the environment
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: double\n"
        f"clusters:\n- name: double\n  cluster:\n    server: {double.base_url}\n"
        f"users:\n- name: rightsizer\n  user:\n    token: {PLANTED['kube_token']}\n"
        "contexts:\n- name: double\n  context:\n    cluster: double\n    user: rightsizer\n",
        encoding="utf-8",
    )
    host = prometheus.url.removeprefix("http://")
    url = f"http://{PLANTED['url_user']}:{PLANTED['url_password']}@{host}/?access_token={PLANTED['query_token']}"
    config = tmp_path / "rightsizer.yaml"
    config.write_text(
        f"cluster:\n  name: {gpu_cluster.cluster}\n  context: double\n  kubeconfig: {kubeconfig}\n"
        f"prometheus:\n  url: '{url}'\n  step: {STEP}s\n  job: {JOB}\n"
        f"aws:\n  region: us-east-1\n  endpoint_url: {moto_server.endpoint_url}\n  pricing_api: false\n",
        encoding="utf-8",
    )
    env = _env(RIGHTSIZER_WEBHOOK_TOKEN=PLANTED["webhook_token"])
    env.update(
        AWS_ACCESS_KEY_ID=PLANTED["aws_access_key"],
        AWS_SECRET_ACCESS_KEY=PLANTED["aws_secret_key"],
        AWS_SESSION_TOKEN=PLANTED["aws_session_token"],
    )

    outputs: dict[str, str] = {}
    for verbosity in ([], ["-v"]):
        for command in (
            ["plan", "--config", str(config), "--at", rfc(AT), "--json"],
            ["plan", "--config", str(config), "--at", rfc(AT)],
            [
                "snapshot",
                "--config",
                str(config),
                "--out",
                str(tmp_path / f"snap{len(outputs)}"),
                "--at",
                rfc(AT),
            ],
        ):
            # WHEN the real entry point runs, in its own interpreter, at this verbosity
            done = subprocess.run(
                [sys.executable, "-m", "rightsizer.cli", *verbosity, *command],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            name = " ".join([*verbosity, command[0], *command[-1:]])
            assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
            outputs[f"{name} stdout"] = done.stdout
            outputs[f"{name} stderr"] = done.stderr

    # THEN it really read Prometheus through the URL (the request lines are there), at DEBUG too ...
    logs = "".join(outputs.values())
    assert "HTTP Request: POST http://" in logs and "/api/v1/query" in logs, logs[-3000:]
    assert " DEBUG rightsizer" in logs
    assert '"verdict": "idle"' in logs
    # ... the query parameter still went with every request (redacted in the log, not dropped) ...
    assert "access_token=<redacted>" in logs
    # ... AND no stream of any run, and no file a snapshot wrote, holds any planted secret
    for path in tmp_path.glob("snap*/**/*"):
        if path.is_file():
            outputs[str(path.relative_to(tmp_path))] = path.read_text(encoding="utf-8", errors="replace")
    found = {where: leaked(text) for where, text in outputs.items() if leaked(text)}
    assert found == {}, found
    assert os.environ.get("AWS_SECRET_ACCESS_KEY") != PLANTED["aws_secret_key"]  # planted only in the child

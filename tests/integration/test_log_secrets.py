"""Issue 14 item 4: no log level prints a credential — the demo and ``serve`` at DEBUG, grepped.

Both run as a user runs them, in their own interpreter through the ``rightsizer`` entry point with
``-v`` (so the CLI's own logging configuration is what is tested), with credentials of every kind
planted: an AWS access key, secret key and session token (the moto server accepts any), the Kubernetes
API bearer token, the webhook token, and a wrong token an attacker sends. None may appear in the captured
stdout and stderr.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import MotoServer
from tests.unit.test_webhook import alert, payload

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "aws_access_key": "AKIAPLANTED0LOGTEST7",
    "aws_secret_key": "planted/Secret+Key0LogTest7xYz9aBcDeFgHiJkLmN",
    "aws_session_token": "IQoJb3JpZ2luX2VjEPlantedSessionToken0LogTest7//////////wEaCXVzLWVhc3QtMSJH",
    "kube_token": "kubePlantedBearer0LogTest7-AbCdEfGhIjKlMnOp",
    "webhook_token": "webhookPlanted0LogTest7-QrStUvWxYz0123456789",
    "wrong_token": "attackerPlanted0LogTest7-wrong-9876543210",
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RIGHTSIZER_"))}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": SECRETS["aws_access_key"],
            "AWS_SECRET_ACCESS_KEY": SECRETS["aws_secret_key"],
            "AWS_SESSION_TOKEN": SECRETS["aws_session_token"],
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "PYTHONPATH": str(ROOT),
            **extra,
        }
    )
    return env


def leaked(text: str, names: list[str]) -> list[str]:
    """The names of the planted secrets that appear in ``text`` (whole, or any 12-character piece)."""
    found = []
    for name in names:
        secret = SECRETS[name]
        pieces = {secret[i : i + 12] for i in range(0, len(secret) - 11, 4)}
        if any(piece in text for piece in pieces):
            found.append(name)
    return found


@pytest.mark.timeout(900)  # the whole demo in its own interpreter: ~70 s alone, minutes on a loaded machine
def test_the_demo_at_debug_logs_no_credential() -> None:
    # WHEN the whole demo runs at -v with planted AWS credentials and a planted Kubernetes token
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests/support/debug_demo.py")],
        cwd=ROOT,
        env=_env(RIGHTSIZER_TEST_KUBE_TOKEN=SECRETS["kube_token"]),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    logs = done.stdout + done.stderr

    # THEN it ran (a drain and a resize, at DEBUG) and no credential is in its output
    assert done.returncode == 0, logs[-3000:]
    assert re.search(r" DEBUG rightsizer", logs), "the run did not log at DEBUG"
    assert "scale_in" in logs
    assert leaked(logs, ["aws_access_key", "aws_secret_key", "aws_session_token", "kube_token"]) == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _post(port: int, headers: list[tuple[str, str]], body: bytes) -> int:
    head = [
        "POST /alertmanager HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    head += [f"{k}: {v}" for k, v in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_serve_at_debug_logs_no_credential(tmp_path: Path, moto_server: MotoServer) -> None:
    # GIVEN `rightsizer -v serve` with a planted webhook token, on moto and the Kubernetes double (which
    # takes the planted Kubernetes token); the alert names a node the cluster does not have, so the drain
    # it starts reads the API and ends at validate
    double = KubernetesDouble(seed=3)
    double.start()
    double.accept_tokens(SECRETS["kube_token"])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: double\n"
        f"clusters:\n- name: double\n  cluster:\n    server: {double.base_url}\n"
        f"users:\n- name: rightsizer\n  user:\n    token: {SECRETS['kube_token']}\n"
        "contexts:\n- name: double\n  context:\n    cluster: double\n    user: rightsizer\n",
        encoding="utf-8",
    )
    config = tmp_path / "rightsizer.yaml"
    config.write_text(
        f"cluster:\n  name: prod-eks\n  context: double\n  kubeconfig: {kubeconfig}\n"
        f"aws:\n  region: us-east-1\n  endpoint_url: {moto_server.endpoint_url}\n",
        encoding="utf-8",
    )
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "rightsizer.cli", "-v", "serve", "--config", str(config), "--port", str(port)],
        cwd=ROOT,
        env=_env(RIGHTSIZER_WEBHOOK_TOKEN=SECRETS["webhook_token"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        body = json.dumps(payload(alert("firing", "gpu-1", "fp-1"))).encode()
        good = ("Authorization", f"Bearer {SECRETS['webhook_token']}")
        bad = ("Authorization", f"Bearer {SECRETS['wrong_token']}")
        # WHEN a delivery is accepted, one refused, one with two credentials, one with a wrong basic auth
        assert _post(port, [good, ("Content-Type", "application/json")], body) == 202
        assert _post(port, [bad], body) == 401
        assert _post(port, [good, bad], body) == 400
        assert _post(port, [("Authorization", f"Basic {SECRETS['wrong_token']}")], body) == 401
        # the started drain reads the node through the API (with the planted token), ends, logs why
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            r.path.endswith("/nodes/gpu-1") for r in double.requests
        ):
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        double.stop()
        server.send_signal(signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()

    # THEN the log is at DEBUG, shows the requests, and holds none of the credentials
    assert re.search(r" DEBUG rightsizer", out), out[-2000:]
    assert "webhook:" in out
    assert "node_not_found" in out, out[-4000:]  # the drain ran against the API with the planted token
    assert (
        leaked(out, ["webhook_token", "wrong_token", "aws_access_key", "aws_secret_key", "aws_session_token"])
        == []
    )

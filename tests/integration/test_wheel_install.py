"""A plain ``pip install`` of the wheel works: ``serve`` answers, ``plan --snapshot`` plans, ``demo`` without
its extra says what to install (docs/architecture.md §2 "Contracts": the core imports no handler module).

The wheel is built from this checkout and installed, without extras, into a fresh virtual environment that
cannot see the development one; every command runs as the installed console script.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "wheel-test-token"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a fresh venv holding the wheel of this checkout (no extras)."""
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(work), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = work.glob("gpu_rightsizer-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # Without PYTHONPATH: a checkout on it (functions/ with its egg-info) reads to pip as the package
    # already installed, and the wheel would not be (the developers' targeted runs set it).
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        timeout=900,
        env=_env(),
    )
    return venv / "bin"


def _env() -> dict[str, str]:
    # Nothing of the development tree leaks in: no PYTHONPATH, a neutral working directory.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RIGHTSIZER_WEBHOOK_TOKEN"] = TOKEN
    return env


def test_the_wheel_ships_no_handler_module_and_no_dev_tool(installed: Path) -> None:
    probe = (
        "import importlib.util as u\n"
        "print([m for m in ('alert_webhook', 'assess', 'drain', 'offhours', 'tests') if u.find_spec(m)])\n"
    )
    out = subprocess.run(
        [str(installed / "python"), "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
        cwd="/",
    )
    assert out.stdout.strip() == "[]"


def test_plan_snapshot_plans_the_packaged_example(installed: Path) -> None:
    where = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "from rightsizer.cli import example_snapshot_dir; print(example_snapshot_dir())",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
        cwd="/",
    ).stdout.strip()
    assert "site-packages" in where

    done = subprocess.run(
        [str(installed / "rightsizer"), "plan", "--snapshot", where, "--json"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd="/",
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["nodes"] and plan["dry_run"] is True
    assert [a["node"] for a in plan["actions"] if a["kind"] == "scale_in"] == ["ip-10-0-83-246.ec2.internal"]


def test_demo_without_the_extra_exits_2_saying_what_to_install(installed: Path) -> None:
    done = subprocess.run(
        [str(installed / "rightsizer"), "demo"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd="/",
        timeout=120,
    )

    assert done.returncode == 2
    assert "install gpu-rightsizer[demo]" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def serving(installed: Path, tmp_path: Path) -> Iterator[str]:
    """``rightsizer serve`` of the installed wheel on a free loopback port; yields its URL."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: none\n"
        "clusters:\n- name: none\n  cluster:\n    server: https://127.0.0.1:1\n"
        "users:\n- name: u\n  user:\n    token: t\n"
        "contexts:\n- name: none\n  context:\n    cluster: none\n    user: u\n",
        encoding="utf-8",
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "cluster": {
                    "name": "wheel",
                    "region": "us-east-1",
                    "context": "none",
                    "kubeconfig": str(kubeconfig),
                },
                "aws": {"region": "us-east-1", "endpoint_url": "http://127.0.0.1:1"},
            }
        ),
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [str(installed / "rightsizer"), "serve", "--config", str(config), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd="/",
    )
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                break
            found = re.search(r"webhook on (http://127\.0\.0\.1:\d+/)", line)
            url = found.group(1) if found else None
        assert url is not None, f"serve did not start (exit {process.poll()})"
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def test_serve_from_the_wheel_answers_a_post(serving: str) -> None:
    payload = {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": "resolved",
        "receiver": "rightsizer",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": [],
    }
    with httpx.Client(timeout=10) as client:
        unauthorized = client.post(serving, json=payload)
        answered = client.post(serving, json=payload, headers={"Authorization": f"Bearer {TOKEN}"})

    assert unauthorized.status_code == 401
    assert answered.status_code == 200, answered.text

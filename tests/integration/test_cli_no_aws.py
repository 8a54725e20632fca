"""Every ``rightsizer`` sub-command on a machine with no AWS configuration (issue 27 item 3).

Before: ``status|history|approve|reject|snooze --stack NAME`` printed a 52-line botocore ``NoRegionError``
traceback and exited 1; missing credentials exited 1 for ``plan``/``snapshot``/``apply``/``offhours`` but 2
for ``status``/``savings``; ``prices`` printed two lines. Now each prints exactly one line naming the fix
(``rightsizer: error: …``) and exits 2 (a configuration error), or one ``rightsizer: failed: …`` line and
exits 1 when something it reached failed (``backtest`` against an unreachable Prometheus).

Each command runs in a fresh interpreter with an environment holding no AWS variable, no config or
credentials file and the instance metadata service off, as on a new operator's laptop.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rightsizer.cli import build_parser

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = """\
cluster:
  name: prod-eks
prometheus:
  url: http://127.0.0.1:9
aws:
  table: rightsizer-state
"""
STACK = ["--stack", "gpu-rightsizer"]
#: (argv after ``rightsizer``, exit code, what the one line must say)
CASES: list[tuple[list[str], int, str]] = [
    (["status", *STACK], 2, "no AWS region: give --region REGION or the stack's ARN, or set AWS_REGION"),
    (["history", *STACK], 2, "no AWS region"),
    (["savings", *STACK], 2, "no AWS region"),
    (["approve", "exec-1", *STACK], 2, "no AWS region"),
    (["reject", "exec-1", *STACK], 2, "no AWS region"),
    (["snooze", "exec-1", *STACK], 2, "no AWS region"),
    (["restore", "--all", *STACK], 2, "no AWS region"),
    (["restore", "Deployment/ml/llm", "--config", "{config}"], 2, "no AWS credentials found"),
    (["status", "--stack", "gpu-rightsizer", "--region", "eu-west-1"], 2, "no AWS credentials found"),
    (["status", "--config", "{config}"], 2, "no AWS credentials found"),
    (["savings", "--config", "{config}"], 2, "no AWS credentials found"),
    (["plan", "--config", "{config}"], 2, "no AWS credentials found"),
    (["snapshot", "--config", "{config}", "--out", "{tmp}/snap"], 2, "no AWS credentials found"),
    (["apply", "--config", "{config}"], 2, "no AWS credentials found"),
    (["offhours", "status", "--config", "{config}"], 2, "no AWS credentials found"),
    (["prices", "--config", "{config}"], 2, "no AWS credentials found"),
    (
        [
            "backtest",
            "--prometheus",
            "--config",
            "{config}",
            "--from",
            "2026-11-01T00:00:00Z",
            "--to",
            "{to}",
        ],
        1,
        "Connection refused",
    ),
    (
        ["serve", "--config", "{config}", "--port", "0"],
        2,
        "set webhook.token_secret or RIGHTSIZER_WEBHOOK_TOKEN",
    ),
    (["validate"], 2, "give --config FILE, --policy FILE and/or --samconfig FILE"),
    (["fleet", "status", *STACK], 2, "no AWS region: give --region REGION or the stack's ARN"),
    (["fleet", "status", *STACK, "--region", "eu-west-1"], 2, "no AWS credentials found"),
]
#: ``demo`` needs no AWS configuration: it starts its own moto server (tests/integration/test_demo.py).
NEEDS_NO_AWS = {"demo"}


def no_aws_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("KUBECONFIG",)}
    env.update(
        HOME=str(home),
        AWS_CONFIG_FILE=str(home / "absent-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "absent-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def test_every_subcommand_is_covered() -> None:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.dest == "command"]
    assert set(sub.choices) - NEEDS_NO_AWS == {argv[0] for argv, _code, _say in CASES}


def test_every_subcommand_without_aws_configuration_says_one_line_and_no_traceback(tmp_path: Path) -> None:
    config = tmp_path / "rightsizer.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    env = no_aws_env(tmp_path)

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        args = [a.format(config=config, tmp=tmp_path, to="2026-11-01T01:00:00Z") for a in argv]
        return subprocess.run(
            [sys.executable, "-m", "rightsizer.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(run, [argv for argv, _code, _say in CASES]))
    for (argv, code, say), result in zip(CASES, done, strict=True):
        lines = result.stderr.strip().splitlines()
        assert "Traceback" not in result.stderr, (argv, result.stderr)
        assert len(lines) == 1, (argv, result.stderr)
        prefix = "rightsizer: failed: " if code == 1 else "rightsizer: error: "
        assert lines[0].startswith(prefix), (argv, lines)
        assert say in result.stderr, (argv, result.stderr)
        assert result.returncode == code, (argv, result.returncode, result.stderr)
        assert result.stdout == "", (argv, result.stdout)


@pytest.mark.parametrize("command", ["status", "history", "savings", "approve x", "reject x", "snooze x"])
def test_a_deployment_command_says_stack_or_config_is_required(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rightsizer.cli import main

    with pytest.raises(SystemExit) as caught:
        main(command.split())
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "(--stack NAME | --config FILE)" in err  # the usage line says it
    assert "one of the arguments --stack --config is required" in err

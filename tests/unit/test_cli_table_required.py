"""A command that needs the state table and has none (``--config`` without ``aws.table``) exits 2 saying
what that command does with the table and how to give it one — before any AWS call (no credentials asked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rightsizer.cli import main


@pytest.fixture
def no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    # An unreachable endpoint and no credentials: any AWS call would fail differently than the check.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    config = tmp_path / "config.yaml"
    config.write_text(
        "cluster: {name: nowhere-eks, region: us-east-1}\naws: {endpoint_url: 'http://127.0.0.1:9'}\n"
    )
    return str(config)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["status"], "status reads the state table: set aws.table in the config or pass --stack"),
        (["history"], "history reads the state table: set aws.table in the config or pass --stack"),
        (["savings"], "savings reads the state table: set aws.table in the config or pass --stack"),
        (
            ["approve", "exec-1"],
            "approve records the decision in the state table: set aws.table in the config or pass --stack",
        ),
        (
            ["reject", "exec-1"],
            "reject records the decision in the state table: set aws.table in the config or pass --stack",
        ),
        (
            ["snooze", "exec-1"],
            "snooze records the decision in the state table: set aws.table in the config or pass --stack",
        ),
        (["offhours", "status"], "offhours status reads the state table: set aws.table in the config"),
    ],
)
def test_a_command_without_a_table_says_what_it_needs(
    argv: list[str], says: str, no_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--config", no_table]) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert "required to act" not in err and "credential" not in err.lower(), err
    assert len(err.strip().splitlines()) == 1, err

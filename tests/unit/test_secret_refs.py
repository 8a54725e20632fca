"""Secret references (``rightsizer.adapters.secrets.resolve_secret``): ``env:NAME`` and ``file:/path`` resolve
locally; a malformed reference, or ``ssm:`` / ``secretsmanager:`` without a client, fails closed with a
ConfigError (the moto-backed SSM and Secrets Manager paths: tests/integration/test_prometheus.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rightsizer.adapters.secrets import resolve_secret
from rightsizer.domain.errors import ConfigError


def test_env_secret() -> None:
    assert resolve_secret("env:TOKEN", environ={"TOKEN": "abc"}) == "abc"
    with pytest.raises(ConfigError, match="TOKEN"):
        resolve_secret("env:TOKEN", environ={}, field="prometheus.secret")


def test_file_secret_drops_the_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cr3t\n")
    assert resolve_secret(f"file:{tmp_path / 'token'}") == "s3cr3t"
    with pytest.raises(ConfigError):
        resolve_secret(f"file:{tmp_path / 'missing'}")


@pytest.mark.parametrize("ref", ["plain", "vault:x", "env:", "ssm:/x", "secretsmanager:x"])
def test_bad_references_or_missing_clients_fail_closed(ref: str) -> None:
    with pytest.raises(ConfigError):
        resolve_secret(ref, environ={})

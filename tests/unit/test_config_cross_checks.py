"""A check across keys (a pydantic model validator) names the key to change, never ``<root>``.

pydantic places a model validator's error at the model itself: for the whole config file that is no key at
all, so ``prometheus.step: 2h`` was reported as ``<root>: prometheus.step must be ≤ policy.idle_window`` and,
deployed, the same line came back for a ``PolicyInline`` of ``idle_window: 10s``. Each such check raises
``KeyedValueError`` with the key it blames (``domain.validation``), and the line starts with that key.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

import rightsizer.config as config_module
from rightsizer.cli import main
from rightsizer.deploycheck import check_deployment

ROOT = Path(__file__).resolve().parents[2]


def _models() -> list[type[BaseModel]]:
    return [
        m
        for m in vars(config_module).values()
        if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == config_module.__name__
    ]


def test_every_cross_key_check_of_the_config_blames_a_key() -> None:
    checks = [
        (model.__name__, d.func)
        for model in _models()
        for d in model.__pydantic_decorators__.model_validators.values()
    ]
    assert len(checks) >= 4
    for name, func in checks:
        source = inspect.getsource(func)
        assert "raise ValueError" not in source, f"{name}.{func.__name__}: raise KeyedValueError(key, ...)"


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("cluster: {name: c}\nprometheus: {step: 2h}\n", "policy.idle_window: 1800 s is shorter than"),
        ("cluster: {name: c}\npolicy: {idle_window: 10s}\n", "policy.idle_window: 10 s is shorter than"),
        ("cluster: {region: us-east-1}\n", "cluster.name: set cluster.name (EKS) or cluster.context"),
        (
            "cluster: {name: c}\nprometheus: {auth: bearer}\n",
            "prometheus.secret: prometheus.auth bearer needs",
        ),
        (
            "cluster: {name: c}\nprometheus: {auth: basic, secret: 'env:P'}\n",
            "prometheus.username: prometheus.auth basic needs",
        ),
        (
            "cluster: {name: c}\nprometheus: {timeout: 91s}\n",
            "prometheus.timeout: 91 s must be ≤ prometheus.",
        ),
    ],
)
def test_a_cross_key_mistake_is_reported_at_its_key(
    tmp_path: Path, body: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(body)
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {line}" in err and "<root>" not in err, err


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"PolicyInline": "idle_window: 10s"},
            "policy.idle_window: 10 s is shorter than prometheus.step (60 s)",
        ),
        ({"PolicyInline": json.dumps({"idle_window": "30s"})}, "policy.idle_window: 30 s is shorter than"),
    ],
)
def test_a_deployment_whose_policy_window_is_under_a_step_names_idle_window(
    overrides: dict[str, str], line: str
) -> None:
    found = check_deployment(ROOT / "template.yaml", overrides, source="samconfig.toml")
    assert any(p.startswith(f"samconfig.toml: {line}") for p in found), found
    assert not [p for p in found if "<root>" in p]

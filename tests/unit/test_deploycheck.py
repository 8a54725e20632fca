"""``rightsizer validate``: the deploy parameters, config and policy checked before ``sam deploy``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rightsizer.cli import main
from rightsizer.deploycheck import check_deployment, samconfig_overrides, template_parameters
from rightsizer.domain.policy import Policy
from rightsizer.wiring.settings import DeploymentSettings, deployment_config

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
NIGHTS = {"nights": [{"days": ["Mon"], "start": "20:00", "end": "07:00", "timezone": "Europe/Berlin"}]}


def problems(**overrides: str) -> list[str]:
    return check_deployment(TEMPLATE, overrides, source="samconfig.toml")


def test_the_shipped_samconfig_deploys_cleanly() -> None:
    overrides = samconfig_overrides(ROOT / "samconfig.toml")
    assert {"DryRun", "AssessScheduleExpression", "OffhoursScheduleExpression"} <= set(overrides)
    assert check_deployment(TEMPLATE, overrides, source="samconfig.toml") == []


def test_a_good_deployment_passes() -> None:
    offhours = {"schedules": NIGHTS, "node_groups": [{"name": "gpu-dev", "schedule": "nights"}]}
    assert (
        problems(
            ClusterName="prod-eks",
            PrometheusUrl="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1234",
            PrometheusAuth="sigv4",
            PolicyInline="idle_window: 45m\nmax_nodes_per_run: 2\n",
            OffhoursConfig=json.dumps(offhours),
            AssessScheduleExpression="cron(0/5 * * * ? *)",
            ScheduleTimezone="Europe/Berlin",
            AlarmEmail="oncall@example.com",
        )
        == []
    )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"OffhoursSchedules": "{}"}, "OffhoursSchedules: not a parameter of template.yaml (did you mean"),
        ({"PolicyInline": "idle_windw: 10m"}, "idle_windw"),
        ({"PolicyInline": "drain_timeout: 2h"}, "drain_timeout"),
        (
            {
                "OffhoursConfig": json.dumps(
                    {"schedules": NIGHTS, "node_groups": [{"name": "g", "schedule": "night"}]}
                )
            },
            "node_groups[0].schedule: 'night' is not one of the schedules ['nights']",
        ),
        ({"OffhoursConfig": "schedules: [unclosed"}, "RIGHTSIZER_OFFHOURS"),
        ({"AssessScheduleExpression": "every 5 minutes"}, "AssessScheduleExpression: 'every 5 minutes'"),
        ({"OffhoursScheduleExpression": "rate(0 minutes)"}, "OffhoursScheduleExpression"),
        ({"PrometheusUrl": "prometheus-server.monitoring.svc:9090"}, "PrometheusUrl"),
        (
            {"PrometheusSecretRef": "my-secret"},
            "PrometheusSecretRef: 'my-secret': empty, secretsmanager:<name>",
        ),
        ({"DryRun": "yes"}, "DryRun: 'yes' is not one of ['true', 'false']"),
        ({"PriceListApi": "off"}, "PriceListApi: 'off' is not one of ['true', 'false']"),
        ({"ScheduleTimezone": "Berlin time"}, "ScheduleTimezone"),
        ({"AlarmEmail": "oncall"}, "AlarmEmail: 'oncall': an e-mail address, or empty"),
    ],
)
def test_each_mistake_is_named_before_deploying(overrides: dict[str, str], needle: str) -> None:
    found = problems(**overrides)
    assert any(needle in p for p in found), found


def test_every_parameter_is_described_grouped_and_the_schedule_names_cannot_be_confused() -> None:
    parameters = template_parameters(TEMPLATE)
    from rightsizer.deploycheck import _template

    interface = _template(TEMPLATE)["Metadata"]["AWS::CloudFormation::Interface"]
    grouped = [p for group in interface["ParameterGroups"] for p in group["Parameters"]]
    assert sorted(grouped) == sorted(parameters)  # every parameter in exactly one group
    for name, spec in parameters.items():
        assert len(spec.get("Description", "")) > 20, name
    assert "PrometheusUrl" in interface["ParameterLabels"]
    assert "Default" not in parameters["PrometheusUrl"]  # an in-cluster default cannot work from Lambda
    names = sorted(parameters)
    import difflib

    for name in names:  # no two parameter names one or two letters apart
        others = [n for n in names if n != name]
        assert not difflib.get_close_matches(name, others, n=1, cutoff=0.93), name


def test_cli_validate_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text("idle_window: 30m\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("idle_window: 30m\nmax_nodes_per_rn: 2\n")
    assert main(["validate", "--policy", str(good), "--samconfig", str(ROOT / "samconfig.toml"),
                 "--template", str(TEMPLATE)]) == 0  # fmt: skip
    assert f"ok: {good}" in capsys.readouterr().out
    assert main(["validate", "--policy", str(bad)]) == 2
    assert "max_nodes_per_rn" in capsys.readouterr().err
    assert main(["validate"]) == 2


@pytest.mark.parametrize(("value", "asks"), [("true", True), ("false", False), ("", True)])
def test_the_price_list_switch_reaches_the_config_the_functions_decide_on(value: str, asks: bool) -> None:
    environ = {
        "RIGHTSIZER_CLUSTER_NAME": "prod-eks",
        "AWS_REGION": "eu-west-1",
        "RIGHTSIZER_PRICING_API": value,
    }
    assert deployment_config(DeploymentSettings.from_env(environ), Policy()).aws.pricing_api is asks

"""``rightsizer validate``: the deploy parameters, config and policy checked before ``sam deploy``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml

from rightsizer.cli import main
from rightsizer.deploycheck import (
    FUNCTION_SETTINGS,
    _CfnLoader,
    check_deployment,
    samconfig_overrides,
    template_parameters,
)
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
        # renamed: the real replacement, not the nearest spelling (OffhoursScheduleExpression)
        ({"OffhoursSchedules": "{}"}, "OffhoursSchedules: renamed; give its value as OffhoursConfig"),
        ({"OffhoursSchedule": "{}"}, "OffhoursSchedule: not a parameter of template.yaml; did you mean"),
        ({"PolicyInline": "idle_windw: 10m"}, "idle_windw"),
        ({"PolicyInline": "drain_timeout: 2h"}, "drain_timeout"),
        (
            {
                "OffhoursConfig": json.dumps(
                    {"schedules": NIGHTS, "node_groups": [{"name": "g", "schedule": "night"}]}
                )
            },
            "node_groups.0.schedule: 'night' is not one of the schedules ['nights']; did you mean nights?",
        ),
        ({"OffhoursConfig": "schedules: [unclosed"}, "OffhoursConfig: invalid YAML/JSON"),
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
        (
            {"ScheduleTimezone": "Mars/Olympus"},
            "ScheduleTimezone: 'Mars/Olympus' is not a time zone of the IANA database; give an IANA time zone",
        ),
        ({"ScheduleTimezone": "Europe/Berln"}, "did you mean Europe/Berlin?"),
        ({"AlarmEmail": "oncall"}, "AlarmEmail: 'oncall': an e-mail address, or empty"),
    ],
)
def test_each_mistake_is_named_before_deploying(overrides: dict[str, str], needle: str) -> None:
    found = problems(**overrides)
    assert any(needle in p for p in found), found


NUMBERS = {n: s for n, s in template_parameters(TEMPLATE).items() if s.get("Type") == "Number"}


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_every_number_parameter_is_checked_like_cloudformation_checks_it(name: str) -> None:
    # CloudFormation refuses a Number parameter that is not a number or lies outside [MinValue, MaxValue]
    # at `sam deploy`; validate must say so first, naming the parameter (and only then).
    spec = NUMBERS[name]
    assert not [p for p in problems(**{name: str(spec["Default"])}) if f"{name}:" in p]
    assert any(f"{name}: 'ten': not a number" in p for p in problems(**{name: "ten"}))
    for bound, outside in (("MinValue", -1), ("MaxValue", 1)):
        if bound in spec:
            assert not [p for p in problems(**{name: str(spec[bound])}) if f"{name}:" in p]
            value = str(spec[bound] + outside)
            found = problems(**{name: value})
            assert any(p.startswith(f"samconfig.toml: {name}: {value!r}: ") for p in found), found


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


def test_validate_reports_every_mistake_in_one_run_each_with_key_path_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a policy with four mistakes, a config naming it with three of its own (one in the timetable)
    # and deploy parameters with three more
    (tmp_path / "policy.yaml").write_text(
        "idle_windw: 30m\ngpu_activity_max_pct: 150\nmax_nodes_per_run: many\ndry_run: maybe\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        "cluster: {name: prod}\n"
        "prometheus: {url: 'http://prometheus-server.monitoring.svc:9090', auth: token}\n"
        "offhours:\n"
        "  schedules: {nights: [{days: [Mon], start: '19:00', end: '07:00', timezone: Mars/Olympus}]}\n"
        "  node_groups: [{name: gpu-dev, schedule: weekend}]\n"
        "policy: policy.yaml\n"
    )
    samconfig = tmp_path / "samconfig.toml"
    samconfig.write_text(
        "[default.deploy.parameters]\n"
        'parameter_overrides = "OffhoursSchedules=\\"{}\\" ScheduleTimezone=\\"Mars/Olympus\\" '
        'PrometheusUrl=\\"http://prometheus-server.monitoring.svc:9090\\" PolicyInline=\\"idle_windw: 30m\\""\n'
    )
    # WHEN validate runs once
    code = main(
        ["validate", "--config", str(config), "--samconfig", str(samconfig), "--template", str(TEMPLATE)]
    )
    err = capsys.readouterr().err.splitlines()
    # THEN every mistake is a line with its key path and a fix, and the in-cluster URL two warnings
    invalid = [
        line.removeprefix("rightsizer: invalid: ") for line in err if line.startswith("rightsizer: invalid:")
    ]
    policy = str((tmp_path / "policy.yaml").resolve())
    assert code == 2
    assert invalid == [
        f"{policy}: dry_run: Input should be a valid boolean, unable to interpret input (got 'maybe'); "
        "give true or false",
        f"{policy}: gpu_activity_max_pct: Input should be less than or equal to 100 (got 150); "
        "give a value at most 100",
        f"{policy}: max_nodes_per_run: Input should be a valid integer, unable to parse string as an integer "
        "(got 'many'); give a whole number",
        f"{policy}: idle_windw: Extra inputs are not permitted; did you mean idle_window?",
        f"{config}: prometheus.auth: Input should be 'none', 'bearer', 'basic' or 'sigv4' (got 'token'); "
        "use one of 'none', 'bearer', 'basic' or 'sigv4'",
        f"{config}: offhours.schedules.nights.0.timezone: unknown IANA time zone 'Mars/Olympus' (not in the zone "
        "database); use a name such as 'Europe/Berlin' or 'UTC'",
        f"{config}: offhours: node_groups.0.schedule: 'weekend' is not one of the schedules ['nights']; "
        "add a schedule named weekend to schedules",
        f"{samconfig}: OffhoursSchedules: renamed; give its value as OffhoursConfig (The off-hours timetable as "
        'JSON/YAML {"schedules": {name: [{days, start, end, timezone}...]}, "node_groups": [{name, sch)',
        f"{samconfig}: ScheduleTimezone: 'Mars/Olympus' is not a time zone of the IANA database; give an IANA "
        "time zone such as UTC or Europe/Berlin",
        f"{samconfig}: PolicyInline: idle_windw: Extra inputs are not permitted; did you mean idle_window?",
    ]
    warnings = [line for line in err if line.startswith("rightsizer: warning:")]
    assert len(warnings) == 2
    assert "prometheus.url: http://prometheus-server.monitoring.svc:9090 is an in-cluster name" in warnings[0]
    assert "PrometheusUrl: http://prometheus-server.monitoring.svc:9090 is an in-cluster name" in warnings[1]
    assert "unreachable from Lambda" in warnings[1]
    assert err[-1] == "rightsizer: 10 mistake(s) found; nothing was deployed or changed"


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://prometheus-server.monitoring.svc:9090", True),
        ("http://prometheus.monitoring.svc.cluster.local:9090", True),
        ("http://prometheus-server:9090", True),
        ("https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1", False),
        ("http://internal-prom-123.us-east-1.elb.amazonaws.com:9090", False),
    ],
)
def test_in_cluster_prometheus_urls_are_warned_about(url: str, warned: bool) -> None:
    from rightsizer.deploycheck import prometheus_url_warnings

    assert bool(prometheus_url_warnings(url, "PrometheusUrl", from_lambda=True)) is warned


def _function_variables() -> list[tuple[str, str, str]]:
    """(function, variable, parameter) for every variable a function of template.yaml gets from a
    parameter in its own Environment (the Globals go through DeploymentSettings, tested above)."""
    document = yaml.load(TEMPLATE.read_text(encoding="utf-8"), Loader=_CfnLoader)
    parameters = document["Parameters"]
    found = []
    for name, resource in document["Resources"].items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        for variable, value in resource["Properties"].get("Environment", {}).get("Variables", {}).items():
            if isinstance(value, dict) and value.get("Ref") in parameters:
                found.append((name, variable, value["Ref"]))
    return found


FUNCTION_VARIABLES = _function_variables()


def test_every_parameter_fed_variable_of_a_function_is_read_by_a_settings_model_validate_runs() -> None:
    # The class: a parameter reaching one function's environment (sharding, fleet) was checked by nobody
    # before the deploy, so ShardAboveGpuNodes=5000.5 said "ok" and every assess tick then failed.
    assert len(FUNCTION_VARIABLES) >= 12
    for function, variable, _ in FUNCTION_VARIABLES:
        prefix = next((p for p in FUNCTION_SETTINGS if variable.startswith(p)), None)
        assert prefix is not None, f"{function}: {variable} has no settings model in FUNCTION_SETTINGS"
        module, name = FUNCTION_SETTINGS[prefix]
        model = getattr(importlib.import_module(module), name)
        assert variable.removeprefix(prefix).lower() in model.model_fields, (function, variable)


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_a_fractional_number_parameter_is_refused_naming_it(name: str) -> None:
    # CloudFormation takes 2.5 for a Number; the functions' settings (int fields) and the integer resource
    # properties (ReservedConcurrentExecutions, RetentionInDays) do not: validate says so first.
    spec = NUMBERS[name]
    low = spec.get("MinValue", min(spec.get("AllowedValues", [spec["Default"]])))
    value = f"{low}.5"
    found = problems(**{name: value})
    assert any(p.startswith(f"samconfig.toml: {name}: {value!r}: ") for p in found), found
    whole = f"{spec['Default']}.0"  # a whole number written with a point is still the number
    if "AllowedValues" not in spec:
        assert not [p for p in problems(**{name: whole}) if f"{name}:" in p]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"ShardAboveGpuNodes": "1e3"}, "ShardAboveGpuNodes: '1e3': "),
        ({"ShardMaxConcurrency": "40.5"}, "ShardMaxConcurrency: '40.5': "),
        ({"FleetToleratedFailurePercentage": "12.5"}, "FleetToleratedFailurePercentage: '12.5': "),
        ({"WebhookConcurrency": "2.5"}, "WebhookConcurrency: '2.5': must be a whole number"),
    ],
)
def test_values_the_functions_would_refuse_are_named_once(overrides: dict[str, str], needle: str) -> None:
    found = problems(**overrides)
    assert len([p for p in found if needle in p]) == 1, found


def test_good_sharding_and_fleet_parameters_pass() -> None:
    assert (
        problems(
            EnableSharding="true",
            ShardAboveGpuNodes="100",
            ShardGpuNodesPerShard="5000",
            ShardMaxConcurrency="10000",
            EnableFleet="true",
            FleetMaxConcurrency="1",
            FleetToleratedFailurePercentage="0",
            FleetRegions="us-east-1,eu-west-1",
        )
        == []
    )


@pytest.mark.parametrize(
    ("text", "environment", "expected"),
    [
        # the values sam deploy would use are the ones checked, wherever samconfig.toml keeps them
        ('[default.deploy.parameters]\nparameter_overrides = "DryRun=no"\n', "default", {"DryRun": "no"}),
        ('[default.global.parameters]\nparameter_overrides = "DryRun=no"\n', "default", {"DryRun": "no"}),
        (
            '[prod.global.parameters]\nparameter_overrides = "DryRun=no ClusterName=a"\n'
            '[prod.deploy.parameters]\nparameter_overrides = ["ClusterName=b"]\n',
            "prod",
            {"DryRun": "no", "ClusterName": "b"},
        ),
        ("[default.deploy.parameters]\ncapabilities = 'CAPABILITY_IAM'\n", "default", {}),  # guided asks
    ],
)
def test_samconfig_overrides_are_the_ones_sam_deploys(
    tmp_path: Path, text: str, environment: str, expected: dict[str, str]
) -> None:
    path = tmp_path / "samconfig.toml"
    path.write_text("version = 0.1\n" + text)
    assert samconfig_overrides(path, environment) == expected


@pytest.mark.parametrize(
    ("text", "environment", "needle"),
    [
        # an environment the file does not have said "ok" having checked only the template's defaults
        (
            '[prod.deploy.parameters]\nparameter_overrides = "DryRun=maybe"\n',
            "default",
            "pass --environment prod",
        ),
        (
            '[prod.deploy.parameters]\nparameter_overrides = "DryRun=maybe"\n',
            "prd",
            "pass --environment prod",
        ),
        ("", "default", "add its [default.deploy.parameters]"),
        (
            '[default.deploy.parameters]\nparameter_overrides = "DryRun"\n',
            "default",
            "'DryRun' is not Key=Value",
        ),
    ],
)
def test_a_samconfig_validate_cannot_read_as_sam_would_is_refused_naming_why(
    tmp_path: Path, text: str, environment: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "samconfig.toml"
    path.write_text("version = 0.1\n" + text)
    (tmp_path / "template.yaml").write_text(TEMPLATE.read_text())
    assert main(["validate", "--samconfig", str(path), "--environment", environment]) == 2
    assert needle in capsys.readouterr().err


def test_the_template_beside_the_samconfig_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `sam deploy` reads the template beside samconfig.toml; validate from another directory did not
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "--samconfig", str(ROOT / "samconfig.toml")]) == 0
    assert f"against {ROOT / 'template.yaml'}" in capsys.readouterr().out


@pytest.mark.parametrize("second", ["nights", "weekends"])
def test_a_node_group_listed_twice_is_named_in_config_and_deployment(
    second: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # validate said ok; the off-hours tick follows the first entry and ignores the other (a second schedule
    # the operator meant is silently dropped)
    offhours = {
        "schedules": {
            **NIGHTS,
            "weekends": [{"days": ["Sat"], "start": "00:00", "end": "00:00", "timezone": "UTC"}],
        },
        "node_groups": [{"name": "gpu-dev", "schedule": "nights"}, {"name": "gpu-dev", "schedule": second}],
    }
    needle = "node_groups.1.name: 'gpu-dev' is listed already (node_groups.0, schedule 'nights')"
    assert any(needle in p for p in problems(OffhoursConfig=json.dumps(offhours))), problems()
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"cluster": {"name": "c"}, "offhours": offhours}))
    assert main(["validate", "--config", str(config)]) == 2
    assert needle in capsys.readouterr().err

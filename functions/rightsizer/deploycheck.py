"""Check a deployment before ``sam deploy`` (``rightsizer validate``, ``make validate``).

``sam deploy`` would accept a policy with a typo or an off-hours timetable naming a schedule that does not
exist; the functions would only fail at their first tick. This module reads the parameter values a deploy
would use (``samconfig.toml``'s ``parameter_overrides`` over the template's defaults) and checks them the way
CloudFormation and the functions will:

- every override names a parameter of ``template.yaml`` (a renamed parameter is reported with the new name);
- every value matches the parameter's ``AllowedValues`` / ``AllowedPattern``, and a ``Type: Number`` one is a
  number within ``MinValue`` / ``MaxValue``;
- the environment the template gives the functions (``Globals.Function.Environment``) goes through exactly
  the code the functions run at a cold start — :meth:`rightsizer.wiring.settings.DeploymentSettings.from_env`
  and :func:`rightsizer.wiring.settings.config_from_settings` (policy, off-hours timetable, drain timeout vs
  the state machine) — plus the off-hours schedule references;
- each function's own parameter-fed variables (``RIGHTSIZER_SHARD_*``, ``RIGHTSIZER_FLEET_*``) go through
  that function's settings model (:data:`FUNCTION_SETTINGS`), and a ``Number`` parameter that lands in an
  integer resource property (:data:`INTEGER_PROPERTIES`) must be a whole number: CloudFormation takes
  ``2.5`` for a ``Number``, the function or the resource would not.

A policy kept in SSM (``PolicyParameterName``) is not fetched: pass ``--policy FILE`` to check its text.
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
import tomllib
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from rightsizer.config import OffhoursConfig
from rightsizer.domain.errors import ConfigError

__all__ = [
    "FUNCTION_SETTINGS",
    "INTEGER_PROPERTIES",
    "RENAMED_PARAMETERS",
    "check_deployment",
    "check_offhours",
    "check_offhours_refs",
    "deployment_warnings",
    "prometheus_url_warnings",
    "samconfig_overrides",
    "template_parameters",
]

#: Parameters a template once had → the one that replaced them (what an old samconfig.toml still says).
RENAMED_PARAMETERS = {"OffhoursSchedules": "OffhoursConfig"}
#: Host suffixes only a pod's DNS resolves: Kubernetes Service and Pod names (``<svc>.<ns>.svc``,
#: ``cluster.local``) and loopback.
_IN_CLUSTER = (".svc", ".svc.cluster.local", ".cluster.local", ".pod")
#: A function's own environment variables by prefix → the settings model (module, class) that function
#: builds from them at its cold start; every parameter-fed variable of a function must have one
#: (tests/unit/test_deploycheck.py).
FUNCTION_SETTINGS = {
    "RIGHTSIZER_SHARD_": ("rightsizer.wiring.shards", "ShardSettings"),
    "RIGHTSIZER_FLEET_": ("rightsizer.wiring.fleet", "FleetSettings"),
}
#: Resource properties whose CloudFormation type is Integer (AWS::Lambda::Function
#: ``ReservedConcurrentExecutions``, ``MemorySize``, ``Timeout``; AWS::Logs::LogGroup ``RetentionInDays``).
INTEGER_PROPERTIES = frozenset({"ReservedConcurrentExecutions", "MemorySize", "Timeout", "RetentionInDays"})
#: The value given for a variable the deploy fills from a resource it creates (a bucket, an ARN).
_CREATED = "created-by-the-deploy"


class _CfnLoader(yaml.SafeLoader):
    """Reads CloudFormation short-form tags (``!Ref X`` → ``{"Ref": "X"}``, others → their argument)."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {"Ref" if suffix == "Ref" else f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _tag)


def _template(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(path)) from exc
    if not isinstance(loaded, dict):
        raise ConfigError("not a CloudFormation template", source=str(path))
    return loaded


def template_parameters(path: Path) -> dict[str, dict[str, Any]]:
    """The template's ``Parameters`` (name → specification)."""
    parameters: dict[str, dict[str, Any]] = _template(path).get("Parameters", {})
    return parameters


def samconfig_overrides(path: Path, environment: str = "default") -> dict[str, str]:
    """The ``parameter_overrides`` ``sam deploy --config-env <environment>`` uses, as name → value: those
    of ``[<environment>.deploy.parameters]`` over those of ``[<environment>.global.parameters]`` (SAM CLI's
    precedence; each the ``Key="value" Key2="value"`` string, or a list of such items).

    Raises:
        ConfigError: unreadable TOML, an environment the file does not have (``sam deploy`` would ask for
            every parameter instead of deploying the values checked), or an override that is not ``Key=Value``.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", source=str(path)) from exc
    if not isinstance(document.get(environment), dict):
        have = sorted(k for k, v in document.items() if isinstance(v, dict))
        close = difflib.get_close_matches(environment, have, n=1, cutoff=0.6)
        fix = f"pass --environment {(close or have)[0]}" if have else "add its [default.deploy.parameters]"
        raise ConfigError(
            f"no environment {environment!r} (the file has: {', '.join(have) or 'none'}); {fix}",
            source=str(path),
            field="--environment",
        )
    overrides: dict[str, str] = {}
    for command in ("global", "deploy"):
        section = document[environment].get(command, {}).get("parameters", {})
        overrides.update(_overrides(section.get("parameter_overrides", ""), path))
    return overrides


def _overrides(raw: str | list[Any], path: Path) -> dict[str, str]:
    """``Key="value" Key2="value"`` (or a list of such items) as name → value."""
    items = shlex.split(raw) if isinstance(raw, str) else [str(i) for i in raw]
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not Key=Value", source=str(path), field="parameter_overrides")
        overrides[key] = value
    return overrides


def check_offhours(offhours: OffhoursConfig, source: str) -> list[str]:
    """Problems of an off-hours section that its model cannot see: node groups naming unknown schedules."""
    return check_offhours_refs(offhours.model_dump(), source)


def check_offhours_refs(offhours: Any, source: str) -> list[str]:
    """Node groups naming a schedule the timetable lacks, or listed twice, read from the raw mapping (so they
    are reported even when another key of the same document is invalid); each line names the group's index
    and the fix."""
    if not isinstance(offhours, dict):
        return []
    raw_schedules, raw_groups = offhours.get("schedules"), offhours.get("node_groups")
    schedules: dict[str, Any] = raw_schedules if isinstance(raw_schedules, dict) else {}
    groups: list[Any] = raw_groups if isinstance(raw_groups, list) else []
    problems = []
    first: dict[str, int] = {}
    for i, group in enumerate(groups):
        listed = group.get("name") if isinstance(group, dict) else None
        if isinstance(listed, str) and listed in first:
            # the tick follows the first entry and notes duplicate_config_entry (services.offhours)
            j = first[listed]
            problems.append(
                f"{source}: node_groups.{i}.name: {listed!r} is listed already (node_groups.{j}, schedule "
                f"{groups[j].get('schedule')!r}); off-hours would ignore this entry: remove one"
            )
        elif isinstance(listed, str):
            first[listed] = i
        name = group.get("schedule") if isinstance(group, dict) else None
        if isinstance(name, str) and name not in schedules:
            close = difflib.get_close_matches(name, list(schedules), n=1, cutoff=0.6)
            fix = f"did you mean {close[0]}?" if close else f"add a schedule named {name} to schedules"
            problems.append(
                f"{source}: node_groups.{i}.schedule: {name!r} is not one of the schedules {sorted(schedules)}; {fix}"
            )
    return problems


def prometheus_url_warnings(url: str, source: str, *, from_lambda: bool) -> list[str]:
    """Warnings for a Prometheus URL the caller cannot reach: a Kubernetes Service or Pod DNS name
    (``*.svc``, ``*.cluster.local``) or loopback resolves only inside the cluster (or this machine); the
    functions run in Lambda, outside the cluster, and the CLI on your machine."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if host.endswith(_IN_CLUSTER) or ("." not in host and host not in ("", "localhost")):
        where = "Lambda (outside the cluster, even in its VPC)" if from_lambda else "outside the cluster"
        return [
            f"{source}: {url} is an in-cluster name, unreachable from {where}; expose Prometheus on an internal "
            "load balancer or use Amazon Managed Prometheus, and give that URL"
            + ("" if from_lambda else " (or run kubectl port-forward and give http://127.0.0.1:PORT)")
        ]
    if from_lambda and host in ("localhost", "127.0.0.1", "::1"):
        return [
            f"{source}: {url} is loopback: from Lambda it is the function itself; give Prometheus' address"
        ]
    return []


def check_deployment(template: Path, overrides: Mapping[str, str], *, source: str) -> list[str]:
    """Every problem a deploy with ``overrides`` would meet (empty = none), one line each naming the
    parameter (``source`` names where the overrides came from)."""
    from rightsizer.wiring.settings import DeploymentSettings, config_from_settings

    document = _template(template)
    parameters: dict[str, dict[str, Any]] = document.get("Parameters", {})
    problems = []
    for name in overrides:
        if name in RENAMED_PARAMETERS and RENAMED_PARAMETERS[name] in parameters:
            new = RENAMED_PARAMETERS[name]
            problems.append(
                f"{source}: {name}: renamed; give its value as {new} ({_described(parameters[new])})"
            )
        elif name not in parameters:
            close = difflib.get_close_matches(name, list(parameters), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]}?"
                if close
                else f"; remove it ({template.name} has no such parameter)"
            )
            problems.append(f"{source}: {name}: not a parameter of {template.name}{hint}")
    values = _parameter_values(parameters, overrides, source, problems)
    environment = document.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    env = {"AWS_REGION": "us-east-1", "RIGHTSIZER_CLUSTER_NAME": values.get("ClusterName") or "unset"}
    for variable, value in environment.items():
        if isinstance(value, dict) and "Ref" in value and value["Ref"] in values:
            env[variable] = values[value["Ref"]]

    def no_ssm(name: str) -> str:
        raise ConfigError(f"the policy is in SSM parameter {name}: check its text with --policy FILE")

    # the functions name their environment variables; the operator wrote the template's parameters
    parameter_of = {
        variable: value["Ref"]
        for variable, value in environment.items()
        if isinstance(value, dict) and "Ref" in value
    }
    try:
        config_from_settings(DeploymentSettings.from_env(env), fetch=no_ssm)
    except ConfigError as exc:
        for problem in exc.problems:
            for variable, parameter in parameter_of.items():
                problem = problem.replace(f"{variable}: ", f"{parameter}: ")
            problems.append(f"{source}: {problem.removeprefix('environment: ')}")
    try:
        offhours = yaml.safe_load(values.get("OffhoursConfig") or "{}")
    except yaml.YAMLError:
        offhours = None  # reported above, from the functions' own parse
    problems += check_offhours_refs(offhours, f"{source}: OffhoursConfig")
    problems += _function_settings_problems(document, values, source)
    problems += _integer_problems(document, values, source)
    return problems


def _function_settings_problems(
    document: Mapping[str, Any], values: Mapping[str, str], source: str
) -> list[str]:
    """Each function's parameter-fed variables through the settings model it builds them into
    (:data:`FUNCTION_SETTINGS`), one line per refused parameter, however many functions read it."""
    import importlib

    from pydantic import ValidationError

    found: dict[str, str] = {}
    for resource in document.get("Resources", {}).values():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        environment = resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
        for prefix, (module, name) in FUNCTION_SETTINGS.items():
            mine = {k: v for k, v in environment.items() if k.startswith(prefix)}
            fed = {k: v["Ref"] for k, v in mine.items() if isinstance(v, dict) and v.get("Ref") in values}
            if not fed:
                continue
            model = getattr(importlib.import_module(module), name)
            fields = {}
            for variable in mine:
                field = variable.removeprefix(prefix).lower()
                if field in model.model_fields and model.model_fields[field].validation_alias is None:
                    fields[field] = values[fed[variable]] if variable in fed else _CREATED
            try:
                model.model_validate({k: v for k, v in fields.items() if v != ""})
            except ValidationError as exc:
                for error in exc.errors():
                    parameter = fed.get(f"{prefix}{str(error['loc'][0]).upper()}")
                    if parameter is not None:
                        why = "must be a whole number" if error["type"].startswith("int_") else error["msg"]
                        found.setdefault(parameter, f"{source}: {parameter}: {values[parameter]!r}: {why}")
    return list(found.values())


def _integer_problems(document: Mapping[str, Any], values: Mapping[str, str], source: str) -> list[str]:
    """A ``Number`` parameter referenced by an integer resource property (:data:`INTEGER_PROPERTIES`) must be a
    whole number: CloudFormation accepts ``2.5`` as the parameter and fails the resource mid-deploy."""
    parameters = document.get("Parameters", {})
    integers: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in INTEGER_PROPERTIES and isinstance(value, dict) and "Ref" in value:
                    integers.add(value["Ref"])
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document.get("Resources", {}))
    problems = []
    for name in sorted(integers):
        if parameters.get(name, {}).get("Type") != "Number" or name not in values:
            continue
        try:
            whole = float(values[name]).is_integer()
        except ValueError:
            continue  # "not a number", reported with the bounds
        if not whole:
            problems.append(f"{source}: {name}: {values[name]!r}: must be a whole number")
    return problems


def _parameter_values(
    parameters: Mapping[str, Mapping[str, Any]],
    overrides: Mapping[str, str],
    source: str,
    problems: list[str],
) -> dict[str, str]:
    """Each parameter's value (override, else default) checked as CloudFormation checks it
    (``AllowedValues``, ``AllowedPattern``, a ``Number``'s bounds) and a ``*Timezone`` against the zone database."""
    values: dict[str, str] = {}
    for name, spec in parameters.items():
        value = overrides.get(name, spec.get("Default"))
        if value is None:
            continue  # sam deploy --guided asks for it
        value = str(value)
        values[name] = value
        allowed = spec.get("AllowedValues")
        if allowed is not None and value not in [str(a) for a in allowed]:
            problems.append(f"{source}: {name}: {value!r} is not one of {[str(a) for a in allowed]}")
        pattern = spec.get("AllowedPattern")
        if pattern is not None and re.fullmatch(pattern, value) is None:
            why = spec.get("ConstraintDescription", f"must match {pattern}")
            problems.append(f"{source}: {name}: {value!r}: {why}")
        if spec.get("Type") == "Number":
            problems += _number_problems(name, value, spec, source)
        if name.endswith("Timezone") and value not in _zones():
            close = difflib.get_close_matches(value, sorted(_zones()), n=1, cutoff=0.6)
            fix = (
                f"did you mean {close[0]}?"
                if close
                else "give an IANA time zone such as UTC or Europe/Berlin"
            )
            problems.append(f"{source}: {name}: {value!r} is not a time zone of the IANA database; {fix}")
    return values


def _number_problems(name: str, value: str, spec: Mapping[str, Any], source: str) -> list[str]:
    """A ``Type: Number`` parameter's value checked as CloudFormation checks it at deploy: a number
    (integer or float) within ``MinValue`` / ``MaxValue`` (both inclusive)."""
    try:
        number = float(value)
    except ValueError:
        return [f"{source}: {name}: {value!r}: not a number"]
    low, high = spec.get("MinValue"), spec.get("MaxValue")
    if (low is not None and number < float(low)) or (high is not None and number > float(high)):
        lowest = "" if low is None else f"at least {low}"
        highest = "" if high is None else f"at most {high}"
        return [f"{source}: {name}: {value!r}: must be {' and '.join(filter(None, (lowest, highest)))}"]
    return []


def deployment_warnings(overrides: Mapping[str, str], *, source: str) -> list[str]:
    """What a deploy with ``overrides`` would accept but not work with: an in-cluster ``PrometheusUrl``."""
    url = overrides.get("PrometheusUrl")
    return prometheus_url_warnings(url, f"{source}: PrometheusUrl", from_lambda=True) if url else []


def _described(spec: Mapping[str, Any]) -> str:
    return " ".join(str(spec.get("Description", "")).split())[:120] or "see template.yaml"


@functools.cache
def _zones() -> frozenset[str]:
    """The IANA zone names of the zone database (``zoneinfo.available_timezones``: tzdata or the system's)."""
    return frozenset(zoneinfo.available_timezones()) | {"UTC"}

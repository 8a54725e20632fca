"""Check a deployment before ``sam deploy`` (``rightsizer validate``, ``make validate``).

``sam deploy`` would accept a policy with a typo or an off-hours timetable naming a schedule that does not
exist; the functions would only fail at their first tick. This module reads the parameter values a deploy
would use (``samconfig.toml``'s ``parameter_overrides`` over the template's defaults) and checks them the way
CloudFormation and the functions will:

- every override names a parameter of ``template.yaml`` (a renamed parameter is reported with the new name);
- every value matches the parameter's ``AllowedValues`` / ``AllowedPattern``;
- the environment the template gives the functions (``Globals.Function.Environment``) goes through exactly
  the code the functions run at a cold start — :meth:`rightsizer.wiring.settings.DeploymentSettings.from_env`
  and :func:`rightsizer.wiring.settings.config_from_settings` (policy, off-hours timetable, drain timeout vs
  the state machine) — plus the off-hours schedule references.

A policy kept in SSM (``PolicyParameterName``) is not fetched: pass ``--policy FILE`` to check its text.
"""

from __future__ import annotations

import difflib
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rightsizer.config import OffhoursConfig
from rightsizer.domain.errors import ConfigError

__all__ = ["check_deployment", "check_offhours", "samconfig_overrides", "template_parameters"]


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
    """``[<environment>.deploy.parameters].parameter_overrides`` of a ``samconfig.toml`` as name → value
    (the ``Key="value" Key2="value"`` string, or a list of such items).

    Raises:
        ConfigError: unreadable TOML or an override that is not ``Key=Value``.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", source=str(path)) from exc
    raw = document.get(environment, {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides", "")
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
    return [
        f"{source}: node_groups[{i}].schedule: {group.schedule!r} is not one of the schedules "
        f"{sorted(offhours.schedules)}"
        for i, group in enumerate(offhours.node_groups)
        if group.schedule not in offhours.schedules
    ]


def check_deployment(template: Path, overrides: Mapping[str, str], *, source: str) -> list[str]:
    """Every problem a deploy with ``overrides`` would meet (empty = none), one line each naming the
    parameter (``source`` names where the overrides came from)."""
    from rightsizer.wiring.settings import DeploymentSettings, config_from_settings

    document = _template(template)
    parameters: dict[str, dict[str, Any]] = document.get("Parameters", {})
    problems = []
    for name in overrides:
        if name not in parameters:
            close = difflib.get_close_matches(name, list(parameters), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{source}: {name}: not a parameter of {template.name}{hint}")
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
    environment = document.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    env = {"AWS_REGION": "us-east-1", "RIGHTSIZER_CLUSTER_NAME": values.get("ClusterName") or "unset"}
    for variable, value in environment.items():
        if isinstance(value, dict) and "Ref" in value and value["Ref"] in values:
            env[variable] = values[value["Ref"]]

    def no_ssm(name: str) -> str:
        raise ConfigError(f"the policy is in SSM parameter {name}: check its text with --policy FILE")

    try:
        config = config_from_settings(DeploymentSettings.from_env(env), fetch=no_ssm)
    except ConfigError as exc:
        problems.append(f"{source}: {exc}")
    else:
        problems += check_offhours(config.offhours, f"{source}: OffhoursConfig")
    return problems

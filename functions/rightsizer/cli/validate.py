"""``rightsizer validate``: check a config, a policy and the deploy parameters before deploying
(``rightsizer.deploycheck``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rightsizer.cli.common import EXIT_BAD_INPUT, EXIT_OK, read_policy_file
from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.policy import Policy


def cmd_validate(args: argparse.Namespace) -> int:
    """``rightsizer validate [--config FILE] [--policy FILE] [--samconfig FILE --template FILE]``: check a
    config, a policy, the off-hours timetable and the parameters a ``sam deploy`` would use, before anything
    is deployed (``rightsizer.deploycheck``). Prints every mistake on stderr in one run, each with its key
    path and fix, and warnings (a Prometheus URL unreachable from where it is used); exit 2 when there is a
    mistake. Never acts."""
    from rightsizer.deploycheck import check_deployment, deployment_warnings, samconfig_overrides
    from rightsizer.domain.policy import MAX_APPROVAL_TIMEOUT_S
    from rightsizer.wiring.settings import STATE_MACHINE_MARGIN_S, STATE_MACHINE_TIMEOUT_S

    if not (args.config or args.policy or args.samconfig):
        raise ConfigError("give --config FILE, --policy FILE and/or --samconfig FILE", field="validate")
    problems: list[str] = []
    warnings: list[str] = []
    checked: list[str] = []
    policies: list[tuple[str, Policy]] = []
    for label, load in (("config", load_config), ("policy", read_policy_file)):
        path = getattr(args, label)
        if path:
            _check_file(path, load, problems, warnings, checked, policies)
    for source, policy in policies:
        if policy.drain_timeout + STATE_MACHINE_MARGIN_S + MAX_APPROVAL_TIMEOUT_S > STATE_MACHINE_TIMEOUT_S:
            problems.append(
                f"{source}: drain_timeout: {policy.drain_timeout}s leaves less than {STATE_MACHINE_MARGIN_S}s "
                f"of the drain state machine's {STATE_MACHINE_TIMEOUT_S}s timeout; lower drain_timeout"
            )
    if args.samconfig:
        try:
            # sam reads the template beside its samconfig.toml: so does validate unless told otherwise
            template = Path(args.template) if args.template else Path(args.samconfig).parent / "template.yaml"
            overrides = samconfig_overrides(Path(args.samconfig), args.environment)
            problems += check_deployment(template, overrides, source=args.samconfig)
            warnings += deployment_warnings(overrides, source=args.samconfig)
            checked.append(f"{args.samconfig} against {template}")
        except ConfigError as exc:
            problems += exc.problems
    for warning in warnings:
        print(f"rightsizer: warning: {warning}", file=sys.stderr)
    for problem in problems:
        print(f"rightsizer: invalid: {problem}", file=sys.stderr)
    if problems:
        print(
            f"rightsizer: {len(problems)} mistake(s) found; nothing was deployed or changed", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    for name in checked:
        print(f"ok: {name}")
    return EXIT_OK


def _check_file(
    path: str,
    load: Any,
    problems: list[str],
    warnings: list[str],
    checked: list[str],
    policies: list[tuple[str, Policy]],
) -> None:
    """Check a config or policy file: every mistake into ``problems``, the URL into ``warnings``."""
    from rightsizer.deploycheck import check_offhours, check_offhours_refs, prometheus_url_warnings

    try:
        loaded = load(path)
    except ConfigError as exc:
        problems += exc.problems
        if load is load_config:  # what the model could not reach: schedule references, the URL
            raw = _raw_mapping(path)
            problems += check_offhours_refs(raw.get("offhours"), f"{path}: offhours")
            prometheus = raw.get("prometheus")
            url = prometheus.get("url") if isinstance(prometheus, dict) else None
            if isinstance(url, str):
                warnings += prometheus_url_warnings(url, f"{path}: prometheus.url", from_lambda=False)
        return
    checked.append(str(path))
    if isinstance(loaded, Config):
        problems += check_offhours(loaded.offhours, f"{path}: offhours")
        warnings += prometheus_url_warnings(
            loaded.prometheus.url, f"{path}: prometheus.url", from_lambda=False
        )
        policies.append((f"{path}: policy", loaded.policy))
    else:
        policies.append((str(path), loaded))


def _raw_mapping(path: str) -> dict[str, Any]:
    """The config file as parsed YAML (empty when it cannot be read: that is reported already)."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, dict) else {}


def add_parsers(sub: Any) -> None:
    """Register ``validate``."""
    v = sub.add_parser("validate", help="check a config, a policy and the deploy parameters before deploying")
    v.add_argument("--config", metavar="FILE", help="a config file")
    v.add_argument("--policy", metavar="FILE", help="a policy file (e.g. the text of PolicyParameterName)")
    v.add_argument("--samconfig", metavar="FILE", help="samconfig.toml whose parameter_overrides to check")
    v.add_argument("--environment", default="default", help="samconfig environment (default: default)")
    v.add_argument(
        "--template", metavar="FILE", help="the SAM template (default: template.yaml beside --samconfig)"
    )
    v.set_defaults(func=cmd_validate)

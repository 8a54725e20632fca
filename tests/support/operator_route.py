"""The Alertmanager configuration the Prometheus Operator generates from a base configuration plus
``AlertmanagerConfig`` resources — ported for the subset our package uses, so ``amtool`` and a real
Alertmanager can be run on exactly what a kube-prometheus-stack cluster would run.

Ported from prometheus-operator/prometheus-operator ``pkg/alertmanager/amcfg.go`` @
6adcebc5076c34f4f55f8f5f7b1e528929373ac7 (Apache-2.0), Alertmanager >= 0.22 (matchers v2):

- ``ConfigBuilder.AddAlertmanagerConfigs``: per resource (sorted by ``namespace/name``), the converted route
  passed through the enforcer, then ``continue: true``; all of them *before* the base route's own routes;
  the converted receivers appended to the base receivers.
- ``getEnforcer``: strategy ``None`` adds nothing; ``OnNamespaceExceptForAlertmanagerNamespace`` adds
  ``namespace="<ns>"`` unless the resource lives in Alertmanager's namespace; anything else (the default
  ``OnNamespace``) always adds it.
- ``convertRoute`` / ``makeNamespacedString``: receiver ``<ns>/<name>/<receiver>``; matchers with a
  ``matchType`` become ``name<op>"value"`` (``Matcher.String``).
- ``convertWebhookConfig`` / ``convertHTTPConfig``: ``urlSecret`` (or ``url``), ``send_resolved``,
  ``max_alerts`` only when > 0, ``authorization.credentials`` read from the Secret and written inline (type
  defaults to Bearer).

Any field outside this subset raises ``NotImplementedError`` rather than being dropped silently.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: (namespace, secret name, key) -> value: the Secrets the operator would read.
Secrets = Mapping[tuple[str, str, str], str]

STRATEGIES = ("OnNamespace", "OnNamespaceExceptForAlertmanagerNamespace", "None")
_ROUTE_FIELDS = {
    "receiver",
    "matchers",
    "groupBy",
    "groupWait",
    "groupInterval",
    "repeatInterval",
    "continue",
}
_WEBHOOK_FIELDS = {"url", "urlSecret", "sendResolved", "maxAlerts", "httpConfig"}


def _only(obj: Mapping[str, Any], allowed: set[str], what: str) -> None:
    extra = set(obj) - allowed
    if extra:
        raise NotImplementedError(f"{what}: fields {sorted(extra)} are not ported")


def _secret(secrets: Secrets, namespace: str, selector: Mapping[str, str]) -> str:
    key = (namespace, selector["name"], selector["key"])
    if key not in secrets:
        raise LookupError(f"Secret {namespace}/{selector['name']} has no key {selector['key']!r}")
    return secrets[key]


def _matcher(m: Mapping[str, Any]) -> str:
    op = m.get("matchType") or ("=~" if m.get("regex") else "=")
    value = str(m.get("value", "")).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{m["name"]}{op}"{value}"'


def _route(spec: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any]:
    _only(spec, _ROUTE_FIELDS, "route")
    out: dict[str, Any] = {"receiver": f"{namespace}/{name}/{spec['receiver']}"}
    for src, dst in (
        ("groupBy", "group_by"),
        ("groupWait", "group_wait"),
        ("groupInterval", "group_interval"),
        ("repeatInterval", "repeat_interval"),
    ):
        if spec.get(src):
            out[dst] = copy.deepcopy(spec[src])
    if spec.get("matchers"):
        out["matchers"] = [_matcher(m) for m in spec["matchers"]]
    if spec.get("continue"):
        out["continue"] = True
    return out


def _webhook(spec: Mapping[str, Any], namespace: str, secrets: Secrets) -> dict[str, Any]:
    _only(spec, _WEBHOOK_FIELDS, "webhookConfig")
    out: dict[str, Any] = {}
    if "sendResolved" in spec:
        out["send_resolved"] = bool(spec["sendResolved"])
    if spec.get("urlSecret"):
        out["url"] = _secret(secrets, namespace, spec["urlSecret"])
    elif spec.get("url"):
        out["url"] = spec["url"]
    http = spec.get("httpConfig")
    if http:
        _only(http, {"authorization"}, "httpConfig")
        auth = http["authorization"]
        _only(auth, {"type", "credentials"}, "authorization")
        credentials = _secret(secrets, namespace, auth["credentials"])
        if credentials:
            out["http_config"] = {
                "authorization": {"type": auth.get("type") or "Bearer", "credentials": credentials}
            }
    if int(spec.get("maxAlerts", 0)) > 0:
        out["max_alerts"] = int(spec["maxAlerts"])
    return out


def _enforce(route: dict[str, Any], namespace: str, strategy: str, alertmanager_namespace: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown alertmanagerConfigMatcherStrategy {strategy!r}")
    exempt = strategy == "None" or (
        strategy == "OnNamespaceExceptForAlertmanagerNamespace" and namespace == alertmanager_namespace
    )
    if not exempt:
        route.setdefault("matchers", []).append(f'namespace="{namespace}"')
    route["continue"] = True


def generate(
    base: Mapping[str, Any],
    configs: Sequence[Mapping[str, Any]],
    secrets: Secrets,
    *,
    strategy: str = "OnNamespace",
    alertmanager_namespace: str = "monitoring",
) -> dict[str, Any]:
    """The configuration the operator writes for an Alertmanager whose base configuration is ``base``
    (an alertmanager.yml as a dict) and which selects the ``AlertmanagerConfig`` resources ``configs``
    (dicts as rendered by kustomize, ``metadata.namespace`` set). ``strategy`` is
    ``spec.alertmanagerConfigMatcherStrategy.type`` (default ``OnNamespace``)."""
    out = copy.deepcopy(dict(base))
    sub_routes: list[dict[str, Any]] = []
    receivers: list[dict[str, Any]] = []
    for amc in sorted(configs, key=lambda c: f"{c['metadata']['namespace']}/{c['metadata']['name']}"):
        namespace, name = amc["metadata"]["namespace"], amc["metadata"]["name"]
        spec = amc["spec"]
        _only(spec, {"route", "receivers"}, "AlertmanagerConfig.spec")
        if spec.get("route") is None:
            continue
        route = _route(spec["route"], namespace, name)
        _enforce(route, namespace, strategy, alertmanager_namespace)
        sub_routes.append(route)
        for receiver in spec.get("receivers", []):
            _only(receiver, {"name", "webhookConfigs"}, "receiver")
            converted: dict[str, Any] = {"name": f"{namespace}/{name}/{receiver['name']}"}
            if receiver.get("webhookConfigs"):
                converted["webhook_configs"] = [
                    _webhook(w, namespace, secrets) for w in receiver["webhookConfigs"]
                ]
            receivers.append(converted)
    out["route"]["routes"] = sub_routes + list(out["route"].get("routes") or [])
    out["receivers"] = list(out.get("receivers") or []) + receivers
    return out


#: kube-prometheus-stack's default Alertmanager configuration (chart values ``alertmanager.config``).
KUBE_PROMETHEUS_STACK_BASE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "kube-prometheus-stack" / "alertmanager.yaml"
)


def kube_prometheus_stack_config(
    configs: Sequence[Mapping[str, Any]],
    secrets: Secrets,
    *,
    strategy: str = "OnNamespace",
    alertmanager_namespace: str = "monitoring",
) -> dict[str, Any]:
    """:func:`generate` over kube-prometheus-stack's default configuration (what a fresh install runs)."""
    base = yaml.safe_load(KUBE_PROMETHEUS_STACK_BASE.read_text(encoding="utf-8"))
    return generate(base, configs, secrets, strategy=strategy, alertmanager_namespace=alertmanager_namespace)

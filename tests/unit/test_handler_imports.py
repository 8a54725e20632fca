"""Cold start (issue 33, docs/architecture.md §8): a Lambda handler module imports only the logger, the
metrics and its event models; the SDKs, the Kubernetes client, the composition root and the heavy domain
modules are imported by the request that needs them.

Every handler of ``template.yaml`` is imported in a fresh interpreter (this process has long imported
everything) and its ``sys.modules`` is checked — what was loaded, not how long it took (timings are
``benchmarks/handlers.py``'s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

#: Never loaded by importing any handler module (prefix match on the module name).
NEVER_AT_IMPORT = (
    "kubernetes",  # the official client: ~0.7 s; the Kubernetes adapter loads it on its first request
    "boto3",
    # no SDK session or client is created (Powertools imports the bare ``botocore`` package: its
    # ``__init__`` holds no client machinery)
    "botocore.session",
    "botocore.client",
    "botocore.loaders",
    "httpx",
    "aws_xray_sdk",  # only with RIGHTSIZER_TRACING=true
    "aws_lambda_powertools.utilities.parser",  # events are validated with their own pydantic models
    "rightsizer.wiring",  # the composition root: built by the first request
    "rightsizer.adapters",
    "rightsizer.domain.planner",
    "rightsizer.domain.placement",
    "rightsizer.domain.consolidation",
    "rightsizer.services.assess",
    "rightsizer.services.drain",
    "rightsizer.services.offhours",
    "rightsizer.services.fleet",
)
#: What one handler's import may hold all the same (none today).
ALLOWED: dict[str, tuple[str, ...]] = {}
#: … and must not, beyond the rest: the webhook never loads the drain service or the snapshot reader
#: (they come with the first alert that starts a drain); the fleet's events load with its first task.
ALSO_FORBIDDEN = {
    "alert_webhook.app": (
        "rightsizer.services.node_view",
        "rightsizer.services.snapshot",
        "rightsizer.domain.eligibility",
    ),
    "fleet.app": ("pydantic", "rightsizer.domain"),
}


class _Tagged(yaml.SafeLoader):
    """Accepts CloudFormation short-form tags (!Ref, !Sub, ...)."""


_Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)


def handler_modules() -> list[str]:
    """The module of every ``Handler`` in ``template.yaml`` (``assess/app.handler`` → ``assess.app``)."""
    template = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=_Tagged)
    handlers = {
        str(resource["Properties"]["Handler"])
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Serverless::Function"
    }
    return sorted({h.rpartition(".")[0].replace("/", ".") for h in handlers})


def loaded_by_import(module: str, env: dict[str, str] | None = None) -> list[str]:
    """The modules a fresh interpreter holds after ``import module`` (with ``functions/`` on the path)."""
    code = f"import sys, json\nimport {module}\nprint(json.dumps(sorted(sys.modules)))\n"
    run_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "functions"),
        "RIGHTSIZER_TRACING": "false",
        **(env or {}),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


def forbidden_in(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_every_function_of_the_template_is_checked() -> None:
    assert set(handler_modules()) >= {
        "assess.app",
        "alert_webhook.app",
        "drain.app",
        "offhours.app",
        "fleet.app",
    }


@pytest.mark.parametrize("module", handler_modules())
def test_a_handler_module_imports_no_sdk_no_kubernetes_and_no_use_case(module: str) -> None:
    modules = loaded_by_import(module)
    assert module in modules
    allowed = ALLOWED.get(module, ())
    never = tuple(p for p in NEVER_AT_IMPORT if p not in allowed) + ALSO_FORBIDDEN.get(module, ())
    assert forbidden_in(modules, never) == []


def test_the_check_sees_a_forbidden_import() -> None:
    # The probe is real: a module that does import the composition root is caught.
    modules = loaded_by_import("rightsizer.wiring.runtime")
    assert "rightsizer.wiring" in forbidden_in(modules, NEVER_AT_IMPORT)
    assert forbidden_in(["kubernetes.client.models"], NEVER_AT_IMPORT) == ["kubernetes.client.models"]
    assert forbidden_in(["kubernetes_validate"], NEVER_AT_IMPORT) == []


def test_tracing_on_loads_the_tracer_at_import_as_decided_once_per_cold_start() -> None:
    modules = loaded_by_import("drain.app", {"RIGHTSIZER_TRACING": "true"})
    assert "aws_lambda_powertools.tracing" in modules


def test_the_template_turns_off_pydantics_plugin_scan() -> None:
    # pydantic scans every installed distribution's entry points at its first model build unless told not to
    template = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=_Tagged)
    assert (
        template["Globals"]["Function"]["Environment"]["Variables"]["PYDANTIC_DISABLE_PLUGINS"] == "__all__"
    )


# ------------------------------------------------------------------------------ what a first request builds


def test_a_drain_start_task_builds_no_observers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The state machine's Start task only writes the workflow record: the Prometheus client and the AWS
    # inventory (three SDK clients) are built by the first validate, the first step that observes.
    from rightsizer.config import Config
    from rightsizer.wiring import Runtime, builders

    def built(*args: object, **kwargs: object) -> None:
        raise AssertionError("observers built")

    monkeypatch.setattr(builders, "build_metrics_reader", built)
    monkeypatch.setattr(builders, "build_inventory", built)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    cluster = {"name": "prod-eks", "context": "prod", "kubeconfig": str(kubeconfig)}
    runtime = Runtime(Config.model_validate({"cluster": cluster, "aws": {"region": "us-east-1"}}), "serve")

    deps = runtime.drain_deps()

    assert "observers" not in runtime.__dict__
    with pytest.raises(AssertionError, match="observers built"):  # … and the first assessment builds them
        deps.assessor.assess_node("gpu-1", datetime.now(UTC))

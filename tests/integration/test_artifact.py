"""The Lambda artifact (functions/Makefile, SAM's makefile builder) ships the handlers and the product
package, never the test doubles or demo data (docs/architecture.md §7), and every handler imports from it alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


class _Tagged(yaml.SafeLoader):
    """Accepts CloudFormation short-form tags (!Ref, !Sub, ...)."""


_Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifact")
    # PIP=true: the dependency install is SAM's job here; this checks what of ours goes in.
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT / "functions"),
            "build-DrainFunction",
            f"ARTIFACTS_DIR={out}",
            "PIP=true",
        ],
        check=True,
        timeout=120,
    )
    return out


def test_every_function_uses_the_makefile_builder() -> None:
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=_Tagged)
    functions = {k: v for k, v in template["Resources"].items() if v["Type"] == "AWS::Serverless::Function"}
    assert len(functions) == 7  # four, and EnableFleet's three (issue 31)
    assert {k: v.get("Metadata", {}).get("BuildMethod") for k, v in functions.items()} == dict.fromkeys(
        functions, "makefile"
    )


def test_artifact_leaves_out_the_doubles_and_demo_data(artifact: Path) -> None:
    assert {p.name for p in artifact.iterdir()} >= {
        "assess",
        "alert_webhook",
        "drain",
        "offhours",
        "fleet",
        "rightsizer",
    }
    assert not (artifact / "rightsizer" / "testing").exists()
    assert not (artifact / "rightsizer" / "backtest").exists()
    assert not (artifact / "rightsizer" / "data" / "examples").exists()
    assert (artifact / "rightsizer" / "data" / "ec2-gpu-instances.csv").exists()
    assert not list(artifact.rglob("*moto*"))


def test_handlers_import_from_the_artifact_without_test_support(artifact: Path) -> None:
    code = (
        "import sys, importlib\n"
        "for m in ('assess.app', 'alert_webhook.app', 'drain.app', 'offhours.app', 'fleet.app'):\n"
        "    importlib.import_module(m)\n"
        "from rightsizer.domain.catalog import load_catalog\n"
        "assert load_catalog().get('g5.xlarge') is not None\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('rightsizer.testing') is None\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'moto', 'kubernetes'}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(artifact)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=artifact, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

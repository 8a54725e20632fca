"""The Lambda artifact (functions/Makefile, SAM's makefile builder) ships the handlers and the product
package, never the test doubles or demo data (docs/architecture.md §7), every handler imports from it alone,
and every module ships its python3.12 bytecode (issue 33: /var/task is read-only, so a missing .pyc is a
compile at every cold start)."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
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


def lambda_python() -> str:
    """A python3.12 interpreter (the template's Runtime) to compile the bytecode; skip without one, fail
    without one in CI."""
    found = [
        shutil.which("python3.12"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))),
    ]
    for candidate in filter(None, found):
        probe = [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"]
        if subprocess.run(probe, capture_output=True, timeout=60).returncode == 0:
            return candidate
    if os.environ.get("CI") == "true":
        pytest.fail("no python3.12 interpreter: the artifact's bytecode is compiled by the runtime's version")
    pytest.skip("no python3.12 interpreter to compile the artifact's bytecode")


def build(out: Path, *args: str, timeout: float = 120) -> Path:
    """``make build-DrainFunction`` into ``out`` (what ``sam build`` runs for every function)."""
    target = ["make", "-s", "-C", str(ROOT / "functions"), "build-DrainFunction", f"ARTIFACTS_DIR={out}"]
    subprocess.run([*target, *args], check=True, timeout=timeout)
    return out


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # PIP=true: the dependency install is SAM's job here; this checks what of ours goes in.
    return build(tmp_path_factory.mktemp("artifact"), "PIP=true", f"LAMBDA_PYTHON={lambda_python()}")


def uncompiled(root: Path) -> list[str]:
    """The modules under ``root`` without an unchecked-hash python3.12 ``.pyc`` beside them (PEP 552:
    header flags 0b01 — hash-based, source never checked, as a read-only /var/task needs)."""
    tag = "cpython-312"
    missing = []
    for source in root.rglob("*.py"):
        compiled = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
        header = compiled.read_bytes()[:16] if compiled.exists() else b""
        if len(header) < 16 or int.from_bytes(header[4:8], "little") != 0b01:
            missing.append(str(source.relative_to(root)))
    return missing


def test_every_function_uses_the_makefile_builder() -> None:
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=_Tagged)
    functions = {k: v for k, v in template["Resources"].items() if v["Type"] == "AWS::Serverless::Function"}
    assert len(functions) == 11  # four, EnableFleet's three (issue 31), the sharded assessment's four (33)
    assert {k: v.get("Metadata", {}).get("BuildMethod") for k, v in functions.items()} == dict.fromkeys(
        functions, "makefile"
    )


def test_functions_makefile_builds_every_function_of_the_template(tmp_path: Path) -> None:
    # `sam build` runs `make build-<LogicalId>` in functions/ for every makefile-built function: a
    # function the Makefile has no rule for stops the whole build ("No rule to make target").
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=_Tagged)
    built = [
        name
        for name, res in template["Resources"].items()
        if res["Type"] == "AWS::Serverless::Function"
        and res.get("Metadata", {}).get("BuildMethod") == "makefile"
    ]
    no_rule = {}
    for name in built:
        dry = ["make", "-n", "-C", str(ROOT / "functions"), f"build-{name}", f"ARTIFACTS_DIR={tmp_path}"]
        done = subprocess.run(dry, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            no_rule[name] = done.stderr.strip().splitlines()[-1:]
    assert no_rule == {}


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
        "for m in ('assess.app', 'assess.shard', 'alert_webhook.app', 'drain.app', 'offhours.app', 'fleet.app'):\n"
        "    importlib.import_module(m)\n"
        "from rightsizer.domain.catalog import load_catalog\n"
        "assert load_catalog().get('g5.xlarge') is not None\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('rightsizer.testing') is None\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'moto', 'kubernetes'}))\n"
    )
    # read-only, as /var/task is: no bytecode of this interpreter is written beside the runtime's
    env = {**os.environ, "PYTHONPATH": str(artifact), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=artifact, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_module_of_ours_ships_unchecked_python312_bytecode(artifact: Path) -> None:
    sources = list(artifact.rglob("*.py"))
    assert len(sources) > 100 and (artifact / "rightsizer" / "wiring" / "runtime.py") in sources
    assert uncompiled(artifact) == []
    # … and nothing else: no bytecode of another interpreter beside it
    assert {p.name.split(".")[1] for p in artifact.rglob("*.pyc")} == {"cpython-312"}


def test_the_bytecode_is_the_same_whatever_the_build_directory(tmp_path: Path) -> None:
    # SAM builds each of the seven functions in its own directory: identical bytes, /var/task in them
    python = lambda_python()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = (build(tmp_path / d, "PIP=true", f"LAMBDA_PYTHON={python}") for d in ("a", "b"))
    pyc = Path("rightsizer") / "wiring" / "__pycache__" / "runtime.cpython-312.pyc"
    assert (one / pyc).read_bytes() == (two / pyc).read_bytes()
    assert b"/var/task/rightsizer/wiring/runtime.py" in (one / pyc).read_bytes()


def test_a_build_with_another_python_than_the_runtime_stops(tmp_path: Path) -> None:
    if sys.version_info[:2] == (3, 12):
        pytest.skip("this interpreter is the runtime's version")
    done = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT / "functions"),
            "build-DrainFunction",
            f"ARTIFACTS_DIR={tmp_path}",
            "PIP=true",
            f"LAMBDA_PYTHON={sys.executable}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "needs python3.12" in done.stderr


@pytest.mark.slow
def test_the_locked_dependencies_ship_their_bytecode_too(tmp_path: Path) -> None:
    # The whole artifact as `sam build` makes it: the hashed lock installed for the runtime, then compiled.
    if importlib.util.find_spec("pip") is None:
        pytest.skip("no pip in this environment")
    out = build(tmp_path, f"PIP={sys.executable} -m pip", f"LAMBDA_PYTHON={lambda_python()}", timeout=900)
    assert (out / "botocore" / "__init__.py").exists() and (
        out / "kubernetes" / "client" / "__init__.py"
    ).exists()
    assert uncompiled(out) == []

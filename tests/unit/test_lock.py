"""Issue 14 item 5: the Lambda artifact is built from a hashed lock that covers every runtime dependency.

``functions/requirements.txt`` is the lock (``make lock``: ``uv pip compile --generate-hashes`` of
``functions/requirements.in`` for python3.12 manylinux); ``functions/Makefile`` (``sam build``) installs
exactly it with ``--require-hashes``. These tests fail when the lock drifts from what the code requires.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "functions" / "requirements.txt"
IN = ROOT / "functions" / "requirements.in"

sys.path.insert(0, str(ROOT / "tests" / "support"))
from pip_audit_gate import gate, locked, project_page_gate  # noqa: E402


def _entries() -> dict[str, tuple[Version, list[str], str]]:
    """Locked package → (version, sha256 hashes, its whole block of text)."""
    entries: dict[str, tuple[Version, list[str], str]] = {}
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text(encoding="utf-8"))
    for block in blocks:
        head = block.split("\n", 1)[0]
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)", head)
        if match is None:
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})\b", block)
        entries[canonicalize_name(match.group(1))] = (Version(match.group(2)), hashes, block)
    return entries


def _requirements(lines: list[str]) -> list[Requirement]:
    return [Requirement(line.split("#", 1)[0].strip()) for line in lines if line.split("#", 1)[0].strip()]


def _runtime() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return _requirements(project["dependencies"])


def _inputs() -> list[Requirement]:
    return _requirements(IN.read_text(encoding="utf-8").splitlines())


def test_every_package_of_the_lock_is_pinned_with_hashes() -> None:
    entries = _entries()
    assert len(entries) >= 20
    text = LOCK.read_text(encoding="utf-8")
    package_lines = [line for line in text.splitlines() if re.match(r"^[A-Za-z0-9]", line)]
    assert len(package_lines) == len(entries), "a package line that is not name==version"
    for name, (_version, hashes, _block) in entries.items():
        assert hashes, f"{name} has no --hash"


@pytest.mark.parametrize("requirement", _runtime() + _inputs(), ids=str)
def test_the_lock_satisfies_every_runtime_requirement(requirement: Requirement) -> None:
    # pyproject's [project].dependencies (what the code imports) and requirements.in (the lock's input)
    entries = _entries()
    name = canonicalize_name(requirement.name)
    assert name in entries, f"{requirement} is not in the lock: run `make lock`"
    version = entries[name][0]
    assert requirement.specifier.contains(version, prereleases=True), (
        f"lock has {name}=={version}, need {requirement}"
    )


def test_requirements_in_covers_pyproject_and_every_input_is_a_direct_dependency_of_the_lock() -> None:
    inputs = {canonicalize_name(r.name) for r in _inputs()}
    assert {canonicalize_name(r.name) for r in _runtime()} <= inputs
    entries = _entries()
    for name in inputs:
        assert "-r functions/requirements.in" in entries[name][2], (
            f"{name} is not locked from requirements.in"
        )


def test_boto3_and_botocore_ship_in_the_artifact_at_one_version() -> None:
    entries = _entries()
    boto3, botocore = entries["boto3"][0], entries["botocore"][0]
    # boto3 X.Y.Z requires botocore >=X.Y.Z,<X.(Y+1): the lock holds the matching pair.
    assert (boto3.major, boto3.minor) == (botocore.major, botocore.minor)
    assert botocore >= boto3


def test_sam_build_installs_exactly_the_lock() -> None:
    makefile = (ROOT / "functions" / "Makefile").read_text(encoding="utf-8")
    install = next(line for line in makefile.splitlines() if "pip" in line.lower() and "install" in line)
    follow = makefile[makefile.index(install) :].split("\n\n", 1)[0]
    assert "--require-hashes" in follow and "--no-deps" in follow and "-r requirements.txt" in follow
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")
    # every function is built by functions/Makefile (the four, EnableFleet's three, EnableSharding's four)
    assert template.count("BuildMethod: makefile") == template.count("Type: AWS::Serverless::Function") == 11


# ------------------------------------------------------------------------------------- pip-audit gate


def test_gate_clean_report() -> None:
    report = '{"dependencies": [{"name": "httpx", "version": "0.28.1", "vulns": []}], "fixes": []}'
    assert gate(0, report, "") == (0, "pip-audit: 1 locked packages, no known vulnerabilities")


def test_gate_fails_on_known_vulnerabilities_naming_them() -> None:
    report = (
        '{"dependencies": [{"name": "jinja2", "version": "2.10", "vulns": '
        '[{"id": "PYSEC-2019-217", "fix_versions": ["2.10.1"]}, {"id": "GHSA-x", "fix_versions": []}]}]}'
    )
    code, text = gate(1, report, "")
    assert code == 1
    assert "jinja2 2.10: PYSEC-2019-217 (fixed in 2.10.1)" in text and "GHSA-x (no fix yet)" in text
    assert "make lock" in text


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr"),
    [
        (1, "", "requests.exceptions.ConnectionError: Failed to resolve 'pypi.org'"),
        (1, "not json", "ProxyError"),
        (0, '{"dependencies": [{"name": "a", "skip_reason": "Dependency not found on PyPI"}]}', ""),
        (1, '{"unexpected": true}', "boom"),
    ],
)
def test_gate_says_plainly_when_nothing_was_checked_and_does_not_fail(
    returncode: int, stdout: str, stderr: str
) -> None:
    code, text = gate(returncode, stdout, stderr)
    assert code == 0
    assert "NOT checked" in text


def test_gate_lists_the_packages_it_could_not_check() -> None:
    report = (
        '{"dependencies": [{"name": "a", "version": "1", "vulns": []}, '
        '{"name": "b", "skip_reason": "Dependency not found on PyPI"}]}'
    )
    code, text = gate(0, report, "")
    assert code == 0 and "1 of 2 locked packages could NOT be checked" in text and "b" in text


# -------------------------------------------------------- fallback: PyPI project pages (newest release only)


def _page(version: str, *vulns: dict[str, object]) -> dict[str, object]:
    return {"info": {"version": version}, "vulnerabilities": list(vulns)}


def test_the_lock_parses_to_every_pin() -> None:
    pins = locked(LOCK.read_text(encoding="utf-8"))
    assert len(pins) == len(_entries())
    assert {canonicalize_name(n): Version(v) for n, v in pins} == {k: v[0] for k, v in _entries().items()}


def test_project_pages_judge_pins_at_their_newest_release() -> None:
    pages = {"a": _page("1.0"), "b": _page("2.0", {"id": "GHSA-old", "withdrawn": "2024-01-01"})}
    code, text = project_page_gate([("a", "1.0"), ("b", "2.0")], pages.get)
    assert code == 0 and "2 locked packages, each its newest release, no known vulnerabilities" in text


def test_project_pages_fail_on_a_vulnerability_of_the_locked_release() -> None:
    pages = {"a": _page("1.0", {"id": "PYSEC-2026-1", "fixed_in": ["1.0.1"]}), "b": _page("2.0", {"id": "X"})}
    code, text = project_page_gate([("a", "1.0"), ("b", "2.0")], pages.get)
    assert code == 1
    assert "a 1.0: PYSEC-2026-1 (fixed in 1.0.1)" in text and "b 2.0: X (no fix yet)" in text


def test_project_pages_never_judge_an_older_pin_by_the_newest_release() -> None:
    # the newest release's advisory says nothing about the pinned one: listed as NOT checked, never found
    pages = {"a": _page("1.0"), "k8s": _page("37.0.2", {"id": "GHSA-new", "fixed_in": ["37.0.3"]})}
    code, text = project_page_gate([("a", "1.0"), ("k8s", "36.0.3")], pages.get)
    assert code == 0
    assert (
        "1 of 2 locked packages checked" in text and "k8s 36.0.3: PyPI's page speaks for 37.0.2 only" in text
    )
    assert "GHSA-new" not in text


@pytest.mark.parametrize("answer", [None, {"info": {"version": "1.0"}}, "<html>", {"vulnerabilities": []}])
def test_project_pages_unreachable_or_unusable_say_so_and_do_not_fail(answer: object) -> None:
    code, text = project_page_gate([("a", "1.0")], lambda _name: answer)
    assert code == 0 and "the lock was NOT checked" in text

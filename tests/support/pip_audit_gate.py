"""Gate of ``make validate``: known vulnerabilities of the locked Lambda artifact (issue 14 item 5).

Usage: ``python pip_audit_gate.py PIP_AUDIT LOCK`` — runs ``PIP_AUDIT -r LOCK --require-hashes
--disable-pip -f json`` (the lock is fully pinned and hashed, so nothing is resolved or
installed) against PyPI's advisory database (OSV's when PyPI gives no usable answer), and:

* exit 0, ``pip-audit: N locked packages, no known vulnerabilities`` — none found;
* exit 0, listing them — packages the database does not know (``skip_reason``): never counted as clean;
* exit 1, one line per ``package version: advisory id (fixed in …)`` — some found (remedy: ``make lock``);
* exit 0, ``pip-audit: the vulnerability database could not be reached …: the lock was NOT checked`` —
  no answer (offline CI, PyPI down): said plainly, never mistaken for a clean bill.

When neither answers — a proxy that passes PyPI's project pages but not its per-release pages
(``/pypi/<name>/<version>/json``, which pip-audit asks) — the gate asks PyPI's project page
(``/pypi/<name>/json``) itself: its ``vulnerabilities`` are those of the project's newest release
(PyPI JSON API), so they answer for every package locked at its newest release; a package locked at an
older one is listed as NOT checked, with both versions (remedy: ``make lock`` takes the newest).

Standard library only, so any ``python3`` runs it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["gate", "locked", "main", "project_page_gate"]

TIMEOUT_S = 600
PROJECT_PAGE = "https://pypi.org/pypi/{name}/json"
Fetch = Callable[[str], Any]


def locked(lock_text: str) -> list[tuple[str, str]]:
    """(name, version) of every ``name==version`` line of a lock file, in order."""
    return re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", lock_text, re.MULTILINE)


def _fetch(name: str) -> Any:
    """PyPI's project page of ``name`` as JSON; None when it cannot be had."""
    request = urllib.request.Request(PROJECT_PAGE.format(name=name), headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def project_page_gate(pins: list[tuple[str, str]], fetch: Fetch = _fetch) -> tuple[int, str]:
    """Exit code and report from PyPI's project pages (module docstring): each page's ``vulnerabilities``
    (not ``withdrawn``) judge the pin when the pin is the page's newest release (``info.version``)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        pages = list(pool.map(lambda pin: fetch(pin[0]), pins))
    found: list[str] = []
    unchecked: list[str] = []
    checked = 0
    for (name, version), page in zip(pins, pages, strict=True):
        info = page.get("info") if isinstance(page, dict) else None
        if not isinstance(info, dict) or not isinstance(page.get("vulnerabilities"), list):
            unchecked.append(f"  {name} {version}: no usable answer from PyPI")
            continue
        newest = str(info.get("version", ""))
        if newest.lower() != version.lower():
            unchecked.append(f"  {name} {version}: PyPI's page speaks for {newest} only")
            continue
        checked += 1
        for vuln in page["vulnerabilities"]:
            if isinstance(vuln, dict) and not vuln.get("withdrawn"):
                fixed = vuln.get("fixed_in") or []
                found.append(
                    f"  {name} {version}: {vuln.get('id')}"
                    + (f" (fixed in {', '.join(fixed)})" if fixed else " (no fix yet)")
                )
    source = "pip-audit fallback (PyPI project pages):"
    if checked == 0:
        reason = unchecked[0].strip() if unchecked else "an empty lock"
        return 0, f"{source} nothing usable ({reason} …): the lock was NOT checked for known vulnerabilities"
    if found:
        return 1, "\n".join(
            [
                f"{source} {len(found)} known vulnerabilities in the locked Lambda artifact:",
                *found,
                "Remedy: `make lock` (takes the fixed releases), then `make test`.",
            ]
        )
    if unchecked:
        return 0, "\n".join(
            [
                f"{source} {checked} of {len(pins)} locked packages checked, no known vulnerabilities; "
                f"{len(unchecked)} could NOT be checked (older than their newest release: pinned or held back by "
                "a dependency; `make lock` takes the newest allowed):",
                *unchecked,
            ]
        )
    return 0, f"{source} {checked} locked packages, each its newest release, no known vulnerabilities"


def gate(returncode: int, stdout: str, stderr: str) -> tuple[int, str]:
    """Exit code and report for one pip-audit run (its exit code, JSON stdout and stderr)."""
    try:
        report: Any = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("dependencies"), list):
        reason = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "no report")
        return 0, (
            "pip-audit: the vulnerability database could not be reached or answered nothing usable "
            f"({reason[:300]}): the lock was NOT checked for known vulnerabilities"
        )
    dependencies = report["dependencies"]
    found = [
        f"  {dep.get('name')} {dep.get('version')}: {vuln.get('id')}"
        + (f" (fixed in {', '.join(vuln['fix_versions'])})" if vuln.get("fix_versions") else " (no fix yet)")
        for dep in dependencies
        for vuln in dep.get("vulns") or []
    ]
    skipped = [
        f"  {dep.get('name')} {dep.get('version', '')}: {dep['skip_reason']}"
        for dep in dependencies
        if dep.get("skip_reason")
    ]
    if found:
        return 1, "\n".join(
            [
                f"pip-audit: {len(found)} known vulnerabilities in the locked Lambda artifact:",
                *found,
                "Remedy: `make lock` (takes the fixed releases), then `make test`.",
            ]
        )
    if skipped and len(skipped) == len(dependencies):
        return 0, (
            f"pip-audit: the vulnerability database knew none of the {len(dependencies)} locked packages "
            f"({skipped[0].strip()} …): the lock was NOT checked for known vulnerabilities"
        )
    if skipped:
        return 0, "\n".join(
            [
                f"pip-audit: no known vulnerabilities, but {len(skipped)} of {len(dependencies)} locked packages "
                "could NOT be checked:",
                *skipped,
            ]
        )
    if returncode != 0:
        reason = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        return 0, f"pip-audit: incomplete answer ({reason[:300]}): the lock was NOT fully checked"
    return 0, f"pip-audit: {len(dependencies)} locked packages, no known vulnerabilities"


def main(argv: list[str]) -> int:
    """Run pip-audit on the lock and print the verdict; see the module docstring for exit codes.

    PyPI's advisory database is asked first, OSV's when PyPI gave no usable answer (a mirror without the
    JSON API answers 404 for every package).
    """
    pip_audit, lock = argv[1], argv[2]
    verdict = (0, "pip-audit: not run")
    unchecked: list[str] = []
    for service in ("pypi", "osv"):
        command = [
            pip_audit,
            "-r",
            lock,
            "--require-hashes",
            "--disable-pip",
            "-s",
            service,
            "-f",
            "json",
            "--progress-spinner",
            "off",
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            verdict = (0, f"pip-audit ({service}): no answer within {TIMEOUT_S} s: the lock was NOT checked")
            unchecked.append(verdict[1])
            continue
        code, text = gate(done.returncode, done.stdout, done.stderr)
        verdict = (code, text.replace("pip-audit:", f"pip-audit ({service}):", 1))
        if "NOT checked" not in text:
            break
        unchecked.append(verdict[1])
    else:
        verdict = project_page_gate(locked(Path(lock).read_text(encoding="utf-8")))
        unchecked.append(verdict[1])
        verdict = (verdict[0], "\n".join(unchecked))
    print(verdict[1])
    return verdict[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Gate of ``make validate``: checkov's findings on ``template.yaml`` against ``infra/checkov/triage.yaml``.

Usage: ``checkov -f template.yaml --framework cloudformation -o json | python checkov_gate.py TRIAGE``.
Exit 0 when every failed check is triaged (check id and resource listed, with a reason) and every triage
entry still matches a finding; 1 otherwise, naming each untriaged finding and each stale entry. Runs with
the interpreter of checkov's own virtual environment (it needs only PyYAML, which checkov depends on).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["gate", "main"]


def _findings(report: Any) -> set[tuple[str, str]]:
    """(check id, resource) of every failed check; checkov prints one object or a list (one per framework)."""
    reports: Iterable[Mapping[str, Any]] = report if isinstance(report, list) else [report]
    found = set()
    for one in reports:
        for failed in one.get("results", {}).get("failed_checks", []):
            found.add((str(failed["check_id"]), str(failed["resource"])))
    return found


def gate(report: Any, triage: Any) -> list[str]:
    """The problems: untriaged findings and stale triage entries (empty = pass).

    Raises:
        ValueError: a triage entry lacks ``check``, ``resources`` or a non-empty ``reason``.
    """
    accepted: set[tuple[str, str]] = set()
    for entry in triage or []:
        if not entry.get("check") or not entry.get("resources") or not str(entry.get("reason", "")).strip():
            raise ValueError(f"triage entry needs check, resources and a reason: {entry!r}")
        accepted |= {(str(entry["check"]), str(r)) for r in entry["resources"]}
    findings = _findings(report)
    problems = [f"untriaged: {check} {resource}" for check, resource in sorted(findings - accepted)]
    problems += [f"stale triage entry: {check} {resource}" for check, resource in sorted(accepted - findings)]
    return problems


def main(argv: list[str]) -> int:
    """``checkov_gate.py TRIAGE`` with checkov's JSON report on stdin; prints a summary line."""
    triage = yaml.safe_load(Path(argv[1]).read_text(encoding="utf-8"))
    report = json.loads(sys.stdin.read())
    problems = gate(report, triage)
    for problem in problems:
        print(problem)
    print(f"checkov: {len(_findings(report))} finding(s), all triaged" if not problems else "checkov: FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""The checkov gate of ``make validate`` (``tests/support/checkov_gate.py``) and the checked-in triage."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.checkov_gate import gate

ROOT = Path(__file__).resolve().parents[2]


def report(*findings: tuple[str, str]) -> dict[str, object]:
    failed = [{"check_id": c, "resource": r, "check_name": "x"} for c, r in findings]
    return {"check_type": "cloudformation", "results": {"failed_checks": failed}}


TRIAGE = [{"check": "CKV_AWS_116", "resources": ["AWS::Serverless::Function.A"], "reason": "sync only"}]


def test_every_finding_triaged_passes() -> None:
    assert gate(report(("CKV_AWS_116", "AWS::Serverless::Function.A")), TRIAGE) == []
    # checkov prints a list when several frameworks ran
    assert gate([report(("CKV_AWS_116", "AWS::Serverless::Function.A"))], TRIAGE) == []


def test_an_untriaged_finding_fails_and_is_named() -> None:
    problems = gate(
        report(
            ("CKV_AWS_116", "AWS::Serverless::Function.A"), ("CKV_AWS_116", "AWS::Serverless::Function.B")
        ),
        TRIAGE,
    )
    assert problems == ["untriaged: CKV_AWS_116 AWS::Serverless::Function.B"]


def test_a_stale_entry_fails() -> None:
    assert gate(report(), TRIAGE) == ["stale triage entry: CKV_AWS_116 AWS::Serverless::Function.A"]


def test_an_entry_without_reason_is_rejected() -> None:
    with pytest.raises(ValueError, match="reason"):
        gate(report(), [{"check": "CKV_AWS_116", "resources": ["X"], "reason": " "}])


def test_the_checked_in_triage_names_only_resources_of_the_template() -> None:
    triage = yaml.safe_load((ROOT / "infra/checkov/triage.yaml").read_text(encoding="utf-8"))
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")
    for entry in triage:
        assert len(str(entry["reason"])) > 80, entry["check"]
        for resource in entry["resources"]:
            kind, _, logical_id = resource.rpartition(".")
            assert f"  {logical_id}:\n    Type: {kind}\n" in template, resource

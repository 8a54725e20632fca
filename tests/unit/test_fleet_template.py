"""The fleet's IAM (issue 31): the spoke role of ``infra/spoke/spoke.yaml`` and the hub's fleet roles in
``template.yaml`` hold exactly the actions the code behind them declares (``IAM_ACTIONS``), both ways; the
spoke's trust is limited by organisation, external id and the hub's fleet roles; its name cannot collide.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from tests.unit.test_template import CfnLoader, statements

ROOT = Path(__file__).resolve().parents[2]


def _load(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((ROOT / path).read_text(encoding="utf-8"), Loader=CfnLoader)
    return loaded


def _declared(*modules: str) -> set[str]:
    return {a for m in modules for a in importlib.import_module(f"rightsizer.{m}").IAM_ACTIONS}


def _actions(role: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for policy in role["Properties"]["Policies"]:
        for statement in statements(policy["PolicyDocument"]):
            action = statement["Action"]
            found |= set(action if isinstance(action, list) else [action])
    return found


#: Always allowed or not IAM-checked: EKS tokens are presigned GetCallerIdentity calls.
ALWAYS = {"sts:GetCallerIdentity"}


def test_the_spoke_role_holds_exactly_the_assessment_and_discovery_reads() -> None:
    role = _load("infra/spoke/spoke.yaml")["Resources"]["SpokeRole"]
    # What a member assesses under it (adapters.aws inventory, eks_auth, pricing, SigV4 to AMP) and what
    # discovery asks of an account (fleet_aws, without the hub's own calls: Organizations, S3, AssumeRole)
    assessment = _declared(
        "adapters.aws", "adapters.eks_auth", "adapters.pricing", "adapters.prometheus_auth"
    )
    discovery = _declared("adapters.fleet_aws") - {
        "organizations:ListAccounts",
        "s3:GetObject",
        "s3:PutObject",
        "sts:AssumeRole",
    }
    assert _actions(role) == (assessment | discovery) - ALWAYS


def test_the_spoke_trust_is_limited_by_organisation_external_id_and_the_hubs_fleet_roles() -> None:
    role = _load("infra/spoke/spoke.yaml")["Resources"]["SpokeRole"]
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"]["StringEquals"] == {
        "sts:ExternalId": {"Ref": "ExternalId"},
        "aws:PrincipalOrgID": {"Ref": "OrganizationId"},
    }
    assert trust["Condition"]["ArnLike"]["aws:PrincipalArn"] == {
        "Fn::Sub": "arn:${AWS::Partition}:iam::${HubAccountId}:role/${HubStackName}-Fleet*"
    }


def test_the_named_spoke_role_is_created_in_one_region_and_the_hub_names_none() -> None:
    spoke = _load("infra/spoke/spoke.yaml")
    assert spoke["Resources"]["SpokeRole"]["Condition"] == "CreateRole"
    assert spoke["Conditions"]["CreateRole"] == {
        "Fn::Equals": [{"Ref": "AWS::Region"}, {"Ref": "RoleRegion"}]
    }
    hub = _load("template.yaml")["Resources"]
    for name, resource in hub.items():
        if resource["Type"] == "AWS::IAM::Role":
            assert "RoleName" not in resource["Properties"], name  # generated names only: no collision


def test_the_hub_fleet_roles_hold_what_their_handlers_call() -> None:
    hub = _load("template.yaml")["Resources"]
    # Discovery: Organizations, the spoke role, the manifest; the summary: the bucket; the member: only the
    # spoke role (and the policy parameter when it lives in SSM, as every function's).
    assert _actions(hub["FleetDiscoverRole"]) == {
        "organizations:ListAccounts",
        "sts:AssumeRole",
        "s3:PutObject",
        "s3:GetObject",
    }
    assert _actions(hub["FleetSummarizeRole"]) == {"s3:GetObject", "s3:PutObject"}
    assert _actions(hub["FleetMemberRole"]) == {"sts:AssumeRole", "ssm:GetParameter"}
    for name in ("FleetDiscoverRole", "FleetSummarizeRole", "FleetMemberRole"):
        assert _actions(hub[name]) <= _declared("adapters.fleet_aws", "wiring.runtime"), name
        assert hub[name]["Condition"] == "Fleet"


def test_the_fleet_state_machine_is_opt_in_and_scheduled() -> None:
    hub = _load("template.yaml")
    machine = hub["Resources"]["FleetStateMachine"]
    assert machine["Condition"] == "Fleet"
    assert hub["Conditions"]["Fleet"] == {"Fn::Equals": [{"Ref": "EnableFleet"}, "true"]}
    assert hub["Parameters"]["EnableFleet"]["Default"] == "false"
    assert machine["Properties"]["DefinitionUri"] == "infra/statemachine/fleet.asl.json"
    assert machine["Properties"]["Events"]["Tick"]["Type"] == "ScheduleV2"
    text = (ROOT / "infra/statemachine/fleet.asl.json").read_text(encoding="utf-8")
    for substitution in machine["Properties"]["DefinitionSubstitutions"]:
        assert "${" + substitution + "}" in text, substitution

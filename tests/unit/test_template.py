"""``template.yaml`` read as data: the deployment contract of docs/architecture.md §6 (no AWS, no SAM CLI needed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rightsizer.testing.dynamodb_table import TABLE_DEFINITION

ROOT = Path(__file__).resolve().parents[2]
MUTATING_PREFIXES = (
    "autoscaling:Terminate",
    "autoscaling:Update",
    "eks:Update",
    "ec2:Stop",
    "ec2:Start",
    "ec2:Modify",
    "dynamodb:Put",
    "dynamodb:Update",
    "dynamodb:Delete",
    "states:Start",
)


class CfnLoader(yaml.SafeLoader):
    """A YAML loader that keeps CloudFormation short-form tags as ``{"Fn::X": value}`` / ``{"Ref": value}``."""


def _construct(tag: str) -> Any:
    name = "Ref" if tag == "Ref" else ("Fn::GetAtt" if tag == "GetAtt" else f"Fn::{tag}")

    def build(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if tag == "GetAtt":
                value = str(value).split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        return {name: value}

    return build


for _tag in (
    "Ref",
    "Sub",
    "GetAtt",
    "If",
    "Equals",
    "Not",
    "Join",
    "Select",
    "Split",
    "And",
    "Or",
    "Condition",
):
    CfnLoader.add_constructor(f"!{_tag}", _construct(_tag))


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=CfnLoader)
    return loaded


def resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def statements(document: Any) -> list[dict[str, Any]]:
    """Every statement, with ``Fn::If`` branches flattened (both may be deployed)."""
    found: list[dict[str, Any]] = []
    for item in document.get("Statement", []):
        if isinstance(item, dict) and "Fn::If" in item:
            found.extend(b for b in item["Fn::If"][1:] if isinstance(b, dict) and "Effect" in b)
        else:
            found.append(item)
    return found


def all_statements(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, res in template["Resources"].items():
        if res["Type"] == "AWS::IAM::ManagedPolicy":
            found += [(name, s) for s in statements(res["Properties"]["PolicyDocument"])]
        if res["Type"] == "AWS::IAM::Role":
            for policy in res["Properties"].get("Policies", []):
                found += [(name, s) for s in statements(policy["PolicyDocument"])]
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_python312_functions_from_one_code_uri(template: dict[str, Any]) -> None:
    functions = resources(template, "AWS::Serverless::Function")
    handlers = {f["Properties"]["Handler"] for f in functions.values()}
    assert handlers == {
        "assess/app.handler",
        "alert_webhook/app.lambda_handler",
        "offhours/app.handler",
        "drain/app.handler",
        # EnableFleet (issue 31): the fleet state machine's three tasks
        "fleet/app.discover",
        "fleet/app.member",
        "fleet/app.summarize",
        # EnableSharding (issue 33): the sharded assessment's four tasks
        "assess/shard.prepare",
        "assess/shard.observe",
        "assess/shard.merge",
        "assess/shard.release",
    }
    shard = {n for n, f in functions.items() if f["Properties"]["Handler"].startswith("assess/shard.")}
    assert all(functions[n]["Condition"] == "Sharding" for n in shard)
    fleet = {n for n, f in functions.items() if f["Properties"]["Handler"].startswith("fleet/")}
    assert all(functions[n]["Condition"] == "Fleet" for n in fleet)
    globals_ = template["Globals"]["Function"]
    assert globals_["Runtime"] == "python3.12"
    assert globals_["CodeUri"] == "functions/"
    for f in functions.values():
        assert "CodeUri" not in f["Properties"] and "Runtime" not in f["Properties"]
    for handler in handlers:
        # The module exists and defines the named function (read, not imported: no side effects here).
        path, _, function = handler.partition(".")
        source = (ROOT / "functions" / path).with_suffix(".py").read_text(encoding="utf-8")
        tree = ast.parse(source)
        assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, handler


def test_dry_run_is_the_default(template: dict[str, Any]) -> None:
    assert template["Parameters"]["DryRun"]["Default"] == "true"
    assert template["Globals"]["Function"]["Environment"]["Variables"]["RIGHTSIZER_DRY_RUN"] == {
        "Ref": "DryRun"
    }


def test_state_table_matches_the_adapter(template: dict[str, Any]) -> None:
    (table,) = resources(template, "AWS::DynamoDB::Table").values()
    props = table["Properties"]
    assert props["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    for key in ("AttributeDefinitions", "KeySchema", "GlobalSecondaryIndexes", "BillingMode"):
        assert props[key] == TABLE_DEFINITION[key], key


def test_functions_that_observe_the_whole_cluster_get_a_full_vcpu(template: dict[str, Any]) -> None:
    """Assess, and off-hours before it scales a group down, observe the whole cluster (``Runtime.observe``):
    643 MiB and 159 client CPU-s at 10,000 GPU nodes (``benchmarks/assess_memory.py``); a Lambda's CPU
    share follows its memory (1,769 MB = one vCPU), and the Globals' 512 MB would hold neither."""
    functions = resources(template, "AWS::Serverless::Function")
    for name in ("AssessFunction", "OffhoursFunction"):
        assert functions[name]["Properties"]["MemorySize"] >= 1769, name


def test_schedules_send_the_scheduler_input(template: dict[str, Any]) -> None:
    functions = resources(template, "AWS::Serverless::Function")
    for name in ("AssessFunction", "OffhoursFunction"):
        (event,) = functions[name]["Properties"]["Events"].values()
        assert event["Type"] == "ScheduleV2"
        assert event["Properties"]["ScheduleExpressionTimezone"] == {"Ref": "ScheduleTimezone"}
        assert json.loads(event["Properties"]["Input"]) == {
            "scheduled_time": "<aws.scheduler.scheduled-time>",
            "execution_id": "<aws.scheduler.execution-id>",
        }
    sample = json.loads((ROOT / "events" / "assess-tick.json").read_text(encoding="utf-8"))
    assert set(sample) == {"scheduled_time", "execution_id"}


def test_webhook_url_and_state_machine(template: dict[str, Any]) -> None:
    webhook = template["Resources"]["AlertWebhookFunction"]["Properties"]
    assert webhook["FunctionUrlConfig"] == {"AuthType": "NONE"}
    assert template["Outputs"]["AlertWebhookUrl"]["Value"] == {
        "Fn::GetAtt": ["AlertWebhookFunctionUrl", "FunctionUrl"]
    }
    machine = resources(template, "AWS::Serverless::StateMachine")["DrainStateMachine"]
    assert machine["Properties"]["DefinitionUri"] == "infra/statemachine/drain.asl.json"
    assert machine["Properties"]["DefinitionSubstitutions"] == {
        "DrainFunctionArn": {"Fn::GetAtt": ["DrainFunction", "Arn"]}
    }
    assert "${DrainFunctionArn}" in (ROOT / "infra/statemachine/drain.asl.json").read_text(encoding="utf-8")


def test_access_entries_groups(template: dict[str, Any]) -> None:
    entries = resources(template, "AWS::EKS::AccessEntry")
    groups = {
        e["Properties"]["PrincipalArn"]["Fn::GetAtt"][0]: e["Properties"]["KubernetesGroups"]
        for e in entries.values()
    }
    assert groups == {
        "AssessRole": ["rightsizer-read", "rightsizer-heal"],
        # the whole-cluster lists of a replacement's fresh plan only when replacement is enabled
        "DrainRole": {"Fn::If": ["ReplaceNodeGroups", ["rightsizer", "rightsizer-replace"], ["rightsizer"]]},
        "OffhoursRole": ["rightsizer-offhours"],
        # EnableSharding (issue 33): the shards read; the merge assesses, as the assess function does
        "ShardPrepareRole": ["rightsizer-read"],
        "ShardObserveRole": ["rightsizer-read"],
        "ShardMergeRole": ["rightsizer-read", "rightsizer-heal"],
    }
    assert all(
        e["Condition"] == ("ShardAccessEntries" if name.startswith("Shard") else "AccessEntries")
        for name, e in entries.items()
    )
    assert template["Parameters"]["CreateAccessEntries"]["AllowedValues"] == ["true", "false"]


def test_one_role_per_function(template: dict[str, Any]) -> None:
    functions = resources(template, "AWS::Serverless::Function")
    roles = [f["Properties"]["Role"]["Fn::GetAtt"][0] for f in functions.values()]
    # four functions, the fleet's three (EnableFleet) and the sharded assessment's four (EnableSharding)
    assert len(set(roles)) == len(roles) == 11
    assert set(roles) <= set(resources(template, "AWS::IAM::Role"))


def test_no_wildcard_resource_on_mutating_actions(template: dict[str, Any]) -> None:
    for owner, statement in all_statements(template):
        actions = as_list(statement["Action"])
        if any(a.startswith(MUTATING_PREFIXES) for a in actions):
            for resource in as_list(statement["Resource"]):
                assert resource != "*", (owner, statement["Sid"])


def test_mutating_aws_actions_need_the_opt_in_tag(template: dict[str, Any]) -> None:
    # Scale-in and sizing only in groups tagged rightsizer.io/enabled=true (and of this cluster): the
    # drain checks the same tags before it cordons (rightsizer.domain.model.opt_in_refusal).
    for owner, statement in all_statements(template):
        actions = as_list(statement["Action"])
        if any(a.startswith(("autoscaling:Terminate", "autoscaling:Update")) for a in actions):
            assert statement["Condition"]["StringEquals"] == {
                "aws:ResourceTag/rightsizer.io/enabled": "true",
                "aws:ResourceTag/eks:cluster-name": {"Ref": "ClusterName"},
            }, owner
        if any(a.startswith("eks:Update") for a in actions):
            assert statement["Condition"]["StringEquals"] == {"aws:ResourceTag/rightsizer.io/enabled": "true"}
        # Stop/start/modify only on instances opted in to a resize; modify of the instance type only.
        if any(a.startswith(("ec2:Stop", "ec2:Start", "ec2:Modify")) for a in actions):
            assert owner == "DrainRole", owner
            assert statement["Condition"]["StringEquals"] == {
                "ec2:ResourceTag/rightsizer.io/resize": "allowed"
            }
        if "ec2:ModifyInstanceAttribute" in actions:
            assert actions == ["ec2:ModifyInstanceAttribute"]
            assert statement["Condition"]["Null"] == {"ec2:Attribute/InstanceType": "false"}


def test_resize_grants_exist_only_with_enable_resize(template: dict[str, Any]) -> None:
    act = template["Resources"]["DrainRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    resize = [s for s in act if "Fn::If" in s and s["Fn::If"][0] == "Resize"]
    assert len(resize) == 3 and all(s["Fn::If"][2] == {"Ref": "AWS::NoValue"} for s in resize)
    assert template["Parameters"]["EnableResize"]["Default"] == "false"


def test_state_table_access_is_limited_to_item_families(template: dict[str, Any]) -> None:
    for owner, statement in all_statements(template):
        if statement["Sid"] == "LedgerIndexRead":  # the sparse index gsi1 holds ledger items only
            assert as_list(statement["Action"]) == ["dynamodb:Query"]
            assert statement["Resource"] == {"Fn::Sub": "${StateTable.Arn}/index/gsi1"}
        elif any(a.startswith("dynamodb:") for a in as_list(statement["Action"])):
            keys = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
            assert keys and "*" not in keys, owner


def test_webhook_has_reserved_concurrency(template: dict[str, Any]) -> None:
    webhook = template["Resources"]["AlertWebhookFunction"]["Properties"]
    assert webhook["ReservedConcurrentExecutions"] == {"Ref": "WebhookConcurrency"}
    assert 1 <= template["Parameters"]["WebhookConcurrency"]["Default"] <= 100


def test_who_may_start_drains(template: dict[str, Any]) -> None:
    # StartExecution lives in one managed policy; only the intake functions and off-hours attach it.
    starters = {
        name
        for name, role in resources(template, "AWS::IAM::Role").items()
        if {"Ref": "StartDrainPolicy"} in role["Properties"]["ManagedPolicyArns"]
    }
    # ... and the sharded assessment's merge (EnableSharding), which is the assessment
    assert starters == {"AssessRole", "AlertWebhookRole", "OffhoursRole", "ShardMergeRole"}
    webhook = template["Resources"]["AlertWebhookRole"]["Properties"]["ManagedPolicyArns"]
    assert {"Ref": "ObservePolicy"} not in webhook  # intake only: no cluster, no Prometheus


def test_vpc_is_optional(template: dict[str, Any]) -> None:
    for name in ("SubnetIds", "SecurityGroupIds"):
        assert template["Parameters"][name]["Default"] == ""
    functions = resources(template, "AWS::Serverless::Function")
    assert "VpcConfig" not in functions["AlertWebhookFunction"]["Properties"]
    for name in ("AssessFunction", "DrainFunction", "OffhoursFunction"):
        assert functions[name]["Properties"]["VpcConfig"]["Fn::If"][0] == "UseVpc"


def test_parameters_cover_the_deployment(template: dict[str, Any]) -> None:
    expected = {
        "ClusterName",
        "PrometheusUrl",
        "PrometheusAuth",
        "PrometheusSecretRef",
        "NodeLabel",
        "PolicyParameterName",
        "PolicyInline",
        "DryRun",
        "AssessScheduleExpression",
        "OffhoursScheduleExpression",
        "OffhoursConfig",
        "ScheduleTimezone",
        "CreateAccessEntries",
        "SubnetIds",
        "SecurityGroupIds",
    }
    assert expected <= set(template["Parameters"])
    assert template["Parameters"]["PrometheusAuth"]["AllowedValues"] == ["none", "bearer", "basic", "sigv4"]


def test_shipped_logs_insights_queries_name_only_fields_the_records_have(template: dict[str, Any]) -> None:
    import re

    from rightsizer.domain.decisions import DECISION_LOG_MESSAGE, DecisionRecord, Recommendation

    queries = resources(template, "AWS::Logs::QueryDefinition")
    decision_queries = {n: q for n, q in queries.items() if "decision." in q["Properties"]["QueryString"]}
    assert len(decision_queries) >= 3
    nested = {"recommendation": set(Recommendation.model_fields)}
    for name, query in decision_queries.items():
        text = query["Properties"]["QueryString"]
        assert f'message = "{DECISION_LOG_MESSAGE}"' in text, name
        assert query["Properties"]["LogGroupNames"] == [{"Ref": "AssessLogs"}], name
        for path in re.findall(r"decision\.([a-z_]+(?:\.[a-z_]+)?)", text):
            head, _, tail = path.partition(".")
            assert head in DecisionRecord.model_fields, (name, path)
            assert not tail or tail in nested[head], (name, path)


TAGGABLE_LIST_TAGS = (
    "AWS::DynamoDB::Table",
    "AWS::SecretsManager::Secret",
    "AWS::Logs::LogGroup",
    "AWS::SNS::Topic",
    "AWS::SQS::Queue",
)


def test_every_taggable_resource_carries_the_component_and_cluster_tags(template: dict[str, Any]) -> None:
    want = {"rightsizer.io/component": "gpu-rightsizer", "rightsizer.io/cluster": {"Ref": "ClusterName"}}
    assert template["Globals"]["Function"]["Tags"] == want  # every AWS::Serverless::Function
    for name, res in template["Resources"].items():
        if res["Type"] in TAGGABLE_LIST_TAGS:
            tags = {t["Key"]: t["Value"] for t in res["Properties"].get("Tags", [])}
            assert tags == want, name
        if res["Type"] == "AWS::Serverless::StateMachine":
            assert res["Properties"]["Tags"] == want, name


def test_scheduled_functions_send_failed_invocations_to_the_queue_with_permission(
    template: dict[str, Any],
) -> None:
    functions = resources(template, "AWS::Serverless::Function")
    for name in ("AssessFunction", "OffhoursFunction"):
        props = functions[name]["Properties"]
        assert "Tick" in props["Events"]  # invoked asynchronously by EventBridge Scheduler
        on_failure = props["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
        assert on_failure == {"Type": "SQS", "Destination": {"Fn::GetAtt": ["FailedInvocationsQueue", "Arn"]}}
        role = template["Resources"][props["Role"]["Fn::GetAtt"][0]]
        assert {"Ref": "FailedInvocationsPolicy"} in role["Properties"]["ManagedPolicyArns"], name
    (grant,) = statements(template["Resources"]["FailedInvocationsPolicy"]["Properties"]["PolicyDocument"])
    assert grant["Action"] == "sqs:SendMessage"
    assert grant["Resource"] == {"Fn::GetAtt": ["FailedInvocationsQueue", "Arn"]}


def test_alarm_email_is_optional_and_validated(template: dict[str, Any]) -> None:
    import re

    param = template["Parameters"]["AlarmEmail"]
    assert param["Default"] == ""
    pattern = re.compile(param["AllowedPattern"])
    assert pattern.fullmatch("") and pattern.fullmatch("oncall@example.com")
    assert not pattern.fullmatch("oncall") and not pattern.fullmatch("a b@example.com")
    subscription = template["Resources"]["AlarmEmailSubscription"]
    assert subscription["Condition"] == "AlarmMail"
    assert subscription["Properties"]["Protocol"] == "email"
    outputs = template["Outputs"]
    assert {"AlarmTopicArn", "FailedInvocationsQueueUrl", "ClusterName", "AssessFunctionName"} <= set(outputs)


def test_schedules_have_a_dead_letter_queue_that_is_alarmed(template: dict[str, Any]) -> None:
    functions = resources(template, "AWS::Serverless::Function")
    for name in ("AssessFunction", "OffhoursFunction"):
        (event,) = functions[name]["Properties"]["Events"].values()
        # SAM's ScheduleV2 gives the schedule's generated role sqs:SendMessage on this queue.
        assert event["Properties"]["DeadLetterConfig"] == {
            "Arn": {"Fn::GetAtt": ["ScheduleDeadLetterQueue", "Arn"]}
        }
    queue = template["Resources"]["ScheduleDeadLetterQueue"]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True and queue["MessageRetentionPeriod"] == 1209600
    alarm = template["Resources"]["ScheduleDeadLettersAlarm"]["Properties"]
    assert alarm["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["ScheduleDeadLetterQueue", "QueueName"]}}
    ]
    assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    assert "ScheduleDeadLetterQueueUrl" in template["Outputs"]


def _references(node: Any) -> set[str]:
    """Logical ids a template fragment depends on (Ref, GetAtt, ${X} and ${X.Attr} in Sub)."""
    import re

    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= _references(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                found.add(value)
            elif key == "Fn::GetAtt":
                found.add(value[0] if isinstance(value, list) else str(value).split(".")[0])
            elif key == "Fn::Sub":
                text = value if isinstance(value, str) else value[0]
                found |= {m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text)}
                if not isinstance(value, str):
                    found |= _references(value[1])
            else:
                found |= _references(value)
    return found


def test_resources_have_no_dependency_cycle(template: dict[str, Any]) -> None:
    # The drain function names the webhook's Function URL (approval links) and the webhook starts the
    # drain state machine, which invokes the drain function: only the state machine's fixed name keeps
    # this from being a cycle CloudFormation refuses.
    res = template["Resources"]
    graph = {name: _references(body) & set(res) for name, body in res.items()}
    for name, body in res.items():  # SAM's generated Function URL depends on its function
        if body["Type"] == "AWS::Serverless::Function" and "FunctionUrlConfig" in body["Properties"]:
            graph[f"{name}Url"] = {name}
    for name, body in res.items():  # references to generated resources count too
        graph[name] |= {r for r in _references(body) if r in graph}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, "dependency cycle: " + " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    drain_env = res["DrainFunction"]["Properties"]["Environment"]["Variables"]
    assert drain_env["RIGHTSIZER_APPROVAL_URL"] == {"Fn::GetAtt": ["AlertWebhookFunctionUrl", "FunctionUrl"]}
    assert res["DrainStateMachine"]["Properties"]["Name"] == {"Fn::Sub": "${AWS::StackName}-drain"}

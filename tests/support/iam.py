"""IAM as the code uses it: record every AWS call a flow makes, evaluate it against ``template.yaml``.

- :class:`AwsCallRecorder` wraps ``botocore.client.BaseClient._make_api_call`` (and the SigV4 signer of the
  Prometheus adapter) while a function's flow runs, and notes each call made below a Lambda handler
  (``functions/<name>/app.py``) with the product module that made it (the innermost ``rightsizer.*``
  frame). Calls of the test's own set-up (fixtures, the doubles) are not the function's: not recorded.
- :func:`requests_of` turns a recorded call into the IAM requests AWS authorises: the action, the
  resource ARN and the condition keys the template uses (resource tags read from moto,
  ``dynamodb:LeadingKeys`` from the item keys; ``TransactWriteItems`` is one request per item).
- :class:`RolePolicy` resolves a role of the template (its customer-managed and inline policies, with
  ``Fn::If``/``Fn::Sub``/``Ref`` evaluated for given parameter values) and answers which statements allow a
  request. StringEquals/StringLike/ForAllValues:StringLike and ``*``/``?`` wildcards: the subset of the
  IAM policy language the template uses; an operator it does not know fails loudly.

AWS-managed policies (``AWSLambdaBasicExecutionRole`` …) are Lambda's own (logs, X-Ray, ENIs), and so is
the on-failure destination of asynchronous invocations (:data:`PLATFORM_SIDS`): the code never calls those
actions, so they are outside the comparison.
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import botocore.client
import botocore.exceptions
import yaml

from tests.unit.test_template import CfnLoader

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
#: Statements the Lambda service itself uses on the function's behalf (never the code): outside the comparison.
PLATFORM_SIDS = frozenset({"OnFailureDestination"})  # asynchronous invocations' on-failure SQS destination
#: Actions AWS authorises for every principal (no IAM grant exists or is needed).
ALWAYS_ALLOWED = frozenset({"sts:GetCallerIdentity"})

#: EKS calls on one node group (its ARN and tags are read before the call: it may be deleted later).
_NODEGROUP_CALLS = frozenset({"DescribeNodegroup", "UpdateNodegroupConfig", "DeleteNodegroup"})

_TRANSACT = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


@dataclass(frozen=True)
class Call:
    """One SDK call: IAM-style ``service:Operation``, its parameters and the product module that made it."""

    action: str
    params: Mapping[str, Any]
    owner: str


@dataclass(frozen=True)
class Request:
    """One IAM authorisation request: action, resource ARN (``*`` when the action has none) and context."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)
    owner: str = ""


#: The Lambda handler modules (``functions/<name>/app.py``): a call is a function's when one is on the stack.
HANDLERS = frozenset({"assess.app", "drain.app", "offhours.app", "alert_webhook.app", "fleet.app"})


def _owner(frame: FrameType | None) -> str | None:
    """The innermost product module of a call made on a handler's code path (the handler's frame, or
    the root of a thread the product started), else None: the test's own set-up, the doubles, or a test
    calling product code directly."""
    owner = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module in HANDLERS:
            return owner
        if module.startswith(("rightsizer.testing", "tests.")):
            return None
        if owner is None and module.startswith("rightsizer."):
            owner = module
        frame = frame.f_back
    return owner


class AwsCallRecorder:
    """Records the product's AWS calls while active (use :func:`recording`)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def clear(self) -> None:
        """Forget what was recorded (a flow's set-up calls through product code)."""
        self.calls.clear()


@contextmanager
def recording(lookup: Lookup | None = None) -> Iterator[AwsCallRecorder]:
    """Patch botocore's single call path and the Prometheus SigV4 signer; restore both on exit.

    With ``lookup``, a scale-in call also notes the instance's group before it runs (afterwards the
    instance belongs to none)."""
    from rightsizer.adapters import prometheus

    recorder = AwsCallRecorder()
    original_call = botocore.client.BaseClient._make_api_call
    original_sign = prometheus.SigV4Auth.sign

    def make_api_call(client: Any, operation_name: str, api_params: Any) -> Any:
        owner = _owner(sys._getframe(1))
        if owner is not None:
            prefix = client.meta.service_model.signing_name
            params = dict(api_params)
            if operation_name == "TerminateInstanceInAutoScalingGroup" and lookup is not None:
                params["_group"] = lookup.group_of(str(api_params["InstanceId"]))
            if operation_name in _NODEGROUP_CALLS and lookup is not None:
                # read before the call: a node group deleted later has no tags to look up afterwards
                with contextlib.suppress(botocore.exceptions.ClientError):
                    params["_nodegroup"] = lookup.nodegroup(
                        str(api_params["clusterName"]), str(api_params["nodegroupName"])
                    )
            recorder.calls.append(Call(f"{prefix}:{operation_name}", params, owner))
        return original_call(client, operation_name, api_params)

    def sign(auth: Any, request: Any) -> None:
        owner = _owner(sys._getframe(1))
        if owner is None:
            return original_sign(auth, request)
        # /api/v1/query and /api/v1/query_range are aps:QueryMetrics (AMP's IAM reference).
        assert str(request.url.path).endswith(("/api/v1/query", "/api/v1/query_range")), request.url
        recorder.calls.append(Call("aps:QueryMetrics", {"url": str(request.url)}, owner))
        return original_sign(auth, request)

    botocore.client.BaseClient._make_api_call = make_api_call  # type: ignore[method-assign]
    prometheus.SigV4Auth.sign = sign  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        botocore.client.BaseClient._make_api_call = original_call  # type: ignore[method-assign]
        prometheus.SigV4Auth.sign = original_sign  # type: ignore[method-assign]


# --------------------------------------------------------------------------------------------------
# Calls → IAM requests
# --------------------------------------------------------------------------------------------------


def _arn(service: str, resource: str) -> str:
    return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{resource}"


def _leading_key(params: Mapping[str, Any]) -> str:
    if "Key" in params:
        return str(params["Key"]["pk"]["S"])
    if "Item" in params:
        return str(params["Item"]["pk"]["S"])
    values = params.get("ExpressionAttributeValues", {})
    return str(values[":pk"]["S"])  # every Query of the product names its partition ``:pk``


class Lookup:
    """Resource facts the policy conditions need, read from moto with clients outside the recorder."""

    def __init__(self, session: Any, endpoint_url: str) -> None:
        self._asg = session.client("autoscaling", endpoint_url=endpoint_url)
        self._eks = session.client("eks", endpoint_url=endpoint_url)
        self._secrets = session.client("secretsmanager", endpoint_url=endpoint_url)
        self._ec2 = session.client("ec2", endpoint_url=endpoint_url)

    def group_of(self, instance_id: str) -> str:
        found = self._asg.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        return str(found[0]["AutoScalingGroupName"])

    def asg_tags(self, name: str) -> dict[str, str]:
        groups = self._asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        return {t["Key"]: t["Value"] for t in groups[0].get("Tags", [])} if groups else {}

    def nodegroup(self, cluster: str, name: str) -> tuple[str, dict[str, str]]:
        ng = self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
        return str(ng["nodegroupArn"]), dict(ng.get("tags") or {})

    def instance_tags(self, instance_id: str) -> dict[str, str]:
        found = self._ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        return {t["Key"]: t["Value"] for t in found.get("Tags", [])}

    def launch_template_tags(self, template_id: str) -> dict[str, str]:
        found = self._ec2.describe_launch_templates(LaunchTemplateIds=[template_id])["LaunchTemplates"]
        return {t["Key"]: t["Value"] for t in found[0].get("Tags", [])}

    def secret_arn(self, name: str) -> str:
        return str(self._secrets.describe_secret(SecretId=name)["ARN"])


def _dynamodb(call: Call, lookup: Lookup, table: str) -> list[Request]:
    p = call.params
    if call.action == "dynamodb:TransactWriteItems":
        found: list[Request] = []
        for item in p["TransactItems"]:
            ((kind, body),) = item.items()
            found += _dynamodb(Call(f"dynamodb:{_TRANSACT[kind]}", body, call.owner), lookup, table)
        return found
    assert p["TableName"] == table, p
    resource = _arn("dynamodb", f"table/{table}")
    if p.get("IndexName"):
        resource += f"/index/{p['IndexName']}"
    return [Request(call.action, resource, {"dynamodb:LeadingKeys": [_leading_key(p)]}, call.owner)]


def _autoscaling(call: Call, lookup: Lookup, table: str) -> list[Request]:
    p = call.params
    if call.action == "autoscaling:UpdateAutoScalingGroup":
        name = p["AutoScalingGroupName"]
    elif call.action == "autoscaling:TerminateInstanceInAutoScalingGroup":
        name = p.get("_group") or lookup.group_of(p["InstanceId"])
    else:  # Describe*: no resource-level permissions
        return [Request(call.action, "*", {}, call.owner)]
    ctx = {f"aws:ResourceTag/{k}": v for k, v in lookup.asg_tags(name).items()}
    return [
        Request(
            call.action,
            _arn("autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{name}"),
            ctx,
            call.owner,
        )
    ]


def _eks(call: Call, lookup: Lookup, table: str) -> list[Request]:
    p = call.params
    if call.action in ("eks:DescribeCluster", "eks:ListNodegroups"):
        cluster = p.get("name") or p["clusterName"]
        return [Request(call.action, _arn("eks", f"cluster/{cluster}"), {}, call.owner)]
    if call.action == "eks:CreateNodegroup":
        # The cluster is the resource; the new group's tags are request tags; EKS checks iam:PassRole of
        # the node role for the caller (Service Authorization Reference, Amazon EKS).
        tags = {f"aws:RequestTag/{k}": v for k, v in (p.get("tags") or {}).items()}
        return [
            Request(call.action, _arn("eks", f"cluster/{p['clusterName']}"), tags, call.owner),
            Request(
                "iam:PassRole", str(p["nodeRole"]), {"iam:PassedToService": "eks.amazonaws.com"}, call.owner
            ),
        ]
    arn, tags = p.get("_nodegroup") or lookup.nodegroup(p["clusterName"], p["nodegroupName"])
    return [Request(call.action, arn, {f"aws:ResourceTag/{k}": v for k, v in tags.items()}, call.owner)]


def _ec2(call: Call, lookup: Lookup, table: str) -> list[Request]:
    p = call.params
    if call.action in ("ec2:CreateLaunchTemplateVersion", "ec2:DeleteLaunchTemplateVersions"):
        template = p["LaunchTemplateId"]
        ctx = {f"aws:ResourceTag/{k}": v for k, v in lookup.launch_template_tags(template).items()}
        return [Request(call.action, _arn("ec2", f"launch-template/{template}"), ctx, call.owner)]
    if call.action not in ("ec2:StopInstances", "ec2:StartInstances", "ec2:ModifyInstanceAttribute"):
        return [Request(call.action, "*", {}, call.owner)]  # Describe*: no resource-level permissions
    found = []
    for instance_id in p.get("InstanceIds") or [p["InstanceId"]]:
        ctx = {f"ec2:ResourceTag/{k}": v for k, v in lookup.instance_tags(instance_id).items()}
        if call.action == "ec2:ModifyInstanceAttribute":
            # The attribute changed is the condition key ec2:Attribute/<name> (InstanceType here).
            ctx.update({f"ec2:Attribute/{k}": v for k, v in p.items() if k not in ("InstanceId", "DryRun")})
        found.append(Request(call.action, _arn("ec2", f"instance/{instance_id}"), ctx, call.owner))
    return found


def _named(call: Call, lookup: Lookup, table: str) -> list[Request]:
    service = call.action.partition(":")[0]
    p = call.params
    if service == "states" and "taskToken" in p:
        resource = "*"  # SendTaskSuccess/Failure name no resource type: the token identifies the task
    elif service == "states":
        resource = str(p["stateMachineArn"])
    elif service == "sns":
        resource = str(p["TopicArn"])
    elif service == "secretsmanager":
        resource = lookup.secret_arn(p["SecretId"])
    elif service == "ssm":
        resource = _arn("ssm", "parameter/" + str(p["Name"]).lstrip("/"))
    else:  # aps
        workspace = str(p["url"]).partition("/workspaces/")[2].partition("/")[0] or "local"
        resource = _arn("aps", f"workspace/{workspace}")
    return [Request(call.action, resource, {}, call.owner)]


_BY_SERVICE = {
    "dynamodb": _dynamodb,
    "autoscaling": _autoscaling,
    "eks": _eks,
    "ec2": _ec2,
    "states": _named,
    "sns": _named,
    "secretsmanager": _named,
    "ssm": _named,
    "aps": _named,
}


def requests_of(call: Call, lookup: Lookup, *, table: str) -> list[Request]:
    """The IAM requests AWS evaluates for ``call`` (Service Authorization Reference resource types);
    sts and anything without resource-level permissions is ``*``."""
    build = _BY_SERVICE.get(call.action.partition(":")[0])
    return build(call, lookup, table) if build else [Request(call.action, "*", {}, call.owner)]


# --------------------------------------------------------------------------------------------------
# The template's roles, resolved
# --------------------------------------------------------------------------------------------------


def load_template() -> dict[str, Any]:
    """``template.yaml`` with short-form tags kept as ``{"Fn::X": …}``."""
    loaded: dict[str, Any] = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=CfnLoader)
    return loaded


NO_VALUE = object()
#: The stack name the tests deploy as: the drain state machine is ``<stack>-drain`` (test_handlers).
STACK_NAME = "rightsizer"


@dataclass
class Resolver:
    """Evaluates intrinsic functions for given parameter values and physical resource names."""

    template: dict[str, Any]
    parameters: Mapping[str, Any]
    refs: Mapping[str, str]  # logical id → Ref value
    attrs: Mapping[str, str]  # "Logical.Attr" → GetAtt value

    def value(self, name: str) -> Any:
        pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::StackName": STACK_NAME,
            "AWS::NoValue": NO_VALUE,
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in self.template["Parameters"]:
            default = self.template["Parameters"][name].get("Default")
            assert default is not None, f"parameter {name} needs a value"
            return default
        if "." in name:  # GetAtt of a resource the comparison does not need: a recognisable placeholder
            return self.attrs.get(name, f"arn:aws:unresolved:::{name}")
        if name not in self.refs and self.template["Resources"][name]["Type"] == "AWS::IAM::ManagedPolicy":
            return name  # the logical id: RolePolicy reads the policy document from the template
        return self.refs[name]

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template["Conditions"][name]))

    def sub(self, text: str, extra: Mapping[str, Any]) -> str:
        out, rest = "", text
        while "${" in rest:
            head, _, tail = rest.partition("${")
            key, _, rest = tail.partition("}")
            out += head + str(extra[key] if key in extra else self.value(key))
        return out + rest

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.resolve(i) for i in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, arg),) = node.items()
            function = self._FUNCTIONS.get(key)
            if function is not None:
                return function(self, arg)
        return {k: v for k, v in ((k, self.resolve(v)) for k, v in node.items()) if v is not NO_VALUE}

    def _sub_fn(self, arg: Any) -> Any:
        if isinstance(arg, str):
            return self.sub(arg, {})
        text, variables = arg
        return self.sub(text, {k: self.resolve(v) for k, v in variables.items()})

    def _if_fn(self, arg: Any) -> Any:
        name, yes, no = arg
        return self.resolve(yes if self.condition(name) else no)

    def _equals_fn(self, arg: Any) -> Any:
        left, right = (self.resolve(a) for a in arg)
        return left == right

    _FUNCTIONS: ClassVar[dict[str, Callable[[Resolver, Any], Any]]] = {
        "Ref": lambda self, arg: self.value(arg),
        "Fn::GetAtt": lambda self, arg: self.value(".".join(arg)),
        "Fn::Sub": _sub_fn,
        "Fn::If": _if_fn,
        "Fn::Equals": _equals_fn,
        "Fn::Not": lambda self, arg: not self.resolve(arg[0]),
        "Fn::And": lambda self, arg: all(self.resolve(a) for a in arg),
        "Fn::Or": lambda self, arg: any(self.resolve(a) for a in arg),
        "Fn::Join": lambda self, arg: arg[0].join(str(i) for i in self.resolve(arg[1])),
        "Fn::Split": lambda self, arg: str(self.resolve(arg[1])).split(arg[0]),
        "Fn::Select": lambda self, arg: self.resolve(arg[1])[int(arg[0])],
        "Condition": lambda self, arg: self.condition(arg),
    }


@dataclass(frozen=True)
class Statement:
    """One resolved Allow statement and where it lives (``<policy or role>/<Sid>``)."""

    where: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    condition: Mapping[str, Mapping[str, Any]]

    def leading_keys(self) -> list[str]:
        """The item-family patterns of the statement's ``dynamodb:LeadingKeys`` condition."""
        return [
            str(k) for keys in self.condition.values() for k in _as_list(keys.get("dynamodb:LeadingKeys", []))
        ]

    def matched_keys(self, request: Request) -> list[str]:
        """``LeadingKeys=<pattern>`` for each pattern that matches one of the request's leading keys."""
        values = [str(v) for v in _as_list(request.context.get("dynamodb:LeadingKeys", []))]
        return [f"LeadingKeys={k}" for k in self.leading_keys() if any(_like(k, v) for v in values)]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, Any]) -> bool:
    wanted = [str(e) for e in _as_list(expected)]
    if operator.startswith("ForAllValues:"):
        values = [str(v) for v in _as_list(context.get(key, []))]
        test = _like if operator.endswith("StringLike") else str.__eq__
        assert operator in ("ForAllValues:StringLike", "ForAllValues:StringEquals"), operator
        # No value at all would pass ForAllValues — a known IAM trap; the product always sends one.
        assert values, f"{key} missing from the request"
        return all(any(test(w, v) for w in wanted) for v in values)
    if operator == "Null":  # "false": the key must be present; "true": it must be absent
        return all((key not in context) == (w == "true") for w in wanted)
    assert operator in ("StringEquals", "StringLike"), f"operator {operator} not modelled"
    if key not in context:
        return False
    value = str(context[key])
    return any((_like(w, value) if operator == "StringLike" else w == value) for w in wanted)


class RolePolicy:
    """The customer-managed and inline policies of one role of the template, resolved."""

    def __init__(self, resolver: Resolver, role: str) -> None:
        template = resolver.template
        props = template["Resources"][role]["Properties"]
        documents: list[tuple[str, Any]] = []
        for arn in resolver.resolve(props.get("ManagedPolicyArns", [])):
            if isinstance(arn, str) and arn.startswith("arn:aws:iam::aws:policy/"):
                continue  # AWS-managed: Lambda's own logs/X-Ray/ENI permissions
            documents.append((arn, template["Resources"][arn]["Properties"]["PolicyDocument"]))
        for policy in props.get("Policies", []):
            documents.append((f"{role}/{policy['PolicyName']}", policy["PolicyDocument"]))
        self.statements: list[Statement] = []
        for where, document in documents:
            for raw in resolver.resolve(document["Statement"]):
                assert raw["Effect"] == "Allow", raw
                if raw.get("Sid") in PLATFORM_SIDS:
                    continue
                self.statements.append(
                    Statement(
                        f"{where}/{raw.get('Sid', '?')}",
                        tuple(_as_list(raw["Action"])),
                        tuple(_as_list(raw["Resource"])),
                        raw.get("Condition", {}),
                    )
                )

    def allowing(self, request: Request) -> list[tuple[Statement, str]]:
        """(statement, matching action pattern) pairs that allow ``request``; empty = denied."""
        found = []
        for statement in self.statements:
            action = next((a for a in statement.actions if _like(a.lower(), request.action.lower())), None)
            if action is None:
                continue
            if not any(_like(r, request.resource) for r in statement.resources):
                continue
            if all(
                _condition_holds(op, key, expected, request.context)
                for op, keys in statement.condition.items()
                for key, expected in keys.items()
            ):
                found.append((statement, action))
        return found

    def grants(self) -> set[tuple[str, str]]:
        """Every (statement, action) pair the role holds, and every (statement, item family) of its
        ``dynamodb:LeadingKeys`` conditions: each must allow some request."""
        found = {(s.where, a) for s in self.statements for a in s.actions}
        return found | {(s.where, f"LeadingKeys={k}") for s in self.statements for k in s.leading_keys()}


@dataclass(frozen=True)
class Judged:
    """What ``judge`` found: (module, action) pairs not in that module's ``IAM_ACTIONS``, the requests
    no statement allows, and the (statement, action or condition key) pairs some request used."""

    undeclared: set[tuple[str, str]]
    missing: list[Request]
    used: set[tuple[str, str]]


def judge(policy: RolePolicy, calls: Iterable[Call], lookup: Lookup, *, table: str) -> Judged:
    """Hold every request of ``calls`` against ``policy`` and the ``IAM_ACTIONS`` of its calling module
    (``ALWAYS_ALLOWED`` actions need no grant)."""
    undeclared: set[tuple[str, str]] = set()
    missing: list[Request] = []
    used: set[tuple[str, str]] = set()
    for call in calls:
        for request in requests_of(call, lookup, table=table):
            if request.action not in getattr(sys.modules[call.owner], "IAM_ACTIONS", ()):
                undeclared.add((call.owner, request.action))
            if request.action in ALWAYS_ALLOWED:
                continue
            allowing = policy.allowing(request)
            if not allowing:
                missing.append(request)
            used |= {(s.where, a) for s, a in allowing}
            used |= {(s.where, k) for s, _ in allowing for k in s.matched_keys(request)}
    return Judged(undeclared, missing, used)

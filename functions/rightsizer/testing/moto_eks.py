"""An EKS cluster with GPU managed node groups on a moto server, for tests and the demo (docs/architecture.md §7).

Never imported by product code. moto 5.2 models a managed node group and its Auto Scaling group as
two unrelated objects: ``CreateNodegroup`` reports ``resources.autoScalingGroups[0].name`` but creates
no such group, ``UpdateNodegroupConfig`` does not touch any ASG, and an ASG's DesiredCapacity never flows
back into ``scalingConfig``. :func:`build_cluster` creates the ASG under exactly the reported name and
:class:`NodeGroupReconciler` mirrors the sizes both ways, as EKS does.

Other moto gaps bridged here, so that the adapter's checks run against realistic answers:

- instances never report ``EnaSupport`` and always report ``RootDeviceType: ebs``;
  :func:`seed_instance` sets both on the in-process backend (real GPU AMIs have ENA enabled);
- a terminate with ``ShouldDecrementDesiredCapacity`` ignores ``MinSize`` and drops the instance from
  the group at once (no ``Terminating`` state); a second terminate of the same instance answers 500;
- faults such as ``InsufficientInstanceCapacity`` are injected with :func:`inject_error_once`, a
  botocore ``before-call`` hook: the client and the server stay real;
- ``DeleteLaunchTemplateVersions`` is not implemented (moto 5.2.5); :func:`start_moto_server` adds it with
  EC2's semantics (a deleted version is gone from describe; the default version is refused, an unknown one
  reported ``launchTemplateVersionDoesNotExist``; the other versions keep their numbers), see
  ``rightsizer.testing.moto_gaps``.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from rightsizer.adapters.aws import AwsClients
from rightsizer.domain.model import TAG_ENABLED
from rightsizer.testing.periodic import Periodic

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import TagSpecificationTypeDef

__all__ = [
    "BuiltCluster",
    "BuiltNodeGroup",
    "CallLog",
    "MotoServer",
    "NodeGroupReconciler",
    "NodeGroupSpec",
    "add_nodegroup",
    "build_cluster",
    "inject_error_once",
    "launch_standalone",
    "record_calls",
    "reset_moto",
    "seed_instance",
    "start_moto_server",
]

ACCOUNT_ID = "123456789012"
_NODE_ROLE = f"arn:aws:iam::{ACCOUNT_ID}:role/eks-node"
_CLUSTER_ROLE = f"arn:aws:iam::{ACCOUNT_ID}:role/eks-cluster"


# --------------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------------


@dataclass
class MotoServer:
    """A running moto server on 127.0.0.1; ``endpoint_url`` is ``http://127.0.0.1:<port>``."""

    server: ThreadedMotoServer
    endpoint_url: str

    def stop(self) -> None:
        """Shut the server down and join its thread."""
        self.server.stop()


def start_moto_server() -> MotoServer:
    """Start ``ThreadedMotoServer`` on 127.0.0.1 with an OS-chosen port and return its endpoint URL."""
    from moto.server import ThreadedMotoServer

    from rightsizer.testing.moto_gaps import install

    install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    # The constructor's port 0 is only a request; the bound port is on the werkzeug server.
    host, port = server.get_host_and_port()
    return MotoServer(server=server, endpoint_url=f"http://{host}:{port}")


def reset_moto(endpoint_url: str) -> None:
    """Forget every resource in every backend (``POST /moto-api/reset``)."""
    request = urllib.request.Request(f"{endpoint_url}/moto-api/reset", method="POST")  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        response.read()


def seed_instance(
    instance_id: str,
    *,
    region: str = "us-east-1",
    ena_support: bool | None = None,
    root_device_type: str | None = None,
    lifecycle: str | None = None,
) -> None:
    """Set attributes moto cannot be told through the API, on the in-process moto backend.

    Works only with a moto server running in this process (``ThreadedMotoServer``).

    Args:
        instance_id: an instance of the moto server.
        ena_support: the ``EnaSupport`` DescribeInstances reports (moto omits it otherwise).
        root_device_type: ``ebs`` or ``instance-store`` (moto always reports ``ebs``).
        lifecycle: ``spot`` makes DescribeInstances report ``InstanceLifecycle: spot``.
    """
    from moto.ec2.exceptions import InvalidInstanceIdError
    from moto.ec2.models import ec2_backends

    # The default account first; an instance of another account (an assumed role's) is found there.
    for account in (ACCOUNT_ID, *(a for a in list(ec2_backends) if a != ACCOUNT_ID)):
        try:
            instance = ec2_backends[account][region].get_instance(instance_id)
            break
        except InvalidInstanceIdError:
            continue
    else:
        raise InvalidInstanceIdError(instance_id)
    if ena_support is not None:
        # moto's Instance has no such field; its serializer reads it by name when present.
        setattr(instance, "ena_support", ena_support)  # noqa: B010
    if root_device_type is not None:
        instance.root_device_type = root_device_type
    if lifecycle is not None:
        instance.lifecycle = lifecycle


# --------------------------------------------------------------------------------------------------
# Fault injection and call recording (botocore event hooks on a real client)
# --------------------------------------------------------------------------------------------------


def inject_error_once(
    client: Any, operation: str, code: str, *, status: int = 500, message: str = "injected by test"
) -> list[int]:
    """Make the next call of ``operation`` on ``client`` fail with AWS error ``code``, once.

    The hook answers before the request is sent (botocore ``before-call``), so the server never sees
    that call and standard retries do not replay it. Later calls go to the server unchanged.

    Args:
        client: an AWS SDK (boto3) service client.
        operation: API name, e.g. ``StartInstances``.
        code: AWS error code, e.g. ``InsufficientInstanceCapacity``.
        status: HTTP status of the fake answer.

    Returns:
        A list that grows by one element each time the fault fires (for assertions).
    """
    fired: list[int] = []
    service = client.meta.service_model.service_id.hyphenize()

    def handler(**_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if fired:
            return None
        fired.append(1)
        body = {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }
        return AWSResponse(f"https://{service}.invalid/", status, HTTPHeaders(), None), body

    client.meta.events.register(f"before-call.{service}.{operation}", handler)
    return fired


@dataclass
class CallLog:
    """Operation names a client has called, in order (filled by :func:`record_calls`)."""

    operations: list[str] = field(default_factory=list)

    def count(self, operation: str) -> int:
        """How many times ``operation`` was called."""
        return self.operations.count(operation)


def record_calls(client: Any) -> CallLog:
    """Record every API call ``client`` makes from now on (botocore ``before-call`` hook)."""
    log = CallLog()
    service = client.meta.service_model.service_id.hyphenize()

    def handler(model: Any, **_: Any) -> None:
        log.operations.append(str(model.name))

    # botocore runs handlers of the most specific event name first; registering per operation, first in
    # line, makes sure calls answered by an injected fault (same specificity) are recorded as well.
    for operation in client.meta.service_model.operation_names:
        client.meta.events.register_first(f"before-call.{service}.{operation}", handler)
    return log


# --------------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeGroupSpec:
    """A managed node group to create: sizes in instances, one instance type."""

    name: str
    instance_type: str = "g5.2xlarge"
    min_size: int = 1
    desired: int = 2
    max_size: int = 4
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Tag the node group and its ASG ``rightsizer.io/enabled=true`` (False: a system group nobody opted in).
    opted_in: bool = True
    #: Create the node group from a launch template that pins the instance type (no ``instanceTypes``).
    pinned_template: bool = False
    taints: tuple[Mapping[str, str], ...] = ()


@dataclass(frozen=True)
class BuiltNodeGroup:
    """What :func:`build_cluster` created for one node group."""

    name: str
    asg_name: str
    launch_template_id: str
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class BuiltCluster:
    """What :func:`build_cluster` created."""

    cluster: str
    region: str
    vpc_id: str
    subnet_ids: tuple[str, ...]
    nodegroups: Mapping[str, BuiltNodeGroup]


# moto's AMI catalogue survives /moto-api/reset and filtering it takes about a second per call.
_IMAGE_CACHE: dict[tuple[str, str], str] = {}


def _image_for(clients: AwsClients, instance_type: str) -> str:
    answer = clients.ec2.describe_instance_types(InstanceTypes=[cast("InstanceTypeType", instance_type)])
    arch = answer["InstanceTypes"][0].get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])[0]
    key = (str(clients.ec2.meta.endpoint_url), str(arch))
    if key in _IMAGE_CACHE:
        return _IMAGE_CACHE[key]
    images = clients.ec2.describe_images(
        Owners=["amazon"],
        Filters=[
            {"Name": "architecture", "Values": [arch]},
            {"Name": "root-device-type", "Values": ["ebs"]},
        ],
    )["Images"]
    _IMAGE_CACHE[key] = sorted(str(image["ImageId"]) for image in images)[0]
    return _IMAGE_CACHE[key]


def build_cluster(
    clients: AwsClients,
    cluster: str = "demo",
    region: str = "us-east-1",
    nodegroups: Sequence[NodeGroupSpec] = (),
) -> BuiltCluster:
    """Create a VPC with two subnets, an EKS cluster and its managed node groups with their ASGs.

    Each node group's ASG is created under exactly the name moto reports in
    ``resources.autoScalingGroups[0].name``, tagged ``eks:nodegroup-name`` / ``eks:cluster-name`` (and, with
    ``opted_in``, the node group and the ASG ``rightsizer.io/enabled=true``), from a
    launch template of the spec's instance type, with ``desired`` InService instances (ENA seeded).
    Calls EC2 CreateVpc/CreateSubnet/CreateLaunchTemplate, EKS CreateCluster/CreateNodegroup and Auto
    Scaling CreateAutoScalingGroup.
    """
    ec2, eks = clients.ec2, clients.eks
    vpc_id = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet_ids = tuple(
        ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{region}{zone}")[
            "Subnet"
        ]["SubnetId"]
        for i, zone in enumerate("ab", start=1)
    )
    eks.create_cluster(
        name=cluster, roleArn=_CLUSTER_ROLE, resourcesVpcConfig={"subnetIds": list(subnet_ids)}
    )
    built = {
        spec.name: add_nodegroup(clients, cluster, subnet_ids, spec, region=region) for spec in nodegroups
    }
    return BuiltCluster(cluster, region, vpc_id, subnet_ids, built)


def add_nodegroup(
    clients: AwsClients,
    cluster: str,
    subnet_ids: Sequence[str],
    spec: NodeGroupSpec,
    *,
    region: str = "us-east-1",
) -> BuiltNodeGroup:
    """Create one managed node group of ``spec`` in ``cluster`` with its ASG (see :func:`build_cluster`)."""
    ec2, eks, asg = clients.ec2, clients.eks, clients.autoscaling
    # An opted-in group's launch template is opted in too (the drain role writes versions of those only).
    tagged: list[TagSpecificationTypeDef] = (
        [{"ResourceType": "launch-template", "Tags": [{"Key": TAG_ENABLED, "Value": "true"}]}]
        if spec.opted_in
        else []
    )
    template = ec2.create_launch_template(
        LaunchTemplateName=f"eks-{cluster}-{spec.name}",
        LaunchTemplateData={
            "ImageId": _image_for(clients, spec.instance_type),
            "InstanceType": cast("InstanceTypeType", spec.instance_type),
        },
        TagSpecifications=tagged,
    )["LaunchTemplate"]
    shape: dict[str, Any] = (
        {"launchTemplate": {"id": template["LaunchTemplateId"], "version": "1"}}
        if spec.pinned_template
        else {"instanceTypes": [spec.instance_type]}
    )
    ng = eks.create_nodegroup(
        clusterName=cluster,
        nodegroupName=spec.name,
        nodeRole=_NODE_ROLE,
        subnets=list(subnet_ids),
        scalingConfig={"minSize": spec.min_size, "desiredSize": spec.desired, "maxSize": spec.max_size},
        labels=dict(spec.labels),
        taints=[dict(t) for t in spec.taints],  # type: ignore[misc]
        tags={TAG_ENABLED: "true"} if spec.opted_in else {},
        **shape,
    )["nodegroup"]
    asg_name = ng["resources"]["autoScalingGroups"][0]["name"]
    tags = {
        "eks:nodegroup-name": spec.name,
        "eks:cluster-name": cluster,
        f"kubernetes.io/cluster/{cluster}": "owned",
    }
    if spec.opted_in:
        tags[TAG_ENABLED] = "true"
    asg.create_auto_scaling_group(
        AutoScalingGroupName=asg_name,
        LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
        MinSize=spec.min_size,
        MaxSize=spec.max_size,
        DesiredCapacity=spec.desired,
        VPCZoneIdentifier=",".join(subnet_ids),
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in tags.items()],
    )
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"][0]
    instance_ids = tuple(i["InstanceId"] for i in group.get("Instances", []))
    for instance_id in instance_ids:
        seed_instance(instance_id, region=region, ena_support=True)
    return BuiltNodeGroup(
        name=spec.name,
        asg_name=asg_name,
        launch_template_id=template["LaunchTemplateId"],
        instance_ids=instance_ids,
    )


def launch_standalone(
    clients: AwsClients,
    instance_type: str,
    subnet_id: str,
    *,
    region: str = "us-east-1",
    tags: Mapping[str, str] | None = None,
) -> str:
    """Run one standalone (non-ASG) instance, ENA enabled, tagged ``rightsizer.io/resize=allowed``."""
    all_tags = {"rightsizer.io/resize": "allowed", **(tags or {})}
    instance = clients.ec2.run_instances(
        ImageId=_image_for(clients, instance_type),
        InstanceType=cast("InstanceTypeType", instance_type),
        MinCount=1,
        MaxCount=1,
        SubnetId=subnet_id,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items()]}
        ],
    )["Instances"][0]
    instance_id = str(instance["InstanceId"])
    seed_instance(instance_id, region=region, ena_support=True)
    return instance_id


def _set_nodegroup_status(
    cluster: str, nodegroup: str, status: str, code: str, message: str, *, region: str = "us-east-1"
) -> None:
    """Set a node group's status and one health issue on the in-process moto backend (no API sets them)."""
    from moto.eks.models import eks_backends

    group = eks_backends[ACCOUNT_ID][region].clusters[cluster].nodegroups[nodegroup]
    group.status = status
    group.health = {"issues": [{"code": code, "message": message, "resourceIds": []}]}


# --------------------------------------------------------------------------------------------------
# Reconciler
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sizes:
    """Sizes as moto holds them: unlike ``domain.model.GroupSizes`` possibly inconsistent (moto accepts
    desired > max), and the reconciler must mirror whatever it finds."""

    min_size: int
    desired: int
    max_size: int


class NodeGroupReconciler:
    """Mirrors sizes between managed node groups and their ASGs, as EKS does and moto does not.

    A change of ``scalingConfig`` since the last pass is applied to the ASG (UpdateAutoScalingGroup,
    which lets moto launch or terminate instances); otherwise a change of the ASG's sizes (a targeted
    terminate, a scaling activity) is written back to ``scalingConfig`` (UpdateNodegroupConfig, which
    is how moto stores it; EKS itself never needs that call). When both changed, the node group wins,
    as an UpdateNodegroupConfig does on EKS.
    """

    def __init__(
        self,
        clients: AwsClients,
        cluster: str,
        *,
        region: str = "us-east-1",
        no_capacity: frozenset[str] = frozenset(),
    ) -> None:
        """Args: clients on the moto server; cluster name; region (for seeding new instances);
        ``no_capacity``: instance types a new node group cannot launch (it ends ``CREATE_FAILED``)."""
        self._clients = clients
        self._cluster = cluster
        self._region = region
        self.no_capacity = no_capacity
        self._seen: dict[str, tuple[_Sizes, _Sizes]] = {}
        self._asg_of: dict[str, str] = {}
        self._lock = threading.Lock()
        self._worker = Periodic(self.reconcile, "moto-nodegroup-reconciler")
        #: Exceptions raised by background passes; kept so a test can assert none happened.
        self.errors = self._worker.errors

    def reconcile(self) -> None:
        """Run one pass over every node group of the cluster (idempotent)."""
        with self._lock:
            eks, asg = self._clients.eks, self._clients.autoscaling
            names = eks.list_nodegroups(clusterName=self._cluster)["nodegroups"]
            for gone in sorted(set(self._asg_of) - set(names)):
                # DeleteNodegroup: EKS deletes the group's ASG with its instances.
                asg.delete_auto_scaling_group(AutoScalingGroupName=self._asg_of.pop(gone), ForceDelete=True)
                self._seen.pop(gone, None)
            for name in names:
                try:
                    ng = eks.describe_nodegroup(clusterName=self._cluster, nodegroupName=name)["nodegroup"]
                except eks.exceptions.ResourceNotFoundException:
                    continue  # deleted between the list and the describe
                groups = ng.get("resources", {}).get("autoScalingGroups", [])
                answer = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[g["name"] for g in groups])
                if not answer["AutoScalingGroups"] and groups and ng.get("status") == "ACTIVE":
                    self._create_asg(ng, str(groups[0]["name"]))
                    answer = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[str(groups[0]["name"])])
                if not answer["AutoScalingGroups"]:
                    continue
                self._asg_of[name] = str(answer["AutoScalingGroups"][0]["AutoScalingGroupName"])
                group = answer["AutoScalingGroups"][0]
                config = ng.get("scalingConfig", {})
                ng_sizes = _Sizes(config["minSize"], config["desiredSize"], config["maxSize"])
                asg_sizes = _Sizes(group["MinSize"], group["DesiredCapacity"], group["MaxSize"])
                last_ng, last_asg = self._seen.get(name, (ng_sizes, asg_sizes))
                if ng_sizes != asg_sizes:
                    if ng_sizes != last_ng or asg_sizes == last_asg:
                        self._to_asg(group["AutoScalingGroupName"], ng_sizes)
                        asg_sizes = ng_sizes
                    else:
                        eks.update_nodegroup_config(
                            clusterName=self._cluster,
                            nodegroupName=name,
                            scalingConfig={
                                "minSize": asg_sizes.min_size,
                                "desiredSize": asg_sizes.desired,
                                "maxSize": asg_sizes.max_size,
                            },
                        )
                        ng_sizes = asg_sizes
                self._seen[name] = (ng_sizes, asg_sizes)

    def _create_asg(self, ng: Mapping[str, Any], asg_name: str) -> None:
        """What EKS does for a new node group: an ASG under the reported name from a copy of the group's
        launch template with its instance type, tagged like the groups :func:`build_cluster` makes. A type
        in ``no_capacity`` launches nothing: the node group goes ``CREATE_FAILED`` with
        ``AsgInstanceLaunchFailures``, as EKS reports an InsufficientInstanceCapacity launch."""
        ec2 = self._clients.ec2
        instance_type = next(iter(ng.get("instanceTypes") or []), None)
        template = ng.get("launchTemplate")
        if template:
            # The template's type wins (moto reports a default instanceTypes even beside a template).
            data = ec2.describe_launch_template_versions(
                LaunchTemplateId=str(template["id"]), Versions=[str(template["version"])]
            )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
            instance_type = data.get("InstanceType") or instance_type
        assert instance_type, f"node group {ng['nodegroupName']} names no instance type"
        if instance_type in self.no_capacity:
            _set_nodegroup_status(
                self._cluster, str(ng["nodegroupName"]), "CREATE_FAILED", "AsgInstanceLaunchFailures",
                f"Could not launch On-Demand Instances. InsufficientInstanceCapacity - {instance_type}",
                region=self._region,
            )  # fmt: skip
            return
        copy = ec2.create_launch_template(
            LaunchTemplateName=f"eks-{self._cluster}-{ng['nodegroupName']}-copy",
            LaunchTemplateData={
                "ImageId": _image_for(self._clients, str(instance_type)),
                "InstanceType": cast("InstanceTypeType", instance_type),
            },
        )["LaunchTemplate"]
        config = ng["scalingConfig"]
        tags = {
            "eks:nodegroup-name": str(ng["nodegroupName"]),
            "eks:cluster-name": self._cluster,
            f"kubernetes.io/cluster/{self._cluster}": "owned",
        }
        if (ng.get("tags") or {}).get(TAG_ENABLED) == "true":
            tags[TAG_ENABLED] = "true"
        self._clients.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=asg_name,
            LaunchTemplate={"LaunchTemplateId": copy["LaunchTemplateId"], "Version": "$Latest"},
            MinSize=config["minSize"],
            MaxSize=config["maxSize"],
            DesiredCapacity=config["desiredSize"],
            VPCZoneIdentifier=",".join(ng["subnets"]),
            Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in tags.items()],
        )
        group = self._clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])
        for instance in group["AutoScalingGroups"][0].get("Instances", []):
            seed_instance(instance["InstanceId"], region=self._region, ena_support=True)

    def _to_asg(self, asg_name: str, sizes: _Sizes) -> None:
        asg = self._clients.autoscaling
        asg.update_auto_scaling_group(
            AutoScalingGroupName=asg_name,
            MinSize=sizes.min_size,
            DesiredCapacity=sizes.desired,
            MaxSize=sizes.max_size,
        )
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"][0]
        for instance in group.get("Instances", []):
            seed_instance(instance["InstanceId"], region=self._region, ena_support=True)

    def start(self, interval_s: float = 0.2) -> None:
        """Reconcile every ``interval_s`` seconds on a daemon thread until :meth:`stop`."""
        self._worker.start(interval_s)

    def stop(self) -> None:
        """Stop the background thread (if any) and wait for it."""
        self._worker.stop()

    def __enter__(self) -> NodeGroupReconciler:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

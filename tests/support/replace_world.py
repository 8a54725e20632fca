"""A managed node group replacement's world for tests: EKS/Auto Scaling/EC2 on a moto server, the Kubernetes
double over HTTP, and a kubelet that registers a Node for every running instance of the cluster's node groups.

``GroupKubelet.sync`` plays the kubelets and the cloud node lifecycle controller: an instance of a node group's
Auto Scaling group that runs and has no Node gets one — Ready, labelled with the node group, its labels and
the instance's type, tainted with the group's taints, that type's GPUs (catalog ``gpu_count``) allocatable —
unless its type is in ``never_ready`` (an AMI without the driver, say): then the Node stays NotReady with no
GPU allocatable. A Node whose instance terminated or left every group is deleted with its pods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rightsizer.adapters.aws import AwsClients
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.model import AsgInfo, ClusterSnapshot
from rightsizer.domain.plan import NodeReport, Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.services.replace import known_replacements
from rightsizer.state import LeaseStore
from rightsizer.testing.k8s.double import KubernetesDouble
from rightsizer.testing.periodic import Periodic
from tests.builders import AT, const, gpu_node, merge_metrics, node_devices, snapshot

_TAINT_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}


def _instance_of(node: dict[str, Any]) -> str:
    return str(node["spec"].get("providerID", "")).rpartition("/")[2]


class GroupKubelet:
    """Keeps the double's Nodes in line with the node groups' instances (see the module docstring)."""

    def __init__(
        self,
        clients: AwsClients,
        double: KubernetesDouble,
        cluster: str,
        *,
        never_ready: frozenset[str] = frozenset(),
        created: datetime | None = None,
    ) -> None:
        """``created``: the new Nodes' creationTimestamp (default: the real now; the plans of these worlds
        are made at the series' instant ``AT``, so a test that judges new Nodes registers them before it)."""
        self.created = created
        self.clients = clients
        self.double = double
        self.cluster = cluster
        self.never_ready = never_ready
        self.registered: list[tuple[str, str]] = []  # (node group, instance type) per new Node
        self._worker = Periodic(self.sync, "test-group-kubelet")
        self.errors = self._worker.errors

    def sync(self) -> None:
        eks, asg = self.clients.eks, self.clients.autoscaling
        members: dict[str, dict[str, Any]] = {}
        for name in eks.list_nodegroups(clusterName=self.cluster)["nodegroups"]:
            try:
                ng = eks.describe_nodegroup(clusterName=self.cluster, nodegroupName=name)["nodegroup"]
            except eks.exceptions.ResourceNotFoundException:
                continue  # deleted between the list and the describe
            names = [g["name"] for g in ng.get("resources", {}).get("autoScalingGroups", [])]
            for group in asg.describe_auto_scaling_groups(AutoScalingGroupNames=names)["AutoScalingGroups"]:
                for instance in group.get("Instances", []):
                    members[str(instance["InstanceId"])] = ng
        nodes = {_instance_of(n): n for n in self.double.list_nodes()}
        ids = sorted(set(members) | set(nodes))
        answer = (
            self.clients.ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])
            if ids
            else {}
        )
        described = {str(i["InstanceId"]): i for r in answer.get("Reservations", []) for i in r["Instances"]}
        for instance_id, node in nodes.items():
            state = str(described.get(instance_id, {}).get("State", {}).get("Name", "terminated"))
            if instance_id not in members or state in ("shutting-down", "terminated"):
                self.double.delete_node(str(node["metadata"]["name"]))
        for instance_id, ng in sorted(members.items()):
            detail = described.get(instance_id)
            if instance_id in nodes or detail is None or detail["State"]["Name"] != "running":
                continue
            self._register(instance_id, str(detail["InstanceType"]), ng)

    def _register(self, instance_id: str, instance_type: str, ng: dict[str, Any]) -> None:
        row = load_catalog().get(instance_type)
        gpus = row.gpu_count if row else 1
        broken = instance_type in self.never_ready
        node = gpu_node(
            f"ip-{instance_id[2:]}.ec2.internal",
            instance_type=instance_type,
            gpus=gpus,
            instance_id=instance_id,
            nodegroup=str(ng["nodegroupName"]),
            created=self.created or datetime.now().astimezone(),
            labels=dict(ng.get("labels") or {}),
            allocatable={"nvidia.com/gpu": "0"} if broken else None,
            taints=[
                {"key": t["key"], "value": t.get("value", ""), "effect": _TAINT_EFFECTS[t["effect"]]}
                for t in ng.get("taints") or []
            ],
        )
        if broken:
            node["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
        self.double.add_node(node)
        self.registered.append((str(ng["nodegroupName"]), instance_type))

    def start(self, interval_s: float = 0.05) -> None:
        self._worker.start(interval_s)

    def stop(self) -> None:
        self._worker.stop()


def busy_devices(node: str, gpus: int = 4) -> dict[str, list[Any]]:
    """DCGM series of a node whose first GPU is busy (40 %, 6000 MiB, 150 W) and whose others idle."""
    return node_devices(
        node, gpus, per_gpu={0: {"util": const(40), "fb_used": const(6000), "power": const(150)}}
    )


@dataclass
class Observed:
    """What the planner sees: the double's Nodes and pods, the Auto Scaling groups on moto and DCGM series
    at ``AT`` (``busy`` nodes as :func:`busy_devices`, others idle). Planning is tested elsewhere; here it
    decides which workflow may run."""

    clients: AwsClients
    double: KubernetesDouble
    asg_names: dict[str, str]  # Auto Scaling group name -> node group
    policy: Policy
    busy: set[str] = field(default_factory=set)
    idle: set[str] = field(default_factory=set)
    #: When set, plans know the node group replacements its leases hold (running or settling).
    leases: LeaseStore | None = None

    def groups(self) -> list[AsgInfo]:
        answer = self.clients.autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=sorted(self.asg_names)
        )
        return [
            AsgInfo(
                name=str(g["AutoScalingGroupName"]),
                min_size=int(g["MinSize"]),
                max_size=int(g["MaxSize"]),
                desired=int(g["DesiredCapacity"]),
                instances={str(i["InstanceId"]): str(i["LifecycleState"]) for i in g.get("Instances", [])},
                nodegroup=self.asg_names[str(g["AutoScalingGroupName"])],
                tags={str(t["Key"]): str(t.get("Value", "")) for t in g.get("Tags", [])},
            )
            for g in answer["AutoScalingGroups"]
        ]

    def snapshot(self) -> ClusterSnapshot:
        nodes = [n for n in self.double.list_nodes() if n["metadata"]["name"] in self.busy | self.idle]
        catalog = load_catalog()
        gpus = {
            n["metadata"]["name"]: getattr(
                catalog.get(n["metadata"]["labels"].get("node.kubernetes.io/instance-type", "")),
                "gpu_count",
                4,
            )
            for n in nodes
        }
        metrics = merge_metrics(
            *(busy_devices(n, gpus.get(n, 4)) for n in sorted(self.busy)),
            *(node_devices(n, gpus.get(n, 4)) for n in sorted(self.idle)),
        )
        return snapshot(nodes, self.double.list_pods(), metrics, groups=self.groups(), at=AT)

    def plan(self, now: datetime | None = None, *, ignore: str | None = None) -> Plan:
        """The plan at ``AT`` (the series' instant); replacements as the leases hold them at ``now``."""
        known = known_replacements(self.leases, now or AT, ignore=ignore) if self.leases is not None else []
        return plan(self.snapshot(), self.policy, AT, replacements=known)

    def assess_node(self, node: str, now: datetime) -> NodeReport | None:
        try:
            return self.plan(now).node(node)
        except KeyError:
            return None


def drive(step: Callable[[], Any], advance: Callable[[float], None], *, limit: int = 400) -> Iterator[Any]:
    """Call ``step`` until its result is finished, advancing the fake clock by each wait; yields results."""
    for _ in range(limit):
        result = step()
        yield result
        if result.finished:
            return
        advance(result.wait_seconds)
    raise AssertionError("the workflow did not end")

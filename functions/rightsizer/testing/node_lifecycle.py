"""Node lifecycle for the demo: the Kubernetes double follows moto's EC2 and Auto Scaling state.

Test and demo support only (docs/architecture.md §7): :class:`NodeLifecycleSyncer` removes the Node of an
instance that left and joins a Node for every new InService instance of a node group, cloned from the
group's :class:`GroupTemplate`, as the kubelet and the node lifecycle controller make a real cluster follow
EC2. Split out of :mod:`rightsizer.testing.demo_env` unchanged.
"""

from __future__ import annotations

import copy
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from rightsizer.adapters.aws import AwsClients
from rightsizer.domain.catalog import load_catalog
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.periodic import Periodic
from rightsizer.testing.snapshot_metrics import SnapshotMetrics, seeded_uuid4

__all__ = ["GroupTemplate", "NodeLifecycleSyncer", "SyncChanges", "is_daemon_pod", "is_exporter"]

JSON = dict[str, Any]

_GONE_STATES: Final = frozenset({"shutting-down", "terminated"})
# Kubernetes' random-suffix alphabet (k8s.io/apimachinery/pkg/util/rand): no vowels, no 0/1/3.
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class GroupTemplate:
    """What a new node of a node group is cloned from: a Node, its DaemonSet pods and its series."""

    nodegroup: str
    asg_name: str
    node: JSON
    daemon_pods: tuple[JSON, ...]
    metrics_node: str | None
    exporter_pod: str | None


@dataclass(frozen=True)
class SyncChanges:
    """What one :meth:`NodeLifecycleSyncer.sync` pass changed in the double (node names)."""

    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()


def _instance_id(node: JSON) -> str:
    return str((node.get("spec") or {}).get("providerID") or "").rpartition("/")[2]


def is_daemon_pod(pod: JSON) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" for o in owners)


def is_exporter(pod: JSON) -> bool:
    return "dcgm-exporter" in str((pod.get("metadata") or {}).get("name", ""))


class NodeLifecycleSyncer:
    """Makes the Kubernetes double follow moto's EC2 and Auto Scaling state (docs/architecture.md §7).

    Each pass: a Node whose instance is shutting down, terminated, unknown to EC2, or no longer a member
    of the Auto Scaling group it was in disappears with its pods (pod garbage collection; their
    controllers recreate them elsewhere) and its series stop. An InService instance of a node group that
    no Node stands for becomes a new Ready Node, cloned from the group's template: named after the
    instance's private IP (``ip-10-0-1-7.ec2.internal``), ``providerID`` and zone from EC2, allocatable
    GPUs equal to capacity, DaemonSet pods of the template (a new dcgm-exporter pod with its own IP), and
    the template's series relabelled (:meth:`SnapshotMetrics.clone_node`). Removed instances never come
    back. Run :meth:`sync` directly for a deterministic step, or :meth:`start` for a background thread.
    """

    def __init__(
        self,
        clients: AwsClients,
        double: KubernetesDouble,
        metrics: SnapshotMetrics,
        templates: Mapping[str, GroupTemplate],
        *,
        seed: int = 7,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Args: clients and double to sync; metrics to relabel; templates per node group name;
        seed for new pod names and IPs; clock (epoch seconds) for creation times and stale markers."""
        self._clients = clients
        self._double = double
        self._metrics = metrics
        self._templates = dict(templates)
        self._rng = random.Random(seed)
        self._clock = clock
        self._gone: set[str] = set()
        self._asg_of: dict[str, str] = {}  # instance id → the ASG it was a member of when last seen
        self._lock = threading.Lock()
        self._worker = Periodic(self.sync, "demo-node-lifecycle")
        #: Exceptions raised by background passes (a test can assert none happened).
        self.errors = self._worker.errors
        #: Called at the start of each pass with the known templates: node groups that appeared since.
        self.discover: Callable[[Mapping[str, GroupTemplate]], Sequence[GroupTemplate]] | None = None

    def sync(self) -> SyncChanges:
        """One pass (see the class docstring); idempotent."""
        with self._lock:
            for found in self.discover(self._templates) if self.discover is not None else ():
                self._templates.setdefault(found.nodegroup, found)
            members = self._members()
            nodes = {_instance_id(n): n for n in self._double.list_nodes() if _instance_id(n)}
            details = self._describe(sorted(set(nodes) | {i for m in members.values() for i in m}))
            states = {k: str(v["State"]["Name"]) for k, v in details.items()}
            removed: list[str] = []
            for instance_id, node in sorted(nodes.items()):
                group = self._asg_of.get(instance_id)
                for asg_name, ids in members.items():
                    if instance_id in ids:
                        group = self._asg_of[instance_id] = asg_name
                left_group = group is not None and instance_id not in members.get(group, {})
                if states.get(instance_id, "terminated") in _GONE_STATES or left_group:
                    name = str(node["metadata"]["name"])
                    self._double.delete_node(name)
                    self._metrics.stop_node(name, self._clock())
                    self._gone.add(instance_id)
                    removed.append(name)
                elif instance_id in details:
                    self._kubelet(node, details[instance_id])
            added: list[str] = []
            for template in self._templates.values():
                for instance_id, lifecycle in sorted(members.get(template.asg_name, {}).items()):
                    if instance_id in nodes or instance_id in self._gone or lifecycle != "InService":
                        continue
                    if states.get(instance_id) not in ("pending", "running"):
                        continue
                    self._asg_of[instance_id] = template.asg_name
                    added.append(self._add_node(template, details[instance_id]))
            return SyncChanges(tuple(removed), tuple(added))

    def _kubelet(self, node: JSON, instance: Mapping[str, Any]) -> None:
        """A stopped instance's Node turns NotReady; when it runs again its kubelet reports Ready, and when
        its type changed (a resize) re-registers it with the new type (labels) and that type's GPUs (catalog
        count) as capacity and allocatable. A steady node is left exactly as it is; the Node object is kept
        with its annotations and cordon; only a change is written."""
        state, instance_type = str(instance["State"]["Name"]), str(instance["InstanceType"])
        updated = copy.deepcopy(node)
        running = state == "running"
        conditions = updated["status"].setdefault("conditions", [])
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        if ready is None:
            ready = {"type": "Ready"}
            conditions.append(ready)
        if running and ready.get("status") != "True":
            ready.update(status="True", reason="KubeletReady")
        elif not running and state != "pending" and ready.get("status") == "True":
            ready.update(status="Unknown", reason="NodeStatusUnknown")
        labels = updated["metadata"].setdefault("labels", {})
        if running and labels.get("node.kubernetes.io/instance-type") != instance_type:
            labels["node.kubernetes.io/instance-type"] = instance_type
            labels["beta.kubernetes.io/instance-type"] = instance_type
            row = load_catalog().get(instance_type)
            if row is not None and row.gpu_count >= 1:
                updated["status"].setdefault("capacity", {})["nvidia.com/gpu"] = str(row.gpu_count)
                updated["status"].setdefault("allocatable", {})["nvidia.com/gpu"] = str(row.gpu_count)
        if updated != node:
            updated["metadata"].pop("resourceVersion", None)
            self._double.add_node(updated)

    def _members(self) -> dict[str, dict[str, str]]:
        names = sorted({t.asg_name for t in self._templates.values()} | set(self._asg_of.values()))
        groups = self._clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=names)
        return {
            str(g["AutoScalingGroupName"]): {
                str(i["InstanceId"]): str(i["LifecycleState"]) for i in g.get("Instances", [])
            }
            for g in groups["AutoScalingGroups"]
        }

    def _describe(self, instance_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        if not instance_ids:
            return {}
        # A filter, not InstanceIds: an id moto has forgotten is then absent instead of an error.
        answer = self._clients.ec2.describe_instances(
            Filters=[{"Name": "instance-id", "Values": list(instance_ids)}]
        )
        return {str(i["InstanceId"]): i for r in answer["Reservations"] for i in r.get("Instances", [])}

    def _free_ip(self, preferred: str, prefix: str) -> str:
        taken = {_node_ip(n) for n in self._double.list_nodes()}
        taken |= {str((p.get("status") or {}).get("podIP", "")) for p in self._double.list_pods()}
        candidate = preferred
        while not candidate or candidate in taken:
            candidate = f"{prefix}.{self._rng.randint(4, 254)}"
        return candidate

    def add_template(self, template: GroupTemplate) -> None:
        """Follow one more node group (its instances become Nodes cloned from ``template``)."""
        with self._lock:
            self._templates[template.nodegroup] = template

    def register(
        self,
        template: GroupTemplate,
        detail: Mapping[str, Any],
        *,
        born: float,
        pod_renames: Mapping[str, str],
    ) -> str:
        """Add the Node of instance ``detail`` now, as if it had joined at ``born`` (epoch s), with the
        template's series from then on (workload pods renamed per ``pod_renames``); returns its name."""
        with self._lock:
            self._asg_of[str(detail["InstanceId"])] = template.asg_name
            return self._add_node(template, detail, born=born, pod_renames=pod_renames)

    def _add_node(
        self,
        template: GroupTemplate,
        detail: Mapping[str, Any],
        *,
        born: float | None = None,
        pod_renames: Mapping[str, str] | None = None,
    ) -> str:
        instance_id = str(detail["InstanceId"])
        zone = str(detail.get("Placement", {}).get("AvailabilityZone", "us-east-1a"))
        ip = str(detail.get("PrivateIpAddress") or "")
        subnet_prefix = ip.rpartition(".")[0] or "10.0.1"
        ip = self._free_ip(ip, subnet_prefix)
        name = f"ip-{ip.replace('.', '-')}.ec2.internal"
        now = self._clock() if born is None else born
        node = _new_node_object(template.node, name, ip, zone, instance_id, now, self._rng)
        self._double.add_node(node)
        exporter_name = exporter_ip = None
        for pod in template.daemon_pods:
            new_pod = copy.deepcopy(pod)
            meta = new_pod["metadata"]
            owner = next(o for o in meta.get("ownerReferences", []) if o.get("kind") == "DaemonSet")
            meta["name"] = f"{owner['name']}-" + "".join(self._rng.choice(_SUFFIX_ALPHABET) for _ in range(5))
            for key in ("uid", "resourceVersion", "creationTimestamp"):
                meta.pop(key, None)
            new_pod["spec"]["nodeName"] = name
            host_network = bool(new_pod["spec"].get("hostNetwork"))
            pod_ip = ip if host_network else self._free_ip("", subnet_prefix)
            started = _rfc3339(now)
            new_pod["status"] = {
                "phase": "Running",
                "hostIP": ip,
                "hostIPs": [{"ip": ip}],
                "podIP": pod_ip,
                "podIPs": [{"ip": pod_ip}],
                "startTime": started,
                "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
            }
            self._double.add_pod(new_pod)
            if is_exporter(new_pod):
                exporter_name, exporter_ip = str(meta["name"]), pod_ip
        if template.metrics_node and exporter_name and exporter_ip:
            self._metrics.clone_node(
                template.metrics_node,
                name,
                since=now,
                exporter_pod=exporter_name,
                exporter_ip=exporter_ip,
                template_exporter_pod=template.exporter_pod,
                pod_renames=pod_renames,
            )
        return name

    def start(self, interval_s: float = 0.2) -> None:
        """Sync every ``interval_s`` seconds on a daemon thread until :meth:`stop`."""
        self._worker.start(interval_s)

    def stop(self) -> None:
        """Stop the background thread (if any) and wait for it."""
        self._worker.stop()


def _node_ip(node: JSON) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address", ""))
    return ""


def _new_node_object(
    template: JSON, name: str, ip: str, zone: str, instance_id: str, now: float, rng: random.Random
) -> JSON:
    """A freshly joined Node cloned from ``template``: new identity, Ready, nothing of ours on it."""
    node = copy.deepcopy(template)
    meta = node["metadata"]
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key, None)
    meta["name"] = name
    meta["creationTimestamp"] = _rfc3339(now)
    labels = meta.setdefault("labels", {})
    labels["kubernetes.io/hostname"] = name
    for key in ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"):
        if key in labels:
            labels[key] = zone
    annotations = meta.setdefault("annotations", {})
    for key in [k for k in annotations if k.startswith("rightsizer.io/")]:
        del annotations[key]  # a cordon of ours belongs to the instance that went away
    annotations["alpha.kubernetes.io/provided-node-ip"] = ip
    if "csi.volume.kubernetes.io/nodeid" in annotations:
        annotations["csi.volume.kubernetes.io/nodeid"] = json.dumps({"ebs.csi.aws.com": instance_id})
    spec = node.setdefault("spec", {})
    spec.pop("unschedulable", None)
    spec["providerID"] = f"aws:///{zone}/{instance_id}"
    spec["taints"] = [
        t for t in spec.get("taints") or [] if not str(t.get("key", "")).startswith("rightsizer")
    ]
    status = node.setdefault("status", {})
    status["addresses"] = [
        {"address": ip, "type": "InternalIP"},
        {"address": name, "type": "InternalDNS"},
        {"address": name, "type": "Hostname"},
    ]
    capacity = status.get("capacity") or {}
    allocatable = status.setdefault("allocatable", {})
    for resource, quantity in capacity.items():
        if resource.startswith("nvidia.com/"):
            allocatable[resource] = quantity  # the device plugin advertises every GPU of a fresh node
    stamp = _rfc3339(now)
    for condition in status.get("conditions") or []:
        condition["lastHeartbeatTime"] = stamp
        condition["lastTransitionTime"] = stamp
    info = status.setdefault("nodeInfo", {})
    info["bootID"] = seeded_uuid4(rng)
    info["machineID"] = f"ec2{rng.getrandbits(116):029x}"
    info["systemUUID"] = f"ec2{seeded_uuid4(rng)[3:]}"
    return node

"""The demo's managed node group replacement (issue 17): a serving group to replace, and kubelets for the
replacement. Never imported by product code.

The embedded snapshot has no managed node group whose every node is underutilized, so the demo adds one:
:data:`SERVE_GROUP`, two g5.12xlarge nodes cloned from the snapshot's underutilized
``ip-10-0-29-91.ec2.internal`` (one A10G of four busy at ~82 % with ~9.3 GiB, a vLLM pod) — its Node
object, DaemonSet and workload pods and DCGM series, relabelled, as if the nodes had joined two idle windows
ago — in a new opted-in managed node group on moto. The plan then proposes ``replace_node_group`` →
g5.xlarge for it.

:func:`replacement_templates` lets the demo's node lifecycle syncer follow a replacement group once EKS
(the moto reconciler) created its Auto Scaling group: its Nodes are the old group's template with the new
instance type, that type's GPUs (catalog) and the new group's label, and no DCGM series yet (a new node is
``unknown`` until it has a window of data).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rightsizer.domain.catalog import load_catalog
from rightsizer.testing.moto_eks import NodeGroupSpec, add_nodegroup
from rightsizer.testing.node_lifecycle import GroupTemplate, is_daemon_pod, is_exporter

if TYPE_CHECKING:
    from rightsizer.adapters.aws import AwsClients
    from rightsizer.testing.demo_env import DemoEnvironment

__all__ = ["SERVE_GROUP", "SERVE_TEMPLATE", "add_serving_group", "replacement_templates"]

SERVE_GROUP = "gpu-a10g-serve"
SERVE_TEMPLATE = "ip-10-0-29-91.ec2.internal"
_NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
_TAG_REPLACES = "rightsizer.io/replaces"


def add_serving_group(env: DemoEnvironment, *, count: int = 2) -> list[str]:
    """Create :data:`SERVE_GROUP` on moto (g5.12xlarge, min 1 / desired ``count`` / max ``count + 1``, opted
    in, the labels of the template's node group) and its Nodes, pods and series; returns the node names."""
    syncer = env.syncer
    assert syncer is not None, "the environment is not started"
    like = env.double.get_node(SERVE_TEMPLATE)
    assert like is not None, f"{SERVE_TEMPLATE} is not in the demo snapshot"
    labels = like["metadata"]["labels"]
    source = env.clients.eks.describe_nodegroup(
        clusterName=env.cluster_name, nodegroupName=labels[_NODEGROUP_LABEL]
    )
    spec = NodeGroupSpec(
        SERVE_GROUP,
        labels["node.kubernetes.io/instance-type"],
        min_size=1,
        desired=count,
        max_size=count + 1,
        labels=dict(source["nodegroup"].get("labels") or {}),
    )
    built = add_nodegroup(env.clients, env.cluster_name, env.built.subnet_ids, spec, region=env.region)
    env.built.nodegroups[SERVE_GROUP] = built  # type: ignore[index]
    node = copy.deepcopy(like)
    node["metadata"]["labels"][_NODEGROUP_LABEL] = SERVE_GROUP
    pods = env.double.list_pods(SERVE_TEMPLATE)
    daemons = tuple(p for p in pods if is_daemon_pod(p))
    workloads = [p for p in pods if not is_daemon_pod(p)]
    exporter = next((str(p["metadata"]["name"]) for p in daemons if is_exporter(p)), None)
    template = GroupTemplate(SERVE_GROUP, built.asg_name, node, daemons, SERVE_TEMPLATE, exporter)
    # Joined two idle windows ago: old enough to be judged, with a full window of series.
    born = time.time() - 2 * env.metrics.window_seconds
    answer = env.clients.ec2.describe_instances(InstanceIds=list(built.instance_ids))
    names = []
    for i, detail in enumerate(i for r in answer["Reservations"] for i in r["Instances"]):
        renames = {
            str(p["metadata"]["name"]): f"{str(p['metadata']['name'])[:-5]}s{i:04d}" for p in workloads
        }
        name = syncer.register(template, detail, born=born, pod_renames=renames)
        for pod in workloads:
            clone = copy.deepcopy(pod)
            meta = clone["metadata"]
            meta["name"] = renames[str(meta["name"])]
            for key in ("uid", "resourceVersion"):
                meta.pop(key, None)
            clone["spec"]["nodeName"] = name
            env.double.add_pod(clone)
        env.instance_of[name] = str(detail["InstanceId"])
        names.append(name)
    syncer.add_template(template)
    return names


def replacement_templates(clients: AwsClients, cluster: str) -> Any:
    """A ``NodeLifecycleSyncer.discover`` hook: templates for node groups tagged ``rightsizer.io/replaces``
    (a replacement the workflow created) once their Auto Scaling group exists."""

    def discover(known: Mapping[str, GroupTemplate]) -> list[GroupTemplate]:
        found = []
        for name in clients.eks.list_nodegroups(clusterName=cluster)["nodegroups"]:
            if name in known:
                continue
            try:
                ng = clients.eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
            except clients.eks.exceptions.ResourceNotFoundException:
                continue
            old = known.get(str((ng.get("tags") or {}).get(_TAG_REPLACES, "")))
            groups = (ng.get("resources") or {}).get("autoScalingGroups") or []
            if old is None or not groups:
                continue
            found.append(_derived(clients, old, name, str(groups[0]["name"]), ng))
        return found

    return discover


def _derived(
    clients: AwsClients, old: GroupTemplate, name: str, asg_name: str, ng: Mapping[str, Any]
) -> GroupTemplate:
    instance_type = next(iter(ng.get("instanceTypes") or []), None)
    template = ng.get("launchTemplate")
    if template:  # the template's type wins, as on EKS
        data = clients.ec2.describe_launch_template_versions(
            LaunchTemplateId=str(template["id"]), Versions=[str(template["version"])]
        )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
        instance_type = data.get("InstanceType") or instance_type
    node = copy.deepcopy(old.node)
    labels = node["metadata"]["labels"]
    labels[_NODEGROUP_LABEL] = name
    labels["node.kubernetes.io/instance-type"] = labels["beta.kubernetes.io/instance-type"] = str(
        instance_type
    )
    row = load_catalog().get(str(instance_type))
    if row is not None:
        for part in ("capacity", "allocatable"):
            node["status"].setdefault(part, {})["nvidia.com/gpu"] = str(row.gpu_count)
    return GroupTemplate(name, asg_name, node, old.daemon_pods, None, None)

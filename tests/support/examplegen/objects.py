"""Kubernetes and AWS objects of a scenario: Nodes, DescribeNodegroup / Auto Scaling answers, EC2 reservations."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from tests.support.examplegen.cast import Ids, NodeCast, _aws_ts, _ts
from tests.support.examplegen.scenarios import Scenario
from tests.support.examplegen.sources import (
    _GPU_LABELS,
    ACCOUNT,
    CLUSTER,
    INSTANCE_TYPES,
    REGION,
    Json,
    Sources,
)

# ----------------------------------------------------------------------------------------------------------
# Kubernetes and AWS objects
# ----------------------------------------------------------------------------------------------------------


def _node_object(src: Sources, node: NodeCast, ids: Ids, nfd: bool, taken_at: datetime) -> Json:  # noqa: C901 (18): a dev tool building one EKS Node object field by field
    """A Node derived from the packaged node JSON of the same family, renamed and made consistent."""
    it = node.itype
    tpl = src.node_templates[it.template]
    obj: Json = json.loads(json.dumps(tpl))
    meta, labels = obj["metadata"], obj["metadata"]["labels"]
    meta["name"] = node.name
    meta["uid"] = ids.uuid()
    meta["resourceVersion"] = str(ids.rng.randint(1_000_000, 99_999_999))
    meta["creationTimestamp"] = _ts(node.created)
    ann = meta.setdefault("annotations", {})
    ann["alpha.kubernetes.io/provided-node-ip"] = node.ip
    if "csi.volume.kubernetes.io/nodeid" in ann:
        ann["csi.volume.kubernetes.io/nodeid"] = json.dumps({"ebs.csi.aws.com": node.instance_id})
    zone_id = {"a": "use1-az1", "b": "use1-az2", "c": "use1-az6", "e": "use1-az3"}[node.az[-1]]
    for key in ("failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/zone"):
        labels[key] = node.az
    labels["topology.k8s.aws/zone-id"] = zone_id
    if "topology.ebs.csi.aws.com/zone" in labels:
        labels["topology.ebs.csi.aws.com/zone"] = node.az
    labels["topology.kubernetes.io/region"] = REGION
    labels["failure-domain.beta.kubernetes.io/region"] = REGION
    labels["kubernetes.io/hostname"] = node.name
    labels["node.kubernetes.io/instance-type"] = it.name
    labels["beta.kubernetes.io/instance-type"] = it.name
    if node.owner == "mng":
        labels["eks.amazonaws.com/nodegroup"] = node.group
        labels["eks.amazonaws.com/capacityType"] = "SPOT" if node.spot else "ON_DEMAND"
        if "alpha.eksctl.io/nodegroup-name" in labels:
            labels["alpha.eksctl.io/nodegroup-name"] = node.group
    else:
        for key in [k for k in labels if k.startswith(("eks.amazonaws.com/", "alpha.eksctl.io/"))]:
            del labels[key]
    if it.model is None:
        for key in [
            k for k in labels if k.startswith(("nvidia.com/", "feature.node.kubernetes.io/pci-10de"))
        ]:
            del labels[key]
        labels["workload"] = "system"
        obj["spec"].pop("taints", None)
    elif it.model in _GPU_LABELS:
        gl = _GPU_LABELS[it.model]
        labels["nvidia.com/gpu.count"] = str(it.gpus)
        labels["nvidia.com/gpu.product"] = gl["product"]
        labels["nvidia.com/gpu.family"] = gl["family"]
        labels["nvidia.com/gpu.memory"] = gl["memory"]
        labels["nvidia.com/gpu.compute.major"] = gl["major"]
        labels["nvidia.com/gpu.compute.minor"] = gl["minor"]
    if it.model is not None:
        labels["nvidia.com/gpu.machine"] = it.name
    if it.template == "p4d" and not node.mig:
        # The template is MIG mixed; a scale node runs with MIG disabled (whole GPUs).
        for key in [k for k in labels if k.startswith("nvidia.com/mig-")]:
            del labels[key]
        labels["nvidia.com/mig.config"] = "all-disabled"
        labels["nvidia.com/mig.strategy"] = "single"
        labels["eks.amazonaws.com/capacityType"] = "ON_DEMAND"
    if nfd and it.template in ("p4d", "p5"):
        labels.update(src.nfd_cpu_labels)
    obj["spec"]["providerID"] = f"aws:///{node.az}/{node.instance_id}"
    status = obj["status"]
    status["addresses"] = [
        {"address": node.ip, "type": "InternalIP"},
        {"address": node.name, "type": "InternalDNS"},
        {"address": node.name, "type": "Hostname"},
    ]
    mem_ki = it.memory_gib * 1024 * 1024 * 972 // 1000  # what the kernel reports of the instance's RAM
    capacity = {k: v for k, v in status["capacity"].items() if not k.startswith("nvidia.com/")}
    capacity.update({"cpu": str(it.vcpu), "memory": f"{mem_ki}Ki", "pods": str(it.max_pods)})
    allocatable = {k: v for k, v in status["allocatable"].items() if not k.startswith("nvidia.com/")}
    allocatable.update(
        {
            "cpu": it.allocatable_cpu,
            "memory": f"{it.allocatable_memory_mi * 1024}Ki",
            "pods": str(it.max_pods),
        }
    )
    if it.gpus:
        gpu_res: dict[str, str] = {}
        if node.mig:
            gpu_res = {k: v for k, v in status["capacity"].items() if k.startswith("nvidia.com/")}
        else:
            gpu_res = {"nvidia.com/gpu": str(it.gpus)}
        capacity.update(gpu_res)
        allocatable.update(gpu_res)
    if it.template == "g5":
        # g5/g6 have no EFA on these sizes; p4d/p5 keep the template's vpc.amazonaws.com/efa.
        capacity.pop("vpc.amazonaws.com/efa", None)
        allocatable.pop("vpc.amazonaws.com/efa", None)
    status["capacity"], status["allocatable"] = capacity, allocatable
    heartbeat = _ts(taken_at - timedelta(seconds=25))
    for cond in status["conditions"]:
        cond["lastHeartbeatTime"] = heartbeat
        cond["lastTransitionTime"] = _ts(
            node.created + timedelta(seconds=5 if cond["type"] != "Ready" else 27)
        )
    info = status["nodeInfo"]
    info["bootID"] = ids.uuid()
    info["machineID"] = f"ec2{ids.hex(29)}"
    info["systemUUID"] = f"ec2{ids.uuid()[3:]}"
    return obj


def _nodegroup_objects(
    src: Sources, scenario: Scenario, taken_at: datetime, ids: Ids
) -> tuple[list[Json], list[Json], list[Json]]:
    """EKS DescribeNodegroup objects, their Auto Scaling groups and the DescribeAutoScalingInstances answer."""
    nodegroups: list[Json] = []
    asgs: list[Json] = []
    asg_instances: list[Json] = []
    for group in scenario.groups:
        name, itype = group["name"], group["itype"]
        members = sorted((n for n in scenario.nodes if n.group == name), key=lambda n: n.name)
        ng_uuid = ids.uuid()
        asg_name = f"eks-{name}-{ng_uuid}"
        created = min(n.created for n in members) - timedelta(minutes=4)
        lt = {
            "LaunchTemplateId": f"lt-0{ids.hex(16)}",
            "LaunchTemplateName": f"eks-{ng_uuid}",
            "Version": "1",
        }
        ng: Json = json.loads(json.dumps(src.nodegroup_template))
        ng.update(
            {
                "nodegroupName": name,
                "nodegroupArn": f"arn:aws:eks:{REGION}:{ACCOUNT}:nodegroup/{CLUSTER}/{name}/{ng_uuid}",
                "clusterName": CLUSTER,
                "createdAt": created.isoformat(timespec="microseconds"),
                "modifiedAt": (taken_at - timedelta(days=1)).isoformat(timespec="microseconds"),
                "capacityType": "SPOT" if group["spot"] else "ON_DEMAND",
                "scalingConfig": {
                    "minSize": group["min"],
                    "maxSize": group["max"],
                    "desiredSize": len(members),
                },
                "instanceTypes": [itype],
                "resources": {"autoScalingGroups": [{"name": asg_name}]},
                "launchTemplate": {
                    "id": lt["LaunchTemplateId"],
                    "name": lt["LaunchTemplateName"],
                    "version": "1",
                },
            }
        )
        if INSTANCE_TYPES[itype].model is None:
            ng["amiType"] = "AL2023_x86_64_STANDARD"
            ng["labels"] = {"workload": "system"}
            ng["taints"] = []
        nodegroups.append(ng)
        instances = [
            {
                "AvailabilityZone": n.az,
                "HealthStatus": "Healthy",
                "InstanceId": n.instance_id,
                "InstanceType": itype,
                "LaunchTemplate": lt,
                "LifecycleState": "InService",
                "ProtectedFromScaleIn": False,
            }
            for n in members
        ]
        tags = {
            "eks:cluster-name": CLUSTER,
            "eks:nodegroup-name": name,
            "k8s.io/cluster-autoscaler/enabled": "true",
            f"k8s.io/cluster-autoscaler/{CLUSTER}": "owned",
            f"kubernetes.io/cluster/{CLUSTER}": "owned",
        }
        asgs.append(
            {
                "AutoScalingGroupARN": f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:{ids.uuid()}:"
                f"autoScalingGroupName/{asg_name}",
                "AutoScalingGroupName": asg_name,
                "AvailabilityZones": sorted({n.az for n in members}),
                "CapacityRebalance": bool(group["spot"]),
                "CreatedTime": _aws_ts(created),
                "DefaultCooldown": 300,
                "DesiredCapacity": len(members),
                "EnabledMetrics": [],
                "HealthCheckGracePeriod": 15,
                "HealthCheckType": "EC2",
                "Instances": instances,
                "LoadBalancerNames": [],
                "MaxSize": group["max"],
                "MinSize": group["min"],
                "MixedInstancesPolicy": {
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": lt,
                        "Overrides": [{"InstanceType": itype}],
                    },
                    "InstancesDistribution": {
                        "OnDemandBaseCapacity": 0,
                        "OnDemandPercentageAboveBaseCapacity": 0 if group["spot"] else 100,
                        "SpotAllocationStrategy": "capacity-optimized",
                    },
                },
                "NewInstancesProtectedFromScaleIn": False,
                "ServiceLinkedRoleARN": f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/"
                "autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling",
                "SuspendedProcesses": [],
                "Tags": [
                    {
                        "Key": k,
                        "PropagateAtLaunch": True,
                        "ResourceId": asg_name,
                        "ResourceType": "auto-scaling-group",
                        "Value": v,
                    }
                    for k, v in sorted(tags.items())
                ],
                "TargetGroupARNs": [],
                "TerminationPolicies": ["AllocationStrategy", "OldestLaunchTemplate", "OldestInstance"],
                "VPCZoneIdentifier": "subnet-0a1b2c3d4e5f60001,subnet-0a1b2c3d4e5f60002",
            }
        )
        asg_instances.extend(
            {
                "AutoScalingGroupName": asg_name,
                "AvailabilityZone": n.az,
                "HealthStatus": "HEALTHY",
                "InstanceId": n.instance_id,
                "InstanceType": itype,
                "LaunchTemplate": lt,
                "LifecycleState": "InService",
                "ProtectedFromScaleIn": False,
            }
            for n in members
        )
    return nodegroups, asgs, asg_instances


def _reservations(scenario: Scenario, ids: Ids, asg_names: dict[str, str]) -> list[Json]:
    """EC2 DescribeInstances reservations, one per instance, tagged the way EKS/Karpenter tag them."""
    reservations = []
    for n in sorted(scenario.nodes, key=lambda n: n.name):
        tags = {"Name": n.name, f"kubernetes.io/cluster/{CLUSTER}": "owned"}
        if n.owner == "mng" and n.group:
            tags.update(
                {
                    "aws:autoscaling:groupName": asg_names[n.group],
                    "eks:cluster-name": CLUSTER,
                    "eks:nodegroup-name": n.group,
                }
            )
        elif n.owner == "karpenter":
            tags.update(
                {
                    "eks:eks-cluster-name": CLUSTER,
                    "karpenter.k8s.aws/ec2nodeclass": "gpu",
                    "karpenter.sh/nodeclaim": ids.name("gpu-h100"),
                    "karpenter.sh/nodepool": "gpu-h100",
                }
            )
        else:
            tags["rightsizer.io/resize"] = "allowed"
        instance: Json = {
            "AmiLaunchIndex": 0,
            "Architecture": "x86_64",
            "ImageId": f"ami-0{ids.hex(16)}",
            "InstanceId": n.instance_id,
            "InstanceType": n.itype.name,
            "LaunchTime": _aws_ts(n.created - timedelta(seconds=70)),
            "Placement": {"AvailabilityZone": n.az, "Tenancy": "default"},
            "PrivateDnsName": n.name,
            "PrivateIpAddress": n.ip,
            "RootDeviceName": "/dev/xvda",
            "RootDeviceType": "ebs",
            "State": {"Code": 16, "Name": "running"},
            "SubnetId": "subnet-0a1b2c3d4e5f60001",
            "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())],
            "VpcId": "vpc-0a1b2c3d4e5f60001",
        }
        if n.spot:
            instance["InstanceLifecycle"] = "spot"
        reservations.append(
            {"Groups": [], "Instances": [instance], "OwnerId": ACCOUNT, "ReservationId": f"r-0{ids.hex(16)}"}
        )
    return reservations

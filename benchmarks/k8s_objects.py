"""Realistic Kubernetes objects for ``benchmarks/k8s_lists_scale.py``: EKS nodes and pods the size the API
server really sends.

* **Nodes**: renamed copies of the project's anonymised EKS Node composites
  (``tests/fixtures/sources/k8s/*.node.json``, 6.5-8.7 KB each; provenance in that folder's
  ``PROVENANCE.md``): GPU nodes cycle through the g5.12xlarge (A10G), p4d.24xlarge (A100, MIG) and
  p5.48xlarge (H100) templates; a CPU node is the g5 template as an m6i.4xlarge with every NVIDIA / NFD
  label and the ``nvidia.com/gpu`` capacity removed.
* **Pods**: every field ``kubectl get pod -o json`` shows for a Deployment or DaemonSet pod on EKS 1.31
  (core/v1 Pod as the API server fills it: ``managedFields`` of kube-controller-manager and kubelet, the
  projected ``kube-api-access`` volume, the two default NoExecute tolerations, five conditions, container
  statuses with image ids), one container, ~5-6 KB of JSON. No real pod dump is in ``shared/data``; the
  field set follows the Kubernetes API reference (core/v1 Pod) and what the admission chain adds.
"""

from __future__ import annotations

import copy
import json
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

JSON = dict[str, Any]

SOURCES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sources" / "k8s"
GPU_TEMPLATES = (
    "eks-mng-g5.12xlarge-a10g.node.json",
    "eks-mng-p4d.24xlarge-a100-mig-mixed.node.json",
    "eks-karpenter-p5.48xlarge-h100.node.json",
)
CREATED = "2026-11-30T08:00:00Z"
STARTED = "2026-11-30T08:00:41Z"


def load_templates() -> tuple[list[JSON], JSON]:
    """(GPU node templates, the CPU node template) from the repository's EKS node composites."""
    gpu = [json.loads((SOURCES / name).read_text()) for name in GPU_TEMPLATES]
    cpu = copy.deepcopy(gpu[0])
    labels = cpu["metadata"]["labels"]
    for key in list(labels):
        if key.startswith(("nvidia.com/", "feature.node.kubernetes.io/")):
            del labels[key]
    for key in ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"):
        labels[key] = "m6i.4xlarge"
    labels["eks.amazonaws.com/nodegroup"] = "general"
    for field in ("capacity", "allocatable"):
        cpu["status"][field].pop("nvidia.com/gpu", None)
    return gpu, cpu


def resized(template: JSON, instance_type: str, gpus: int, cpu: str, memory_kib: int) -> JSON:
    """``template`` as another instance type of its family: ``gpus`` GPUs, ``cpu`` cores and
    ``memory_kib`` of memory (capacity and allocatable, the instance-type, GPU count and machine labels)."""
    obj = copy.deepcopy(template)
    labels = obj["metadata"]["labels"]
    for key in (
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "nvidia.com/gpu.machine",
    ):
        labels[key] = instance_type
    labels["nvidia.com/gpu.count"] = str(gpus)
    status = obj["status"]
    status["capacity"].update({"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": f"{memory_kib}Ki"})
    status["allocatable"].update(
        {
            "nvidia.com/gpu": str(gpus),
            "cpu": f"{int(cpu) * 1000 - 190}m",
            "memory": f"{memory_kib - 3_000_000}Ki",
        }
    )
    return obj


def node(template: JSON, name: str, ip: str, index: int) -> JSON:
    """``template`` renamed to ``name`` with InternalIP ``ip`` and its own provider id."""
    obj = copy.deepcopy(template)
    meta = obj["metadata"]
    meta["name"] = name
    meta.pop("uid", None)
    meta.pop("resourceVersion", None)
    meta["labels"]["kubernetes.io/hostname"] = name
    zone = meta["labels"].get("topology.kubernetes.io/zone", "us-east-1a")
    obj.setdefault("spec", {})["providerID"] = f"aws:///{zone}/i-{index:017x}"
    obj["status"]["addresses"] = [
        {"type": "InternalIP", "address": ip},
        {"type": "InternalDNS", "address": f"{name}.ec2.internal"},
        {"type": "Hostname", "address": f"{name}.ec2.internal"},
    ]
    return obj


def _managed_fields(container: str) -> list[JSON]:
    """What kube-controller-manager (create) and the kubelet (status) own, as the server records it."""
    spec_fields = {
        "f:metadata": {
            "f:generateName": {},
            "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
            "f:ownerReferences": {".": {}, 'k:{"uid":"0"}': {}},
        },
        "f:spec": {
            "f:containers": {
                f'k:{{"name":"{container}"}}': {
                    ".": {},
                    "f:env": {".": {}, 'k:{"name":"LOG_LEVEL"}': {".": {}, "f:name": {}, "f:value": {}}},
                    "f:image": {},
                    "f:imagePullPolicy": {},
                    "f:livenessProbe": {".": {}, "f:httpGet": {".": {}, "f:path": {}, "f:port": {}}},
                    "f:name": {},
                    "f:ports": {".": {}, 'k:{"containerPort":8080,"protocol":"TCP"}': {".": {}}},
                    "f:readinessProbe": {".": {}, "f:httpGet": {".": {}, "f:path": {}, "f:port": {}}},
                    "f:resources": {".": {}, "f:limits": {".": {}}, "f:requests": {".": {}}},
                    "f:terminationMessagePath": {},
                    "f:terminationMessagePolicy": {},
                }
            },
            "f:dnsPolicy": {},
            "f:enableServiceLinks": {},
            "f:restartPolicy": {},
            "f:schedulerName": {},
            "f:securityContext": {},
            "f:terminationGracePeriodSeconds": {},
        },
    }
    status_fields = {
        "f:status": {
            "f:conditions": {
                f'k:{{"type":"{t}"}}': {
                    ".": {},
                    "f:lastProbeTime": {},
                    "f:lastTransitionTime": {},
                    "f:status": {},
                    "f:type": {},
                }
                for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")
            },
            "f:containerStatuses": {},
            "f:hostIP": {},
            "f:hostIPs": {},
            "f:phase": {},
            "f:podIP": {},
            "f:podIPs": {".": {}, 'k:{"ip":"0"}': {".": {}, "f:ip": {}}},
            "f:startTime": {},
        }
    }
    return [
        {
            "apiVersion": "v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": spec_fields,
            "manager": "kube-controller-manager",
            "operation": "Update",
            "time": CREATED,
        },
        {
            "apiVersion": "v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": status_fields,
            "manager": "kubelet",
            "operation": "Update",
            "subresource": "status",
            "time": STARTED,
        },
    ]


def pod(
    name: str,
    namespace: str,
    node_name: str,
    node_ip: str,
    pod_ip: str,
    *,
    app: str,
    owner: tuple[str, str],
    image: str,
    gpus: int = 0,
    labels: JSON | None = None,
) -> JSON:
    """A Running pod on ``node_name`` as ``kubectl get pod -o json`` prints it; ``owner`` = (kind, name)."""
    container = app.split("-")[0]
    requests: JSON = {"cpu": "500m", "memory": "1Gi"}
    limits: JSON = {"memory": "2Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    kind, owner_name = owner
    # Per pod, as on a real cluster: start times, the token volume's random suffix, container ids.
    crc = zlib.crc32(f"{namespace}/{name}".encode())
    started = (datetime(2026, 11, 30, 8, tzinfo=UTC) + timedelta(seconds=crc % 86_400)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    token_volume = f"kube-api-access-{crc % 36**5:05x}"
    tolerations = [
        {
            "effect": "NoExecute",
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "tolerationSeconds": 300,
        },
        {
            "effect": "NoExecute",
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "tolerationSeconds": 300,
        },
    ]
    if gpus:
        tolerations.append({"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"})
    probe = {
        "failureThreshold": 3,
        "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
        "periodSeconds": 10,
        "successThreshold": 1,
        "timeoutSeconds": 1,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "annotations": {"kubectl.kubernetes.io/restartedAt": CREATED, "prometheus.io/scrape": "true"},
            "creationTimestamp": CREATED,
            "generateName": f"{owner_name}-",
            "labels": {
                "app": app,
                "app.kubernetes.io/instance": app,
                "app.kubernetes.io/name": app,
                "pod-template-hash": owner_name.rsplit("-", 1)[-1],
                **(labels or {}),
            },
            "managedFields": _managed_fields(container),
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": kind,
                    "name": owner_name,
                    "uid": f"5f1c2d9e-{zlib.crc32(owner_name.encode()) % 10**12:012d}-4b1e-9a33-0c2f7e6d1a40",
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "env": [
                        {"name": "LOG_LEVEL", "value": "info"},
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
                        },
                    ],
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "livenessProbe": probe,
                    "name": container,
                    "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                    "readinessProbe": probe,
                    "resources": {"limits": limits, "requests": requests},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "volumeMounts": [
                        {
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "name": token_volume,
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "nodeName": node_name,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "securityContext": {},
            "serviceAccount": "default",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": tolerations,
            "volumes": [
                {
                    "name": token_volume,
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                    "name": "kube-root-ca.crt",
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                            "path": "namespace",
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                }
            ],
        },
        "status": {
            "conditions": [
                {"lastProbeTime": None, "lastTransitionTime": started, "status": "True", "type": t}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "containerStatuses": [
                {
                    "containerID": f"containerd://{crc:016x}{zlib.crc32(name.encode()[::-1]):016x}{'0' * 32}",
                    "image": image,
                    "imageID": f"{image.split(':')[0]}@sha256:{'3f' * 32}",
                    "lastState": {},
                    "name": container,
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": started}},
                }
            ],
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "phase": "Running",
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "qosClass": "Burstable",
            "startTime": started,
        },
    }

"""Equal parts of many pods are stored once (issue 11 item 7): the live plan's GPU-node pods.

GIVEN the pods of a few Deployments (same containers, tolerations, labels, owner, conditions per template)
WHEN each validated pod passes through one ``SharedPodParts``
THEN every pod still equals its validated self (the decision cannot tell), the parts of one template are
one object, different parts stay apart, and the pods' memory falls to a fraction.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

from rightsizer.domain.model import Pod
from rightsizer.domain.pod_parts import SharedPodParts
from tests.builders import pod

TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def replica(i: int, app: str) -> dict[str, Any]:
    item = pod(
        f"{app}-{i}",
        f"gpu-{i % 7}",
        namespace="ml",
        gpus=1,
        labels={"app": app, "pod-template-hash": "7d9f8b6c5d"},
        annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "MODEL", "value": app}],
        pod_ip=f"10.1.0.{i % 250 + 1}",
        extra_spec={"tolerations": TOLERATIONS},
    )
    item["metadata"]["ownerReferences"][0]["name"] = f"{app}-7d9f8b6c5d"
    item["status"]["conditions"] = [
        {"type": t, "status": "True", "lastTransitionTime": f"2026-11-30T08:{i % 60:02d}:00Z"}
        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return item


def test_equal_parts_are_one_object_and_every_pod_decides_as_before() -> None:
    shared = SharedPodParts()
    validated = [Pod.model_validate(replica(i, app)) for app in ("train", "serve") for i in range(20)]
    kept = [shared.pod(p) for p in validated]

    assert kept == validated
    assert [p.ready for p in kept] == [True] * 40 and [p.gpu_request() for p in kept] == [1] * 40
    train, serve = kept[:20], kept[20:]
    for group in (train, serve):
        first = group[0]
        assert all(p.spec.containers is first.spec.containers for p in group)
        assert all(p.spec.tolerations is first.spec.tolerations for p in group)
        assert all(p.metadata.labels is first.metadata.labels for p in group)
        assert all(p.metadata.ownerReferences is first.metadata.ownerReferences for p in group)
        assert all(p.status.conditions is first.status.conditions for p in group)
    # what differs stays apart: another template's containers and labels, every pod's own name and IP
    assert train[0].spec.containers is not serve[0].spec.containers
    assert train[0].metadata.labels is not serve[0].metadata.labels
    assert {p.metadata.name for p in kept} == {p.metadata.name for p in validated}
    assert train[0].spec.tolerations is serve[0].spec.tolerations  # equal across templates too


def test_shared_pods_cost_a_fraction_of_the_validated_ones() -> None:
    items = [replica(i, f"app{i % 4}") for i in range(1000)]

    def retained(shared: SharedPodParts | None) -> int:
        tracemalloc.start()
        try:
            kept = [shared.pod(Pod.model_validate(x)) if shared else Pod.model_validate(x) for x in items]
            size = tracemalloc.get_traced_memory()[0]
            del kept
            return size
        finally:
            tracemalloc.stop()

    whole, lean = retained(None), retained(SharedPodParts())
    assert lean * 2 < whole, (lean, whole)

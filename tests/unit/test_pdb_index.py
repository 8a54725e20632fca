"""PodDisruptionBudgets looked up by the pod's namespace give exactly what a scan of every PDB gives.

The planner makes one ``PodContext`` per node and hands every context one index of the cluster's PDBs
(``pdbs_by_namespace``) instead of letting each pod be matched against every PDB of the cluster (150,000
pods × hundreds of PDBs at 10,000 GPU nodes). A policy/v1 PDB selects pods of its own namespace only, so
the index may not change a single finding, and the order of a pod's PDBs (the first one's budget is
reported) must stay the cluster's order.
"""

from __future__ import annotations

import random

import pytest

from rightsizer.domain.model import Pod, PodDisruptionBudget
from rightsizer.domain.pods import PodContext, classify_pod, pdbs_by_namespace
from rightsizer.domain.policy import Policy
from tests.builders import AT, pdb, pod

NAMESPACES = ("default", "ml", "ml-2", "kube-system", "")
LABELS = ({"app": "a"}, {"app": "b"}, {"app": "a", "tier": "gpu"}, {"tier": "gpu"}, {})


def _fleet(seed: int) -> tuple[list[Pod], list[PodDisruptionBudget]]:
    rng = random.Random(seed)
    pdbs = [
        PodDisruptionBudget.model_validate(
            pdb(f"pdb-{i}", rng.choice(NAMESPACES[:4]), rng.choice(LABELS[:4]), rng.choice((0, 1, 2)))
        )
        for i in range(rng.randint(0, 12))
    ]
    pods = [
        Pod.model_validate(
            pod(
                f"p-{i}", "gpu-1", namespace=rng.choice(NAMESPACES[:4]), labels=rng.choice(LABELS), gpus=i % 2
            )
        )
        for i in range(25)
    ]
    return pods, pdbs


@pytest.mark.parametrize("seed", range(12))
def test_a_namespace_index_finds_every_pdb_a_full_scan_finds_in_the_same_order(seed: int) -> None:
    pods, pdbs = _fleet(seed)
    for ctx in (
        PodContext(Policy(), pdbs, {}, AT, pdb_index=pdbs_by_namespace(pdbs)),
        PodContext(Policy(), pdbs, {}, AT),
    ):
        for ns in NAMESPACES:
            assert list(ctx.namespace_pdbs(ns)) == [b for b in pdbs if b.metadata.namespace == ns]
        for p in pods:
            scanned = [b for b in pdbs if b.selects(p)]
            assert [b for b in ctx.namespace_pdbs(p.metadata.namespace) if b.selects(p)] == scanned


@pytest.mark.parametrize("seed", range(12))
def test_classification_with_the_planners_shared_index_equals_the_one_without(seed: int) -> None:
    pods, pdbs = _fleet(seed)
    policy = Policy()
    shared = PodContext(policy, pdbs, {}, AT, pdb_index=pdbs_by_namespace(pdbs))
    alone = PodContext(policy, pdbs, {}, AT)  # builds its own index on first use (the drain's contexts)
    for p in pods:
        assert classify_pod(p, shared) == classify_pod(p, alone)


def test_a_blocking_budget_is_found_only_in_its_own_namespace() -> None:
    budget = PodDisruptionBudget.model_validate(pdb("train", "ml", {"app": "a"}, 0))
    ctx = PodContext(Policy(), [budget], {}, AT)
    here = classify_pod(Pod.model_validate(pod("t-0", "gpu-1", namespace="ml", labels={"app": "a"})), ctx)
    there = classify_pod(Pod.model_validate(pod("t-1", "gpu-1", namespace="ml-2", labels={"app": "a"})), ctx)
    assert [f.code for f in here.findings] == ["pdb_blocks"]
    assert there.findings == ()

"""The remedy a Kubernetes 403 names (``adapters.kubernetes_rbac.remedy_403``): the ClusterRole of
infra/k8s/rbac.yaml that grants exactly the refused verb on that resource, and whose group it is — for
every check the code makes (reads and writes, of the drain and of the assessment), not a role by verb."""

from __future__ import annotations

import pytest

from rightsizer.adapters.kubernetes_rbac import granting_roles, remedy_403
from rightsizer.ports import AccessCheck


@pytest.mark.parametrize(
    ("check", "roles"),
    [
        # the drain's reads: only its own role grants them
        (AccessCheck("get", "replicasets", group="apps"), ["rightsizer"]),
        (AccessCheck("get", "jobs", group="batch"), ["rightsizer"]),
        (AccessCheck("get", "persistentvolumeclaims"), ["rightsizer"]),
        # the node by name: the drain, and the assessment's heal
        (AccessCheck("get", "nodes"), ["rightsizer", "rightsizer-heal"]),
        # collections: each identity that lists, in manifest order
        (
            AccessCheck("list", "pods"),
            ["rightsizer-read", "rightsizer", "rightsizer-replace", "rightsizer-offhours"],
        ),
        (
            AccessCheck("list", "resourceslices", group="resource.k8s.io"),
            ["rightsizer-read", "rightsizer", "rightsizer-replace", "rightsizer-offhours"],
        ),
        # node lists: the drain's own role lists only by selector (a zonal volume's witness search)
        (
            AccessCheck("list", "nodes"),
            ["rightsizer-read", "rightsizer", "rightsizer-replace", "rightsizer-offhours"],
        ),
        # writes
        (AccessCheck("create", "pods", "eviction"), ["rightsizer"]),
        (AccessCheck("patch", "nodes"), ["rightsizer", "rightsizer-heal"]),
        (AccessCheck("create", "events"), ["rightsizer", "rightsizer-heal"]),
        (AccessCheck("delete", "pods"), ["rightsizer-pod-delete"]),
        # nothing grants what the code never calls
        (AccessCheck("watch", "pods"), []),
        (AccessCheck("get", "pods", "eviction"), []),
    ],
)
def test_the_remedy_names_each_role_that_grants_the_refused_check(
    check: AccessCheck, roles: list[str]
) -> None:
    assert granting_roles(check) == roles
    remedy = remedy_403(check)
    if not roles:
        assert remedy.startswith(f"no ClusterRole of infra/k8s/rbac.yaml grants {check.describe()}")
        return
    assert remedy.startswith("bind the ClusterRole ") and remedy.endswith(
        " to the identity's Kubernetes group"
    )
    named = [part.split(" (", 1)[0] for part in remedy.removeprefix("bind ").split(" or the ClusterRole ")]
    assert [n.removeprefix("the ClusterRole ") for n in named] == roles


def test_the_drains_read_names_its_own_group() -> None:
    remedy = remedy_403(
        AccessCheck("get", "jobs", group="batch")
    )  # (get statefulsets: rightsizer-workloads too)
    assert remedy == (
        "bind the ClusterRole rightsizer (infra/k8s/rbac.yaml; the drain function's EKS access "
        "entry group rightsizer) to the identity's Kubernetes group"
    )

"""Ports: what the services need from the outside world, named by capability (style guide "Layout").

Services depend on these Protocols only; adapters (``rightsizer.adapters.*``) implement them and
``rightsizer.wiring`` connects the two. Everything crossing a port is plain data: Kubernetes objects as
the dicts ``kubectl get -o json`` prints, AWS answers in their API shapes, Prometheus answers as the
``/api/v1/query_range`` JSON document — so a snapshot directory (design §5) is exactly what crossed the
ports, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

JSON = dict[str, Any]


class AccessCheck(NamedTuple):
    """One Kubernetes authorization question: may the caller ``verb`` the ``resource``?

    Same fields as ``SelfSubjectAccessReview.spec.resourceAttributes``; ``group`` is ``""`` for the core
    group (nodes, pods), ``policy`` for PodDisruptionBudgets, ``resource.k8s.io`` for DRA objects.
    """

    verb: str
    resource: str
    subresource: str = ""
    group: str = ""

    def describe(self) -> str:
        """Human form for error messages: ``list poddisruptionbudgets.policy``, ``create pods/eviction``."""
        name = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {name}.{self.group}" if self.group else f"{self.verb} {name}"


class ClusterReader(Protocol):
    """Read access to one Kubernetes cluster, complete or not at all.

    Every ``list_*`` returns all items of the kind, across all namespaces, each a kubectl-JSON dict
    (``apiVersion`` and ``kind`` filled in, as ``kubectl get -o json`` prints them). A list that fails
    part-way raises: callers never see a partial list.

    Raises (every method):
        PermanentError: 401 after one token refresh, or 403 — the message names the identity, the refused
            verb and resource, and the remedy (EKS access entry / aws-auth / RBAC).
        TransientError: 429, 5xx, timeouts and connection failures.
    """

    def identity(self) -> str:
        """Who the cluster sees (an IAM ARN for EKS tokens, the kubeconfig user otherwise)."""
        ...

    def preflight(self, checks: Sequence[AccessCheck]) -> list[AccessCheck]:
        """Ask the API server (``SelfSubjectAccessReview``) about each check; return the denied ones."""
        ...

    def list_nodes(self) -> list[JSON]:
        """core/v1 Nodes."""
        ...

    def list_pods(self) -> list[JSON]:
        """core/v1 Pods of all namespaces."""
        ...

    def list_pdbs(self) -> list[JSON]:
        """policy/v1 PodDisruptionBudgets of all namespaces."""
        ...

    def served_resource_api(self) -> str | None:
        """The newest served ``resource.k8s.io`` group version among v1, v1beta2, v1beta1
        (``"resource.k8s.io/v1"``), or None when DRA is not served (normal on most clusters)."""
        ...

    def list_resource_claims(self) -> list[JSON]:
        """ResourceClaims (unstructured, served version) of all namespaces; ``[]`` when DRA is not served."""
        ...

    def list_resource_slices(self) -> list[JSON]:
        """ResourceSlices (unstructured, served version); ``[]`` when DRA is not served."""
        ...


class MetricsRangeReader(Protocol):
    """Prometheus-compatible range queries (Prometheus, Thanos, Amazon Managed Service for Prometheus)."""

    def query_range_raw(self, expr: str, start: float, end: float, step: float) -> bytes | JSON:
        """Evaluate PromQL ``expr`` at ``start``, ``start + step``, … ``end`` (Unix seconds; step in s).

        Returns:
            The ``/api/v1/query_range`` response document unchanged — its JSON bytes as received
            (``PrometheusClient``) or already parsed — with ``status``, ``data.resultType`` ``matrix``,
            ``data.result`` and optional ``warnings``. An answer with ``status: error`` is returned, not
            raised, so the snapshot records it (design §5: the metric becomes a problem).

        Raises:
            TransientError / PermanentError: the endpoint could not be reached or refused the caller.
        """
        ...


class NodeGroupInventory(Protocol):
    """Node group membership and EC2 facts, in the snapshot's AWS shapes (design §5)."""

    def describe(self, instance_ids: Sequence[str], cluster: str) -> JSON:
        """The ``nodegroups.json`` document for ``cluster`` and these instances (EKS DescribeNodegroup,
        Auto Scaling DescribeAutoScalingGroups / DescribeAutoScalingInstances)."""
        ...

    def describe_instances(self, instance_ids: Sequence[str]) -> JSON:
        """The ``instances.json`` document (``{"Reservations": [EC2 DescribeInstances …]}``)."""
        ...

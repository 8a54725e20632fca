"""Wiring: the only place SDK clients and adapters are built from a validated ``Config``.

Services receive ports (``rightsizer.ports``); handlers and the CLI ask this module for them. Nothing
here runs at import time — clients, tokens and the Kubernetes package are created on the first call, so a
handler that never needs Kubernetes (the webhook) never imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.ports import ClusterReader, NodeGroupInventory
from rightsizer.services.snapshot import Observation, ObserveRequest

if TYPE_CHECKING:
    from rightsizer.adapters.prometheus import PrometheusClient

__all__ = [
    "Observers",
    "build_cluster_reader",
    "build_inventory",
    "build_metrics_reader",
    "build_observers",
    "live_signals",
    "observe_request",
    "snapshot_from_observation",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observers:
    """The read-side ports of one cluster: Kubernetes, AWS inventory (None without an EKS name), metrics
    (the Prometheus client: a ``MetricsRangeReader`` for snapshots, the ``collect_live`` client for plans)."""

    cluster: ClusterReader
    inventory: NodeGroupInventory | None
    metrics: PrometheusClient


def _region(config: Config) -> str:
    return config.cluster.region or config.aws.region


def build_cluster_reader(config: Config, *, page_size: int = 500) -> ClusterReader:
    """The Kubernetes reader: the kubeconfig ``cluster.context`` when set, else EKS ``cluster.name``.

    EKS: ``eks:DescribeCluster`` (endpoint, CA) now; the bearer token lazily, per request as needed.

    Raises:
        ConfigError: the EKS cluster does not exist in the region.
        PermanentError: the cluster's CA is not a PEM certificate, or access to DescribeCluster is denied.
    """
    from rightsizer.adapters.kubernetes import KubernetesCluster

    if config.cluster.context:
        return KubernetesCluster.from_kubeconfig(
            config.cluster.context, config.cluster.kubeconfig, page_size=page_size
        )
    import boto3

    from rightsizer.adapters.eks_auth import (
        EksTokenSource,
        caller_identity,
        describe_cluster,
        frozen_credentials,
        write_ca_bundle,
    )

    name = str(config.cluster.name)
    region = _region(config)
    session = boto3.session.Session(region_name=region)
    endpoint_url = config.aws.endpoint_url
    eks = session.client("eks", endpoint_url=endpoint_url)
    sts = session.client("sts", endpoint_url=endpoint_url)
    target = describe_cluster(eks, name)
    # The client wants a file path; the directory lives as long as the process (Lambda: /tmp).
    ca_file = write_ca_bundle(target.ca_pem, tempfile.mkdtemp(prefix="rightsizer-ca-"))
    tokens = EksTokenSource(
        name,
        region,
        frozen_credentials(session),
        sts_endpoint=endpoint_url,
        identity=lambda: caller_identity(sts),
    )
    return KubernetesCluster.for_eks(target.endpoint, tokens, ca_file=str(ca_file), page_size=page_size)


def build_inventory(config: Config) -> NodeGroupInventory | None:
    """The AWS inventory (EKS, Auto Scaling, EC2) when ``cluster.name`` is set, else None."""
    if not config.cluster.name:
        return None
    from rightsizer.adapters.aws import AwsInventory, make_clients

    return AwsInventory(make_clients(_region(config), endpoint_url=config.aws.endpoint_url))


def _resolve_secret(config: Config) -> str | None:
    """``prometheus.secret`` resolved (``rightsizer.adapters.secrets``); SSM / Secrets Manager clients
    are built only when the reference needs them."""
    reference = config.prometheus.secret
    if reference is None:
        return None
    from rightsizer.adapters.secrets import resolve_secret

    scheme = reference.partition(":")[0]
    ssm = secretsmanager = None
    if scheme in ("ssm", "secretsmanager"):
        import boto3

        session = boto3.session.Session(region_name=config.aws.region)
        if scheme == "ssm":
            ssm = session.client("ssm", endpoint_url=config.aws.endpoint_url)
        else:
            secretsmanager = session.client("secretsmanager", endpoint_url=config.aws.endpoint_url)
    return resolve_secret(reference, ssm=ssm, secretsmanager=secretsmanager, field="prometheus.secret")


def build_metrics_reader(config: Config) -> PrometheusClient:
    """The Prometheus client for ``config.prometheus`` (``rightsizer.adapters.prometheus``); it serves
    both as the snapshot's ``MetricsRangeReader`` and as the client of ``collect_live``.

    Raises:
        ConfigError: a missing secret, user name, or SigV4 region/credentials.
    """
    from rightsizer.adapters.prometheus import build_client

    prom = config.prometheus
    credentials = None
    if prom.auth == "sigv4":
        import boto3

        credentials = boto3.session.Session(region_name=config.aws.region).get_credentials()
    return build_client(
        prom.url,
        auth=prom.auth,
        secret=_resolve_secret(config),
        username=prom.username,
        credentials=credentials,
        region=prom.sigv4_region or config.aws.region,
        timeout=float(prom.timeout),
        ca_bundle=prom.ca_bundle,
    )


def live_signals(
    config: Config, policy: Policy, snapshot: ClusterSnapshot, client: PrometheusClient
) -> ClusterSnapshot:
    """``snapshot`` with ``signals`` computed in Prometheus for the window ending at ``taken_at``
    (``collect_live``: a constant number of queries whatever the node count, design §8)."""
    from rightsizer.adapters.prometheus import collect_live
    from rightsizer.domain.join import NodeJoiner
    from rightsizer.domain.usage import Window

    node_label = config.prometheus.node_label
    window = Window.ending(snapshot.meta.taken_at, policy.idle_window, snapshot.meta.step_seconds)
    joiner = NodeJoiner(snapshot.nodes, snapshot.pods, node_label)
    signals = collect_live(client, joiner, window, policy, node_label, job=config.prometheus.job)
    return dataclasses.replace(snapshot, signals=signals)


def build_observers(config: Config, *, page_size: int = 500) -> Observers:
    """All read-side ports for ``config`` (see the ``build_*`` functions for what each needs)."""
    return Observers(
        cluster=build_cluster_reader(config, page_size=page_size),
        inventory=build_inventory(config),
        metrics=build_metrics_reader(config),
    )


def observe_request(config: Config, policy: Policy, at: datetime) -> ObserveRequest:
    """The observation parameters for ``config`` at ``at``: window from ``policy.idle_window``.

    Raises:
        ConfigError: ``prometheus.step`` is longer than the (possibly overridden) idle window.
    """
    if config.prometheus.step > policy.idle_window:
        raise ConfigError("prometheus.step must be ≤ policy.idle_window", field="prometheus.step")
    return ObserveRequest(
        at=at.replace(microsecond=0),
        window_seconds=int(policy.idle_window),
        step_seconds=int(config.prometheus.step),
        cluster=str(config.cluster.name or config.cluster.context),
        region=_region(config),
        eks_cluster=config.cluster.name,
        job=config.prometheus.job,
        node_label=config.prometheus.node_label,
    )


def snapshot_from_observation(observation: Observation) -> ClusterSnapshot:
    """Decode an observation into a ``ClusterSnapshot`` exactly as ``load_snapshot`` would decode its
    written directory, without touching the disk (``rightsizer plan --config``).

    Uses the snapshot loader's own parsing functions, file by file, so the two paths cannot drift.

    Raises:
        SnapshotError: a document does not match its schema (names the document and the field).
    """
    from pydantic import ValidationError

    from rightsizer.adapters import snapshot_dir as sd
    from rightsizer.domain.model import Node, Pod, PodDisruptionBudget, SnapshotMeta

    docs = observation.documents
    root = Path("<live>")

    def doc(name: str) -> Any:
        return docs.get(name)

    try:
        meta = sd._SnapshotFile.model_validate(doc("snapshot.json"))
    except ValidationError as exc:
        raise sd._validation_error(root / "snapshot.json", "", exc) from exc
    nodes = sd._typed_list(root / "nodes.json", doc("nodes.json"), Node)
    pods = sd._typed_list(root / "pods.json", doc("pods.json"), Pod)
    pdb_data = doc("pdbs.json")
    pdbs = sd._typed_list(root / "pdbs.json", pdb_data, PodDisruptionBudget) if pdb_data is not None else []
    claims_data, slices_data = doc("resourceclaims.json"), doc("resourceslices.json")
    claims = sd.parse_resource_claims(
        sd._items(root / "resourceclaims.json", claims_data) if claims_data is not None else [],
        sd._items(root / "resourceslices.json", slices_data) if slices_data is not None else [],
    )
    inventory = sd._inventory(
        root / "nodegroups.json", doc("nodegroups.json"), root / "instances.json", doc("instances.json")
    )
    metrics = {}
    timestamps = {}
    for path in sorted(p for p in docs if p.startswith("metrics/") and p.endswith(".json")):
        stem = path.removeprefix("metrics/").removesuffix(".json")
        if stem.endswith(".timestamp"):
            stem = stem.removesuffix(".timestamp")
            timestamps[stem] = sd._parse_matrix(stem, docs[path])
        else:
            metrics[stem] = sd._parse_matrix(stem, docs[path])
    node_label = (doc("snapshot.json") or {}).get("node_label")
    snapshot = ClusterSnapshot(
        meta=SnapshotMeta(
            taken_at=meta.taken_at,
            window_seconds=meta.window_seconds,
            step_seconds=meta.step_seconds,
            cluster=meta.cluster,
            region=meta.region,
        ),
        nodes=tuple(nodes),
        pods=tuple(pods),
        pdbs=tuple(pdbs),
        resource_claims=tuple(claims),
        inventory=inventory,
        metrics=metrics,
        timestamps=timestamps,
        node_label=str(node_label) if node_label else None,
    )
    return dataclasses.replace(snapshot, source="live")

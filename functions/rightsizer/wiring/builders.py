"""Builders of the composition root: SDK clients and adapters built from a validated ``Config``.

Services receive ports (``rightsizer.ports``); :class:`rightsizer.wiring.Runtime` asks this module for
them and hands them to the use cases (the live observation is ``rightsizer.services.observe``). Nothing
here decides or orchestrates, and nothing runs at import time — clients, tokens and the Kubernetes
package are created on the first call, so a handler that never needs Kubernetes (the webhook) never
imports it.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.logsafety import register_secret
from rightsizer.ports import (
    ClusterReader,
    ClusterWriter,
    InstanceTypeChanger,
    LaunchTemplateVersions,
    MetricsRangeReader,
    NodeGroupInventory,
    NodeGroupReplacer,
    NodeGroupSizer,
    NodeScaler,
    SnoozeReader,
    WorkflowStarter,
    WorkloadSaves,
)
from rightsizer.services.observe import Observers
from rightsizer.state import ApprovalStore, LeaseStore, PlanHistory, StateStore

if TYPE_CHECKING:
    from rightsizer.adapters.pricing import PriceListPrices
    from rightsizer.adapters.prometheus import PrometheusClient
    from rightsizer.services.approval import ApprovalNotifier, TaskCallback
    from rightsizer.services.assess import PlanningAssessor
    from rightsizer.services.warm_pools import WarmPoolPort

__all__ = [
    "aws_session",
    "build_approval_notifier",
    "build_approvals",
    "build_assessor",
    "build_cluster_reader",
    "build_cluster_writer",
    "build_instance_reader",
    "build_instance_type_changer",
    "build_inventory",
    "build_launch_templates",
    "build_local_state",
    "build_metrics_reader",
    "build_node_scaler",
    "build_nodegroup_replacer",
    "build_nodegroup_sizer",
    "build_observers",
    "build_plan_history",
    "build_prices",
    "build_state",
    "build_task_callback",
    "build_warm_pools",
    "build_workflow_starter",
    "build_workload_saves",
    "caller_arn",
    "decode_live_documents",
    "live_observers",
    "resolve_config_secret",
]

log = logging.getLogger(__name__)


def _region(config: Config) -> str:
    return config.cluster.region or config.aws.region


#: Assumed-role sessions by (role, external id, region, endpoint): reused for 45 of their 60 minutes.
_ASSUMED: dict[tuple[str, str | None, str, str | None], tuple[float, Any]] = {}
_ASSUMED_FOR_S = 45 * 60.0


def aws_session(config: Config, region: str | None = None) -> Any:
    """The boto3 session every call about the cluster is made with: the process's credentials, or those
    of ``aws.role_arn`` (``sts:AssumeRole`` with ``aws.external_id``: the fleet's spoke role).

    Raises:
        FleetError: the role could not be assumed (kind ``aws``, AWS's error code).
    """
    import time

    from rightsizer.adapters.aws import shared_models_session

    region = region or _region(config)
    role = config.aws.role_arn
    if not role:
        return shared_models_session(region)
    from rightsizer.adapters.fleet_aws import assume_role_session

    key = (role, config.aws.external_id, region, config.aws.endpoint_url)
    cached = _ASSUMED.get(key)
    if cached is not None and time.monotonic() - cached[0] < _ASSUMED_FOR_S:
        return cached[1]
    session = assume_role_session(
        role, external_id=config.aws.external_id, region=region, endpoint_url=config.aws.endpoint_url
    )
    _ASSUMED[key] = (time.monotonic(), session)
    return session


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
    from rightsizer.adapters.eks_auth import (
        EksTokenSource,
        caller_identity,
        describe_cluster,
        frozen_credentials,
        write_ca_bundle,
    )

    name = str(config.cluster.name)
    region = _region(config)
    session = aws_session(config, region)
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
    """The AWS inventory (EKS, Auto Scaling, EC2) when ``cluster.name`` is set, else None; it carries the
    region's on-demand prices (:func:`build_prices`) unless ``aws.pricing_api`` is off."""
    if not config.cluster.name:
        return None
    from rightsizer.adapters.aws import AwsInventory, make_clients

    region = _region(config)
    clients = make_clients(region, endpoint_url=config.aws.endpoint_url, session=aws_session(config, region))
    return AwsInventory(clients, prices=build_prices(config) if config.aws.pricing_api else None)


def build_instance_reader(config: Config) -> NodeGroupInventory | None:
    """EC2 ``DescribeInstances`` without prices (off-hours reads restored instances' ``LaunchTime``,
    ``services.restore_timing``), when ``cluster.name`` is set."""
    if not config.cluster.name:
        return None
    from rightsizer.adapters.aws import AwsInventory, make_clients

    return AwsInventory(make_clients(_region(config), endpoint_url=config.aws.endpoint_url), prices=None)


def build_prices(config: Config) -> PriceListPrices:
    """The cluster region's on-demand prices from the AWS Price List Query API (``pricing:GetProducts``),
    cached per process (``rightsizer.adapters.pricing``), for the packaged catalog's instance types.

    The client talks to the endpoint region nearest the cluster (us-east-1, eu-central-1 or ap-south-1)
    with short timeouts and 2 attempts: an unreachable API (a private subnet without a route to it) costs
    seconds, not minutes, before the packaged prices are used.
    """
    from botocore.config import Config as BotoConfig

    from rightsizer.adapters.aws import make_client
    from rightsizer.adapters.pricing import PriceListPrices, pricing_endpoint_region
    from rightsizer.domain.catalog import load_catalog

    region = _region(config)
    quick = BotoConfig(connect_timeout=5, read_timeout=20, retries={"mode": "standard", "max_attempts": 2})
    endpoint = config.aws.pricing_endpoint_url or config.aws.endpoint_url
    client = make_client(
        "pricing", pricing_endpoint_region(region), endpoint, config=quick, session=aws_session(config)
    )
    return PriceListPrices(client, region, load_catalog().types)


def resolve_config_secret(
    config: Config, reference: str, *, field: str, environ: Mapping[str, str] | None = None
) -> str:
    """A secret reference of ``config`` resolved (``rightsizer.adapters.secrets``); the SSM or Secrets
    Manager client is built, in ``aws.region`` / ``aws.endpoint_url``, only when the reference needs it.

    Raises:
        ConfigError / PermanentError / TransientError: as ``resolve_secret``.
    """
    from rightsizer.adapters.secrets import resolve_secret

    scheme = reference.partition(":")[0]
    ssm = secretsmanager = None
    if scheme in ("ssm", "secretsmanager"):
        from rightsizer.adapters.aws import shared_models_session

        session = shared_models_session(config.aws.region)
        if scheme == "ssm":
            ssm = session.client("ssm", endpoint_url=config.aws.endpoint_url)
        else:
            secretsmanager = session.client("secretsmanager", endpoint_url=config.aws.endpoint_url)
    return resolve_secret(reference, ssm=ssm, secretsmanager=secretsmanager, environ=environ, field=field)


def _resolve_secret(config: Config) -> str | None:
    """``prometheus.secret`` resolved, or None when there is none."""
    reference = config.prometheus.secret
    return None if reference is None else resolve_config_secret(config, reference, field="prometheus.secret")


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
        credentials = aws_session(config, config.aws.region).get_credentials()
        if credentials is not None:  # resolved now anyway: SigV4 signs every query with them
            frozen = credentials.get_frozen_credentials()
            register_secret(frozen.secret_key)
            register_secret(frozen.token)
    return build_client(
        prom.url,
        auth=prom.auth,
        secret=_resolve_secret(config),
        username=prom.username,
        credentials=credentials,
        region=prom.sigv4_region or config.aws.region,
        timeout=float(prom.timeout),
        ca_bundle=prom.ca_bundle,
        compression=prom.compression,
    )


def decode_live_documents(documents: Mapping[str, Any]) -> ClusterSnapshot:
    """A live observation's documents decoded as ``load_snapshot`` decodes a written directory
    (``adapters.snapshot_dir.snapshot_from_documents``), without touching the disk.

    Raises:
        SnapshotError: a document does not match its schema (names the document and the field).
    """
    from rightsizer.adapters.snapshot_dir import snapshot_from_documents

    return snapshot_from_documents(documents, root=Path("<live>"))


def live_observers(
    cluster: ClusterReader, inventory: NodeGroupInventory | None, metrics: PrometheusClient
) -> Observers:
    """The live observation's collaborators (``services.observe.Observers``) around these ports:
    ``metrics`` serves as the snapshot's ``MetricsRangeReader`` and, bound, as ``collect_live``'s client;
    the decoders are the snapshot directory's (``adapters.snapshot_dir``)."""
    from rightsizer.adapters.prometheus import collect_live
    from rightsizer.adapters.snapshot_dir import decode_xid_document

    return Observers(
        cluster=cluster,
        inventory=inventory,
        metrics=metrics,
        collect=functools.partial(collect_live, metrics),
        decode=decode_live_documents,
        decode_xids=decode_xid_document,
    )


def build_observers(config: Config, *, page_size: int = 500) -> Observers:
    """All read-side ports for ``config`` (see the ``build_*`` functions for what each needs)."""
    return live_observers(
        build_cluster_reader(config, page_size=page_size),
        build_inventory(config),
        build_metrics_reader(config),
    )


# --------------------------------------------------------------------------------------------------
# Act side (Lambda handlers, "Serverless"): state, cluster writer, node scaler, assessor, workflow
# --------------------------------------------------------------------------------------------------


def _aws_client(config: Config, service: str) -> Any:
    """A boto3 client for ``service`` in the config's region (``rightsizer.adapters.aws.make_client``)."""
    from rightsizer.adapters.aws import make_client

    return make_client(service, _region(config), config.aws.endpoint_url)


def _state_table(config: Config, purpose: str) -> tuple[str, str]:
    """(``aws.table``, cluster name) of the state table's stores; ConfigError naming ``aws.table`` when unset."""
    if not config.aws.table:
        raise ConfigError(f"a state table is required to {purpose}", field="aws.table")
    return config.aws.table, str(config.cluster.name or config.cluster.context)


def build_state(config: Config) -> StateStore:
    """The DynamoDB state store (``aws.table``) bound to the cluster (``rightsizer.adapters.dynamodb_state``).

    Raises:
        ConfigError: no ``aws.table`` configured.
    """
    from rightsizer.adapters.dynamodb_state import DynamoDbState

    table, cluster = _state_table(config, "act")
    return DynamoDbState(_aws_client(config, "dynamodb"), table, cluster)


def build_workload_saves(config: Config) -> WorkloadSaves:
    """The saved states of workloads scaled to zero (issue 32): the state table ``aws.table`` when set,
    else in memory (``serve`` and the demo without a table; ``rightsizer.adapters.workload_saves``)."""
    from rightsizer.adapters.workload_saves import DynamoWorkloadSaves, MemoryWorkloadSaves

    if not config.aws.table:
        return MemoryWorkloadSaves()
    table, cluster = _state_table(config, "save workloads")
    return DynamoWorkloadSaves(_aws_client(config, "dynamodb"), table, cluster)


def build_local_state(config: Config) -> StateStore:
    """The state store of ``rightsizer serve``: the DynamoDB table ``aws.table`` when set (shared with a
    deployment), else in memory (``rightsizer.adapters.memory_state``: leases live as long as the process)."""
    if config.aws.table:
        return build_state(config)
    from rightsizer.adapters.memory_state import MemoryState

    return MemoryState(config.cluster.name or config.cluster.context or "local")


def build_plan_history(config: Config) -> PlanHistory:
    """The decision records' store: the latest assessments of the cluster in the state table
    (``rightsizer.adapters.dynamodb_plans``).

    Raises:
        ConfigError: no ``aws.table`` configured.
    """
    from rightsizer.adapters.dynamodb_plans import DynamoDbPlans

    table, cluster = _state_table(config, "keep decision records")
    return DynamoDbPlans(_aws_client(config, "dynamodb"), table, cluster)


def build_approvals(config: Config) -> ApprovalStore:
    """Approval requests and snoozes (``rightsizer.adapters.dynamodb_approvals``); in memory without a table
    (``serve``: they live as long as the process)."""
    cluster = str(config.cluster.name or config.cluster.context or "local")
    if not config.aws.table:
        from rightsizer.adapters.memory_state import MemoryApprovals

        return MemoryApprovals()
    from rightsizer.adapters.dynamodb_approvals import DynamoDbApprovals

    return DynamoDbApprovals(_aws_client(config, "dynamodb"), config.aws.table, cluster)


def build_task_callback(config: Config) -> TaskCallback:
    """Step Functions callbacks that wake a drain waiting for approval (``StepFunctionsCallback``)."""
    from rightsizer.adapters.stepfunctions import StepFunctionsCallback

    return StepFunctionsCallback(_aws_client(config, "stepfunctions"))


def caller_arn(config: Config) -> str:
    """The caller's principal ARN from its own credentials (``rightsizer.adapters.caller``)."""
    from rightsizer.adapters.caller import caller_arn as ask

    return ask(_aws_client(config, "sts"))


def build_approval_notifier(config: Config) -> ApprovalNotifier | None:
    """The SNS topic ``approval.topic_arn`` (``rightsizer.adapters.sns``), or None (requests are logged)."""
    if not config.approval.topic_arn:
        return None
    from rightsizer.adapters.sns import SnsNotifier

    return SnsNotifier(_aws_client(config, "sns"), config.approval.topic_arn)


def build_cluster_writer(config: Config, *, page_size: int = 500) -> ClusterWriter:
    """The Kubernetes adapter as a ``ClusterWriter``: the same class reads and writes, with one token source."""
    from rightsizer.adapters.kubernetes import KubernetesCluster

    cluster = build_cluster_reader(config, page_size=page_size)
    assert isinstance(cluster, KubernetesCluster)  # build_cluster_reader builds nothing else
    return cluster


def build_assessor(
    config: Config,
    policy: Policy,
    observers: Observers | Callable[[], Observers],
    *,
    range_metrics: MetricsRangeReader | None = None,
    snoozes: SnoozeReader | None = None,
    leases: LeaseStore | None = None,
) -> PlanningAssessor:
    """The ``Assessor`` of the drain's validate/revalidate steps: a fresh plan of the one node asked about
    (``services.observe.observe_node_live``), whose cost does not grow with the cluster; ``snoozes`` protect nodes
    people snoozed, ``leases`` the node groups being replaced or settling. ``observers`` may be a function
    that builds them: called by the first assessment (a drain's Start task never observes, issue 33)."""
    from rightsizer.services.assess import PlanningAssessor
    from rightsizer.services.observe import observe_node_live

    return PlanningAssessor(
        None,
        policy,
        node_label=config.prometheus.node_label,
        snoozes=snoozes,
        leases=leases,
        observe_node=lambda node, now: observe_node_live(
            config,
            policy,
            observers if isinstance(observers, Observers) else observers(),
            node,
            now,
            range_metrics=range_metrics,
        ),
    )


def build_workflow_starter(config: Config, state_machine_arn: str | None) -> WorkflowStarter:
    """The Step Functions ``WorkflowStarter`` (``states:StartExecution``) of the drain state machine.

    Raises:
        ConfigError: no state machine ARN (``RIGHTSIZER_STATE_MACHINE_ARN``): fail closed at cold start
            rather than accept work that cannot be acted on.
    """
    from rightsizer.adapters.stepfunctions import StepFunctionsStarter

    if not state_machine_arn:
        raise ConfigError("the drain state machine is required", field="RIGHTSIZER_STATE_MACHINE_ARN")
    return StepFunctionsStarter(_aws_client(config, "stepfunctions"), state_machine_arn)


def build_instance_type_changer(config: Config) -> InstanceTypeChanger:
    """The EC2 calls of a standalone instance's type change (``rightsizer.adapters.ec2_resize.Ec2Resizer``)."""
    from rightsizer.adapters.ec2_resize import Ec2Resizer

    return Ec2Resizer(_aws_client(config, "ec2"), _aws_client(config, "autoscaling"))


def build_nodegroup_replacer(config: Config) -> NodeGroupReplacer:
    """The EKS calls of a node group replacement (``rightsizer.adapters.eks_nodegroups.EksNodeGroups``); a
    group busy updating is retried by the workflow's step, not waited for inside one invocation."""
    from rightsizer.adapters.eks_nodegroups import EksNodeGroups

    return EksNodeGroups(_aws_client(config, "eks"), max_attempts=2, delay_s=5.0)


def build_warm_pools(config: Config) -> WarmPoolPort:
    """EKS warm pools of managed node groups (``rightsizer.adapters.warm_pools.WarmPools``)."""
    from rightsizer.adapters.warm_pools import WarmPools

    return WarmPools(_aws_client(config, "eks"), _aws_client(config, "autoscaling"))


def build_launch_templates(config: Config) -> LaunchTemplateVersions:
    """EC2 launch template versions of a node group replacement (``rightsizer.adapters.launch_templates``)."""
    from rightsizer.adapters.launch_templates import LaunchTemplates

    return LaunchTemplates(_aws_client(config, "ec2"))


def build_node_scaler(config: Config) -> NodeScaler:
    """The Auto Scaling ``NodeScaler`` (``rightsizer.adapters.autoscaling``): membership, sizes, targeted
    scale-in, scaling activities."""
    from rightsizer.adapters.autoscaling import AutoScalingGroups

    return AutoScalingGroups(_aws_client(config, "autoscaling"))


def build_nodegroup_sizer(config: Config) -> NodeGroupSizer:
    """The EKS managed node group sizer of off-hours (``rightsizer.adapters.eks_nodegroups``)."""
    from rightsizer.adapters.eks_nodegroups import EksNodeGroups

    return EksNodeGroups(_aws_client(config, "eks"))

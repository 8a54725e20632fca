"""The composition root: one :class:`Runtime` per process and mode builds every use case from its builders.

Every entry point asks it for what it needs — the four Lambda handlers (:func:`lambda_runtime`), every CLI
command, ``rightsizer serve`` and the demo — so SDK clients, adapters and services are put together in one
place (docs/architecture.md §6 "Composition"). Parts (Kubernetes adapter, AWS clients, Prometheus client,
state store) are built once, on first use, and reused; use cases (assessment, off-hours, drain workflow,
webhook intake) are assembled per call around the *current* policy, so a policy change reaches a warm
Lambda after the provider's ``max_age``.

Modes choose how drains start (``starter``): ``lambda`` — the Step Functions drain state machine;
``cli`` and ``demo`` — in this process, in the foreground; ``serve`` — in this process, in background
threads, so the webhook answers at once.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal, cast

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.ports import (
    ClusterReader,
    ClusterWriter,
    InstanceTypeChanger,
    LaunchTemplateVersions,
    NodeGroupInventory,
    NodeGroupReplacer,
    NodeGroupSizer,
    NodeScaler,
    WorkflowStarter,
    WorkloadWriter,
)
from rightsizer.services import observe as live
from rightsizer.services.observe import Observers
from rightsizer.state import ApprovalStore, LeaseStore, PlanHistory, StateStore
from rightsizer.wiring import builders, intake
from rightsizer.wiring.settings import (
    DeploymentSettings,
    PolicyProvider,
    deployment_config,
    parse_policy_text,
)

if TYPE_CHECKING:
    from rightsizer.domain.plan import Plan
    from rightsizer.ports import MetricsRangeReader
    from rightsizer.services.approval import ApprovalDesk, ApprovalGate
    from rightsizer.services.assess import AssessmentDeps
    from rightsizer.services.drain import DrainDeps, StepResult
    from rightsizer.services.offhours import OffhoursDeps
    from rightsizer.services.runner import InProcessRunner
    from rightsizer.services.webhook import DuplicateGuard, WebhookIntake
    from rightsizer.services.workflow.executor import Executor
    from rightsizer.services.workloads import WorkloadScaler

__all__ = [
    "CONFIG_ENV",
    "Mode",
    "Runtime",
    "clear_lambda_runtime",
    "lambda_runtime",
    "policy_provider",
    "webhook_intake_from_env",
]

#: The AWS actions this module calls itself: the policy parameter (``PolicyParameterName``, SSM).
IAM_ACTIONS: Final = frozenset({"ssm:GetParameter"})

log = logging.getLogger("rightsizer")

#: Where the runtime runs; decides how drains are started and which state store is used.
Mode = Literal["lambda", "cli", "serve", "demo"]

Progress = Callable[["StepResult"], None]


def _log_progress(result: StepResult) -> None:
    log.info(
        "%s %s: %s -> %s %s",
        result.kind or "workflow",
        result.execution_id,
        result.step,
        result.next_step or result.status,
        result.message,
    )


class Runtime:
    """Everything one process needs for one cluster, built lazily from ``config``.

    Args:
        config: the validated configuration (its ``policy`` is used unless ``policy`` is given).
        mode: ``lambda``, ``cli``, ``serve`` or ``demo`` (see the module docstring).
        dry_run: the caller's switch (template parameter ``DryRun``; the CLI's missing ``--execute``); the
            policy's ``dry_run`` must also be false for anything to be touched.
        policy: where the policy comes from (default: ``config.policy``, fixed).
        state_machine_arn: the drain state machine (mode ``lambda``).
        metrics: a snapshot-form metrics source instead of live Prometheus aggregation (the demo).
        progress: called after every in-process drain step (default: logged).
        state: a state store to use instead of building one (``serve`` shares the caller's).
    """

    def __init__(
        self,
        config: Config,
        mode: Mode,
        *,
        dry_run: bool = True,
        policy: PolicyProvider | None = None,
        state_machine_arn: str | None = None,
        metrics: MetricsRangeReader | None = None,
        progress: Progress | None = None,
        state: StateStore | None = None,
    ) -> None:
        self._config = config
        self.mode: Mode = mode
        self.dry_run = dry_run
        self._policy = policy or PolicyProvider.fixed(config.policy)
        self.state_machine_arn = state_machine_arn
        self._range_metrics = metrics
        self._progress: Progress = progress or _log_progress
        if state is not None:
            self.__dict__["state"] = state  # the cached_property's slot: use the caller's store
        self._tick_lock = threading.Lock()
        self._tick: tuple[datetime, Policy, ClusterSnapshot] | None = None
        #: Live observations made (one per tick on the off-hours and assessment paths; a test counts).
        self.observations = 0

    # ------------------------------------------------------------------------------------------ inputs

    @property
    def config(self) -> Config:
        """The configuration with the current policy."""
        policy = self.policy()
        if policy is self._config.policy:
            return self._config
        return self._config.model_copy(update={"policy": policy})

    def policy(self) -> Policy:
        """The current policy (re-read from its source after the provider's ``max_age``)."""
        return self._policy.get()

    @property
    def cluster_name(self) -> str:
        """The EKS cluster name, else the kubeconfig context."""
        return str(self._config.cluster.name or self._config.cluster.context or "local")

    def effective_dry_run(self, policy: Policy | None = None) -> bool:
        """True unless both the caller's switch and the policy allow acting."""
        return self.dry_run or (policy or self.policy()).dry_run

    # ---------------------------------------------------------------------------------------- builders

    @functools.cached_property
    def cluster(self) -> ClusterWriter:
        """The Kubernetes adapter (reads and writes; one token source)."""
        return builders.build_cluster_writer(self._config)

    @functools.cached_property
    def observers(self) -> Observers:
        """The read side: the Kubernetes adapter, the AWS inventory and the Prometheus client."""
        return builders.live_observers(
            cast(ClusterReader, self.cluster), self.inventory, builders.build_metrics_reader(self._config)
        )

    @functools.cached_property
    def inventory(self) -> NodeGroupInventory | None:
        """The AWS inventory (EKS, Auto Scaling, EC2) when ``cluster.name`` is set."""
        return builders.build_inventory(self._config)

    @functools.cached_property
    def scaler(self) -> NodeScaler:
        """The Auto Scaling node scaler of the drain's remove step."""
        return builders.build_node_scaler(self._config)

    @functools.cached_property
    def nodegroups(self) -> NodeGroupSizer:
        """The EKS managed node group sizer of off-hours (sizes are read from the Auto Scaling group,
        :attr:`scaler`)."""
        return builders.build_nodegroup_sizer(self._config)

    @functools.cached_property
    def state(self) -> StateStore:
        """The state store: DynamoDB ``aws.table``; ``serve`` without a table keeps it in memory.

        Raises:
            ConfigError: no ``aws.table`` (every mode but ``serve``).
        """
        if self.mode == "serve":
            return builders.build_local_state(self._config)
        state = builders.build_state(self._config)
        if not self._config.approval.notify_actions:
            return state
        # every completed or rolled-back action announced on the alarm topic (services.notices, opt-in)
        from rightsizer.services.notices import notifying

        return notifying(
            state, builders.build_approval_notifier(self._config), self._config.cluster.name or ""
        )

    @functools.cached_property
    def plans(self) -> PlanHistory:
        """Where assessments keep their decision records (the state table; ``serve`` keeps none).

        Raises:
            ConfigError: no ``aws.table``.
        """
        return builders.build_plan_history(self._config)

    @functools.cached_property
    def approvals(self) -> ApprovalStore:
        """Approval requests and snoozes (the state table; in memory without one)."""
        return builders.build_approvals(self._config)

    @functools.cached_property
    def approval_gate(self) -> ApprovalGate:
        """The drain's side of approval: the store, the SNS topic, links signed with the approval-link key
        (its own secret, re-read every few minutes; ``serve`` and the demo, which verify their own links,
        use a key of this process; without one, requests carry no links and are decided from the CLI)."""
        from rightsizer.services.approval import ApprovalGate

        try:
            key = intake.approval_key_source(self._config, process_key=self._verifies_own_links)
        except ConfigError as exc:
            log.warning("approval requests carry no links: %s", exc)
            key = None
        if key is None:
            log.info(
                "approval requests carry no links: no approval.key_secret (RIGHTSIZER_APPROVAL_KEY_SECRET)"
            )
        return ApprovalGate(
            cluster=self.cluster_name,
            store=self.approvals,
            notifier=builders.build_approval_notifier(self._config),
            key=key,
            base_url=self._config.approval.url,
        )

    def approval_desk(self) -> ApprovalDesk:
        """Decisions with the caller's AWS credentials (``rightsizer approve|reject|snooze``): the store and
        Step Functions callbacks; no link key (the CLI is authenticated by IAM, not by a link)."""
        from rightsizer.services.approval import ApprovalDesk

        callback = builders.build_task_callback(self._config) if self._config.aws.table else None
        return ApprovalDesk(cluster=self.cluster_name, store=self.approvals, callback=callback)

    def caller_arn(self) -> str:
        """The ARN of the AWS principal running this process (STS ``GetCallerIdentity``): who decides
        from the CLI (``rightsizer.adapters.caller``)."""
        return builders.caller_arn(self._config)

    @functools.cached_property
    def _step_functions(self) -> WorkflowStarter:
        return builders.build_workflow_starter(self._config, self.state_machine_arn)

    # ------------------------------------------------------------------------------------- observation

    def observe_fresh(self, at: datetime, *, floor: bool = True) -> ClusterSnapshot:
        """A new observation of the cluster at ``at`` (the drain's validate and revalidate steps); live, it
        is floored to the query step unless ``floor`` is false (``rightsizer plan --at``)."""
        self.observations += 1
        if self._range_metrics is None:
            return live.observe_live(self._config, self.policy(), self.observers, at, floor=floor)
        from rightsizer.services.snapshot import observe

        request = live.observe_request(self._config, self.policy(), at)
        # The demo's lists are read as the live plan reads them: page by page, projected (issue 11 item 7).
        observation = observe(
            cast(ClusterReader, self.cluster), self.inventory, self._range_metrics, request, project=True
        )
        return live.snapshot_from_observation(observation, builders.decode_live_documents)

    def observe(self, at: datetime) -> ClusterSnapshot:
        """The tick's observation at ``at``: observed once per instant and policy, then reused — one tick of
        the assessment or of off-hours asks about every node at the same instant."""
        policy = self.policy()
        with self._tick_lock:
            if self._tick is not None and self._tick[0] == at and self._tick[1] is policy:
                return self._tick[2]
        snapshot = self.observe_fresh(at)
        with self._tick_lock:
            self._tick = (at, policy, snapshot)
        return snapshot

    # --------------------------------------------------------------------------------------- use cases

    def drain_deps(self, policy: Policy | None = None) -> DrainDeps:
        """The drain workflow's ports around ``policy`` (default: the current one); validate and revalidate
        always observe afresh, and only the node they judge (``services.observe.observe_node_live``)."""
        from rightsizer.services.drain import DrainDeps

        if not self._config.cluster.name:
            raise ConfigError("acting needs the EKS cluster name", field="cluster.name")
        policy = policy or self.policy()
        assessor = builders.build_assessor(
            self._config,
            policy,
            lambda: self.observers,  # built by the first validate, not by a Start task (issue 33)
            range_metrics=self._range_metrics,
            snoozes=self.approvals,
            leases=self.state,
        )
        asks = policy.approval == "required" or "required" in policy.approval_node_groups.values()
        return DrainDeps(
            cluster=self.cluster,
            scaler=self.scaler,
            assessor=assessor,
            state=self.state,
            policy=policy,
            dry_run=self.effective_dry_run(policy),
            approvals=self.approval_gate if asks else None,
        )

    @functools.cached_property
    def instance_type_changer(self) -> InstanceTypeChanger:
        """The EC2 calls of a standalone instance's type change (the resize workflow)."""
        return builders.build_instance_type_changer(self._config)

    @functools.cached_property
    def nodegroup_replacer(self) -> NodeGroupReplacer:
        """The EKS calls of a managed node group replacement."""
        return builders.build_nodegroup_replacer(self._config)

    @functools.cached_property
    def launch_templates(self) -> LaunchTemplateVersions:
        """The EC2 launch template calls of a managed node group replacement."""
        return builders.build_launch_templates(self._config)

    def drain_workflow(self) -> Executor:
        """The drain workflow — drains, resizes of opted-in standalone instances and replacements of opted-in
        managed node groups — (one per call, around the current policy)."""
        from rightsizer.domain.planner import plan
        from rightsizer.services.consolidate import ConsolidateWorkflow
        from rightsizer.services.replace import known_replacements

        deps = self.drain_deps()
        node_label = self._config.prometheus.node_label

        def fresh_plan(at: datetime, *, ignore: str | None = None) -> Plan:
            known = known_replacements(self.state, at, ignore=ignore)
            return plan(self.observe_fresh(at), deps.policy, at, node_label=node_label, replacements=known)

        return ConsolidateWorkflow(
            deps,
            self.instance_type_changer,
            self.nodegroup_replacer,
            self.launch_templates,
            fresh_plan,
            observe_cluster=self.observe_fresh,  # a consolidation's placement check before evicting
        )

    def runner(self, *, background: bool | None = None, max_wait_s: float | None = None) -> InProcessRunner:
        """An in-process drain starter (``serve`` runs drains in background threads); ``max_wait_s`` caps each
        wait between steps (the demo polls its loopback servers faster; every step is idempotent)."""
        import time

        from rightsizer.services.runner import InProcessRunner

        background = self.mode == "serve" if background is None else background

        def sleep(seconds: float) -> None:
            time.sleep(seconds if max_wait_s is None else min(seconds, max_wait_s))

        return InProcessRunner(
            self.drain_workflow(), background=background, progress=self._progress, sleep=sleep
        )

    def starter(self) -> WorkflowStarter:
        """How drains start in this mode: the Step Functions state machine (``lambda``), else in process.

        Raises:
            ConfigError: mode ``lambda`` without a state machine ARN.
        """
        if self.mode == "lambda":
            return self._step_functions
        return self.runner()

    def workload_scaler(self, *, by: str = "cli") -> WorkloadScaler:
        """Workload scale-to-zero and restore (issue 32) with the Kubernetes adapter and the saved states
        of the state table; a dry run unless :meth:`effective_dry_run` allows acting."""
        from rightsizer.services.workloads import WorkloadScaler

        return WorkloadScaler(
            cast(WorkloadWriter, self.cluster),
            builders.build_workload_saves(self._config),
            dry_run=self.effective_dry_run(),
            by=by,
        )

    def assessment(self, starter: WorkflowStarter | None = None) -> AssessmentDeps:
        """The scheduled assessment's ports (``starter`` default: :meth:`starter`); in process (CLI
        ``apply``) also the workload scaler, for a policy with ``workloads.scale_to_zero``."""
        from rightsizer.services.assess import AssessmentDeps

        return AssessmentDeps(
            cluster_name=self._config.cluster.name or "",
            observe=self.observe,
            policy=self.policy(),
            cluster=self.cluster,
            state=self.state,
            starter=starter or self.starter(),
            node_label=self._config.prometheus.node_label,
            plans=self.plans if self.mode != "serve" else None,
            snoozes=self.approvals,
            workloads=self.workload_scaler() if self.mode == "cli" else None,
        )

    def offhours(self, *, can_drain: bool = True) -> OffhoursDeps:
        """The off-hours tick's ports: the node group adapter, the tick's observation (once per tick) for
        the group pre-check, and drains through :meth:`starter` (in process also forced ones).

        Raises:
            ConfigError: no ``cluster.name`` (node groups are EKS's).
        """
        from rightsizer.services.assess import PlanningAssessor
        from rightsizer.services.offhours import OffhoursDeps, in_process_starters

        if not self._config.cluster.name:
            raise ConfigError("off-hours needs the EKS cluster name", field="cluster.name")
        policy = self.policy()
        normal: WorkflowStarter | None = None
        forced: WorkflowStarter | None = None
        if can_drain and self.mode == "lambda":
            normal = self._step_functions
        elif can_drain:
            normal, forced = in_process_starters(self.drain_deps(policy), progress=self._progress)
        return OffhoursDeps(
            cluster=self._config.cluster.name,
            config=self._config.offhours,
            policy=policy,
            nodes=cast(ClusterReader, self.cluster),
            sizer=self.nodegroups,
            scaler=self.scaler,
            # Snoozes are the decision's facts (read once per tick), not a reason of each assessment; the
            # node group replacements running or settling are (their nodes are protected, the group skipped).
            assessor=PlanningAssessor(
                self.observe, policy, node_label=self._config.prometheus.node_label, leases=self.state
            ),
            state=self.state,
            starter=normal,
            forced_starter=forced,
            dry_run=self.effective_dry_run(policy),
            snoozes=self.approvals,
            pods=self.cluster,
            instances=builders.build_instance_reader(self._config),
        )

    def webhook_intake(
        self,
        *,
        starter: WorkflowStarter | None = None,
        leases: LeaseStore | None = None,
        guard: DuplicateGuard | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> WebhookIntake:
        """The webhook intake: token, leases and de-duplication (``serve``: on this runtime's state store,
        de-duplication in memory without a table), drains through :meth:`starter`.

        Raises:
            ConfigError: no token, no state table (Lambda), or no state machine (Lambda).
        """
        if self.mode == "serve":
            from rightsizer.services.webhook import MemoryDuplicateGuard

            intake.webhook_token(self._config, environ)  # fail closed before building anything else
            leases = leases if leases is not None else self.state
            if guard is None and not self._config.aws.table:
                guard = MemoryDuplicateGuard()
        return intake.build_intake(
            self.config,
            starter=starter or self.starter(),
            leases=leases,
            guard=guard,
            environ=environ,
            approval_store=self.approvals,
            link_key=intake.approval_key_source(self._config, environ, process_key=self._verifies_own_links),
        )

    @property
    def _verifies_own_links(self) -> bool:
        """``serve`` and the demo sign and verify approval links in one process."""
        return self.mode in ("serve", "demo")


# --------------------------------------------------------------------------------------------------
# Lambda: one runtime per deployment settings, kept warm
# --------------------------------------------------------------------------------------------------


def _ssm_policy_loader(settings: DeploymentSettings) -> Callable[[], Policy]:
    """Reads ``settings.policy_parameter`` through one long-lived SSM client (decrypted)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from rightsizer.adapters.aws import shared_models_session

    name = str(settings.policy_parameter)
    client = shared_models_session(settings.region).client("ssm", endpoint_url=settings.aws_endpoint_url)

    def load() -> Policy:
        try:
            text = client.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
        except (ClientError, BotoCoreError) as exc:
            raise ConfigError(
                f"cannot read SSM parameter {name}: {exc}", field="PolicyParameterName"
            ) from exc
        return parse_policy_text(text, source=f"ssm:{name}")

    return load


def policy_provider(settings: DeploymentSettings) -> PolicyProvider:
    """The deployment's policy: the SSM parameter when one is named (re-read after ``policy_max_age``),
    else the inline text (fixed)."""
    if settings.policy_parameter:
        return PolicyProvider(_ssm_policy_loader(settings), max_age=settings.policy_max_age)
    return PolicyProvider.fixed(parse_policy_text(settings.policy_inline, source="RIGHTSIZER_POLICY_INLINE"))


@functools.lru_cache(maxsize=4)
def _runtime_for(settings: DeploymentSettings) -> Runtime:
    provider = policy_provider(settings)
    config = deployment_config(settings, provider.get())
    return Runtime(
        config,
        "lambda",
        dry_run=settings.dry_run,
        policy=provider,
        state_machine_arn=settings.state_machine_arn,
    )


def lambda_runtime() -> Runtime:
    """The warm Lambda's runtime for the current environment (``RIGHTSIZER_*``): built at the first
    invocation, reused while the settings stay the same.

    Raises:
        ConfigError: a missing or invalid variable, an unreadable or invalid policy (names the source).
    """
    return _runtime_for(DeploymentSettings.from_env())


def clear_lambda_runtime() -> None:
    """Forget the warm runtime (tests switch endpoints and settings between cases)."""
    _runtime_for.cache_clear()


#: A config file instead of the template's ``RIGHTSIZER_*`` variables (the webhook handler, tests).
CONFIG_ENV = "RIGHTSIZER_CONFIG"


def webhook_intake_from_env() -> WebhookIntake:
    """The deployed webhook's intake, built at cold start: the config file ``RIGHTSIZER_CONFIG`` plus
    ``RIGHTSIZER_STATE_MACHINE_ARN``, else the template's ``RIGHTSIZER_*`` variables (:func:`lambda_runtime`).

    Raises:
        ConfigError: an invalid config or environment, no token, no state table, no state machine.
    """
    import os

    if CONFIG_ENV in os.environ:
        from rightsizer.config import load_config

        runtime = Runtime(
            load_config(os.environ[CONFIG_ENV]),
            "lambda",
            state_machine_arn=os.environ.get("RIGHTSIZER_STATE_MACHINE_ARN"),
        )
        return runtime.webhook_intake()
    return lambda_runtime().webhook_intake()

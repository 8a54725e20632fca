"""``rightsizer demo``: the whole loop on the embedded default (docs/architecture.md §7), loopback only.

Starts the demo environment (moto server, the Kubernetes API double whose nodes follow moto's EC2 state,
snapshot-form DCGM metrics), then runs the code paths the Lambda functions run, wired to those servers:

1. the scheduled assessment (``run_assessment``): heal, plan, one drain per ``scale_in``;
2. the drain workflow through the in-process runner with live progress (validate → cordon → revalidate →
   evict → wait → remove → verify), ending in a targeted scale-in on moto;
3. the resize workflow of the opted-in standalone instance (the drain's steps, then stop → set the type →
   start → Node Ready with the new type's GPUs → uncordon), the instance's type read back from EC2;
   the replacement of the opted-in managed node group ``gpu-a10g-serve`` (two underutilized g5.12xlarge
   nodes the demo adds, ``rightsizer.testing.demo_replace``) by a g5.xlarge group: create it, wait for its
   GPUs, drain the old nodes one budget at a time, scale the old group to 0, read back from EKS;
4. node group sizes before and after (read from the Auto Scaling group), the ledger entries, the savings;
5. an off-hours down/up cycle on the ``gpu-dev`` node group, showing the exact restore.

It acts only on the moto endpoint it started itself and refuses any other.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from rightsizer.config import OffhoursConfig, OffhoursGroup
from rightsizer.domain.catalog import HOURS_PER_MONTH
from rightsizer.domain.periods import Period
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.ports import ScalingGroup
from rightsizer.render import render_plan, render_status

DEV_GROUP = "gpu-dev"


def _hhmm(t: datetime) -> str:
    return t.strftime("%H:%M")


def run_demo(*, json_output: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the demo; prints the story on ``out`` (or one JSON document with ``json_output``), progress on
    ``err``. Returns the exit code (0 when the loop removed the idle node and restored the dev group).

    Raises:
        ValueError: the environment's AWS endpoint is not its own loopback moto server.
    """
    from rightsizer.services.assess import run_assessment
    from rightsizer.services.drain import StepResult
    from rightsizer.services.offhours import run_offhours
    from rightsizer.services.replace import KIND as REPLACE_KIND
    from rightsizer.services.resize import KIND as RESIZE_KIND
    from rightsizer.services.status import read_status
    from rightsizer.testing.demo_env import DemoEnvironment
    from rightsizer.testing.demo_replace import SERVE_GROUP, add_serving_group, replacement_templates
    from rightsizer.wiring import Runtime

    out = out or sys.stdout
    err = err or sys.stderr
    started = time.perf_counter()
    story: list[str] = []
    outcome: dict[str, Any] = {}

    def say(line: str = "") -> None:
        story.append(line)
        if not json_output:
            print(line, file=out, flush=True)

    def progress(result: StepResult) -> None:
        print(
            f"  {result.kind or 'workflow'} {result.execution_id[:24]}…  {result.step:<10} → {result.next_step or result.status:<10} {result.message}",
            file=err,
            flush=True,
        )

    with DemoEnvironment() as env:
        env.require_own_endpoint(env.endpoint_url)
        now = datetime.now(UTC).replace(microsecond=0)
        # The dev group is off for two hours around now, so the down tick happens now and the up tick later.
        offhours = OffhoursConfig(
            schedules={
                "nights": [
                    Period(
                        days=["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
                        start=_hhmm(now - timedelta(hours=1)),
                        end=_hhmm(now + timedelta(hours=1)),
                        timezone="UTC",
                    )
                ]
            },
            node_groups=[OffhoursGroup(name=DEV_GROUP, schedule="nights")],
        )
        # The standalone instance carries rightsizer.io/resize=allowed; the policy opts in to resizing it, and
        # to replacing opted-in managed node groups (the demo adds one whose every node is underutilized).
        policy = Policy(
            dry_run=False,
            allow_resize=True,
            resize_allow_instance_store_loss=True,
            allow_replace_node_group=True,
        )
        add_serving_group(env)
        assert env.syncer is not None
        env.syncer.discover = replacement_templates(env.clients, env.cluster_name)
        config = env.config(policy=policy, offhours=offhours)
        env.require_own_endpoint(config.aws.endpoint_url)
        runtime = Runtime(config, "demo", dry_run=False, metrics=env.metrics, progress=progress)
        writer, scaler, state = runtime.cluster, runtime.scaler, runtime.state
        # The plan table and the assessment both look at `now`: the runtime observes that instant once.
        # Every later call (validate, revalidate, off-hours ticks) asks for a new instant and observes afresh.
        runner = runtime.runner(max_wait_s=0.5)
        say(
            f"GPU Rightsizer demo — moto {env.endpoint_url}, Kubernetes API double {env.kube_url} (loopback only)"
        )
        say(f"environment up in {time.perf_counter() - started:.1f} s")

        # 1. the scheduled assessment: plan table, then one drain per scale_in action
        a10g_asg = env.asg_name("gpu-a10g")
        before = scaler.describe_group(a10g_asg)
        first = plan(runtime.observe(now), policy, now)
        say("")
        say("== Scheduled assessment ==")
        say(render_plan(first))
        victims = [a for a in first.actions if a.kind == "scale_in"]
        resizes = {a.node: a for a in first.actions if a.kind == "resize_instance"}
        replacements = [a for a in first.actions if a.kind == REPLACE_KIND]
        serve_before = _nodegroup_view(env, SERVE_GROUP)
        say("")
        say(
            f"== Drain, resize and replacement workflows (in-process runner; {len(victims)} drain(s), "
            f"{len(resizes)} resize(s), {len(replacements)} node group replacement(s)) =="
        )
        summary = run_assessment(runtime.assessment(starter=runner), now, "demo-tick-1")
        results = {eid: runner.results.get(eid) for eid in summary.started}
        after = scaler.describe_group(a10g_asg)
        removed: list[dict[str, str]] = []
        resized: list[dict[str, Any]] = []
        replaced: list[dict[str, Any]] = []
        for eid, result in results.items():
            record = state.load(eid)
            ok = result is not None and result.status == "succeeded"
            kind = record.details.get("kind") if record is not None else None
            is_resize = kind == RESIZE_KIND
            what = {RESIZE_KIND: "resize", REPLACE_KIND: "replacement"}.get(str(kind), "drain")
            say(
                f"{what} {eid}: {result.status if result else 'not run'} — {result.message if result else ''}"
            )
            if record is not None and kind == REPLACE_KIND:
                replaced.append(_replacement_report(env, record, ok, serve_before))
                continue
            if record is None or record.instance_id is None:
                continue
            if is_resize:
                resized.append(_resize_report(env, writer, record, ok))
            elif ok:
                removed.append({"node": record.node, "instance_id": record.instance_id, "execution_id": eid})
        env.settle()
        say("")
        say("== Node group gpu-a10g (read from its Auto Scaling group) ==")
        say(
            f"before: min {before.sizes.min} / desired {before.sizes.desired} / max {before.sizes.max}, {len(before.in_service)} instances in service"
        )
        say(
            f"after:  min {after.sizes.min} / desired {after.sizes.desired} / max {after.sizes.max}, {len(after.in_service)} instances in service"
        )
        for r in removed:
            gone = r["instance_id"] not in after.in_service and writer.get_node(r["node"]) is None
            say(f"removed {r['node']} ({r['instance_id']}): instance terminated, Node gone: {gone}")
        if resized:
            say("")
            say("== Standalone instance resized (read back from EC2 and the Node) ==")
        for r in resized:
            say(
                f"{r['node']} ({r['instance_id']}): {r['from']} -> EC2 now {r['ec2_type']} {r['ec2_state']}; Node "
                f"{r['node_type']}, Ready {r['ready']}, {r['gpus']} GPU allocatable, cordoned {r['cordoned']}"
            )
        _say_replaced(say, replaced)
        ledger = [e for eid in summary.started for e in state.entries(execution_id=eid)]
        hourly = sum(e.hourly_savings_usd or 0.0 for e in ledger if e.result == "applied")
        for e in ledger:
            say(
                f"ledger: {e.execution_id[:24]}… {e.kind} {e.node} {e.step} {e.result} {e.reason} "
                f"saves {'-' if e.hourly_savings_usd is None else f'{e.hourly_savings_usd:.3f}'} USD/h"
            )
        say(f"Saved: {hourly:,.2f} USD/hour, {hourly * HOURS_PER_MONTH:,.2f} USD/month")
        outcome["assessment"] = {
            "verdicts": summary.verdicts,
            "removed": removed,
            "node_group": {"name": "gpu-a10g", "before": _sizes(before), "after": _sizes(after)},
            "resized": resized,
            "replaced": replaced,
            "ledger": [
                {
                    "execution_id": e.execution_id,
                    "kind": e.kind,
                    "node": e.node,
                    "step": e.step,
                    "result": e.result,
                    "hourly_savings_usd": e.hourly_savings_usd,
                    "monthly_savings_usd": e.monthly_savings_usd,
                }
                for e in ledger
            ],
            "savings": {"hourly_usd": hourly, "monthly_usd": hourly * HOURS_PER_MONTH},
        }

        # 2. off-hours down/up on the dev node group
        dev_asg = env.asg_name(DEV_GROUP)
        dev_before = scaler.describe_group(dev_asg)
        off_deps = runtime.offhours()
        say("")
        say(
            f"== Off-hours on {DEV_GROUP} (schedule 'nights': {_hhmm(now - timedelta(hours=1))}-{_hhmm(now + timedelta(hours=1))} UTC) =="
        )
        say(
            f"before: min {dev_before.sizes.min} / desired {dev_before.sizes.desired} / max {dev_before.sizes.max}"
        )
        down_ticks = _converge(
            lambda: run_offhours(off_deps, datetime.now(UTC)),
            env.settle,
            done=lambda: scaler.describe_group(dev_asg).sizes.desired == 0,
        )
        dev_down = scaler.describe_group(dev_asg)
        say(
            f"down ({down_ticks} tick(s)): min {dev_down.sizes.min} / desired {dev_down.sizes.desired} / max {dev_down.sizes.max}, "
            f"saved {_saved(state, DEV_GROUP)}"
        )
        later = datetime.now(UTC) + timedelta(hours=3)
        up_ticks = _converge(
            lambda: run_offhours(off_deps, later),
            env.settle,
            done=lambda: state.get_sizes(DEV_GROUP) is None,
            pause=1.0,
        )
        dev_up = scaler.describe_group(dev_asg)
        exact = dev_up.sizes == dev_before.sizes
        say(
            f"up ({up_ticks} tick(s)): min {dev_up.sizes.min} / desired {dev_up.sizes.desired} / max {dev_up.sizes.max} — exact restore: {exact}"
        )
        outcome["offhours"] = {
            "node_group": DEV_GROUP,
            "before": _sizes(dev_before),
            "down": _sizes(dev_down),
            "up": _sizes(dev_up),
            "exact_restore": exact,
        }
        # 3. what `rightsizer status --stack` shows a deployment: read back from the same state table
        status = read_status(state, runtime.plans, datetime.now(UTC), offhours_groups=[DEV_GROUP]).to_json()
        say("")
        say("== rightsizer status (read back from the state table, as for a deployed stack) ==")
        say(render_status(status))
        outcome["decisions"] = [
            {k: r[k] for k in ("node", "verdict", "reasons", "action", "execution_id", "why_not")}
            for r in (status["plan"] or {}).get("records", [])
        ]
        outcome["duration_s"] = round(time.perf_counter() - started, 1)
        say("")
        say(f"demo finished in {outcome['duration_s']} s")
    resized_ok = len(resized) == len(resizes) and all(r["ok"] for r in resized)
    replaced_ok = len(replaced) == len(replacements) and all(r["ok"] for r in replaced)
    ok = (
        bool(removed)
        and after.sizes.desired == before.sizes.desired - len(removed)
        and exact
        and resized_ok
        and replaced_ok
    )
    outcome["ok"] = ok
    if json_output:
        out.write(json.dumps(outcome, indent=2, default=str) + "\n")
    return 0 if ok else 1


def _resize_report(env: Any, writer: Any, record: Any, ok: bool) -> dict[str, Any]:
    """The resized instance as EC2 and the Kubernetes API see it now."""
    answer = env.clients.ec2.describe_instances(InstanceIds=[record.instance_id])
    instance = answer["Reservations"][0]["Instances"][0]
    node = writer.get_node(record.node) or {}
    status = node.get("status", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    want = record.details.get("target_type")
    report = {
        "node": record.node,
        "instance_id": record.instance_id,
        "from": record.details.get("original_type"),
        "to": want,
        "status": record.status,
        "ec2_type": instance["InstanceType"],
        "ec2_state": instance["State"]["Name"],
        "node_type": node.get("metadata", {}).get("labels", {}).get("node.kubernetes.io/instance-type"),
        "ready": ready,
        "gpus": status.get("allocatable", {}).get("nvidia.com/gpu"),
        "cordoned": bool(node.get("spec", {}).get("unschedulable")),
    }
    report["ok"] = ok and report["ec2_type"] == want and report["node_type"] == want and ready
    return report


def _sizes(group: ScalingGroup) -> list[int]:
    """[min, desired, max] of an Auto Scaling group, the demo's JSON shape."""
    return [group.sizes.min, group.sizes.desired, group.sizes.max]


def _saved(state: Any, group: str) -> str:
    saved = state.get_sizes(group)
    if saved is None:
        return "nothing"
    sizes = saved.sizes
    return f"{{min {sizes.min}, desired {sizes.desired}, max {sizes.max}}}"


def _converge(
    tick: Callable[[], Any],
    settle: Callable[[], object],
    *,
    done: Callable[[], bool],
    pause: float = 0.2,
    ticks: int = 20,
) -> int:
    """Run level-triggered ticks until ``done`` (as the rate schedule would), settling the servers between."""
    for count in range(1, ticks + 1):
        tick()
        settle()
        if done():
            return count
        time.sleep(pause)
    return ticks


def _nodegroup_view(env: Any, name: str) -> str | None:
    """``min/desired/max`` of a managed node group as EKS reports it, or None when it does not exist."""
    eks = env.clients.eks
    if name not in eks.list_nodegroups(clusterName=env.cluster_name)["nodegroups"]:
        return None
    config = eks.describe_nodegroup(clusterName=env.cluster_name, nodegroupName=name)["nodegroup"][
        "scalingConfig"
    ]
    return f"{config['minSize']}/{config['desiredSize']}/{config['maxSize']}"


def _replacement_report(env: Any, record: Any, ok: bool, old_before: str | None) -> dict[str, Any]:
    """The replaced node group and its replacement as EKS and the Kubernetes API see them now."""
    env.settle()
    old, new = str(record.details.get("nodegroup")), str(record.details.get("new_nodegroup"))
    nodes = env.double.list_nodes()

    def group_of(node: dict[str, Any]) -> str:
        return str((node["metadata"].get("labels") or {}).get("eks.amazonaws.com/nodegroup", ""))

    ready = sum(
        1
        for n in nodes
        if group_of(n) == new
        and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in n["status"].get("conditions", [])
        )
        and int((n["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0") or 0) >= 1
    )
    new_view = _nodegroup_view(env, new)
    status = (
        env.clients.eks.describe_nodegroup(clusterName=env.cluster_name, nodegroupName=new)["nodegroup"][
            "status"
        ]
        if new_view
        else "absent"
    )
    cordoned = sorted(
        n["metadata"]["name"]
        for n in nodes
        if (n["metadata"].get("annotations") or {}).get("rightsizer.io/cordoned-by")
    )
    return {
        "execution_id": record.execution_id,
        "old": old,
        "new": new,
        "from": record.details.get("old_type"),
        "to": record.details.get("target_type"),
        "old_before": old_before,
        "old_after": _nodegroup_view(env, old),
        "old_kept": _nodegroup_view(env, old) is not None,
        "new_status": status,
        "new_sizes": new_view,
        "ready": ready,
        "old_nodes_left": sum(1 for n in nodes if group_of(n) == old),
        "cordoned": cordoned,
        "ok": ok
        and status == "ACTIVE"
        and _nodegroup_view(env, old) is not None
        and ready >= 1
        and not cordoned,
    }


def _say_replaced(say: Callable[[str], None], replaced: list[dict[str, Any]]) -> None:
    if replaced:
        say("")
        say("== Managed node group replaced (read back from EKS and the Kubernetes API) ==")
    for r in replaced:
        say(
            f"old {r['old']} ({r['from']}): before {r['old_before']} -> after {r['old_after']}, kept: {r['old_kept']}"
        )
        say(
            f"new {r['new']} ({r['to']}): {r['new_status']}, sizes {r['new_sizes']}; Nodes Ready with GPUs: {r['ready']}"
        )
        say(f"old Nodes left: {r['old_nodes_left']}; cordoned by us anywhere: {r['cordoned']}")

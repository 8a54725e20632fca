"""The sharded assessment at 100,000 GPU nodes (issue 33 item 3): one shard's and the merge's client CPU,
wall and peak memory, and the cost of one run in USD.

Generated answers, no servers (a 2-core machine cannot host a 100,000-node API server and TSDB):

- **One shard** (``--per-shard`` GPU nodes, default 1,000): the ``scale`` cluster of
  ``tests.support.examplegen`` (p4d.24xlarge × 8 A100 in managed node groups of 50, the DCGM series of a
  30-minute window at a 60 s step as raw samples, one dcgm-exporter pod a node and the busy nodes' GPU
  jobs) plus the per-node agents (DaemonSet pods) up to ``--pods-per-node`` (``benchmarks/k8s_objects.pod``:
  every field the API server sends, ~5-6 KB each). Deployment pods on idle GPU nodes would add the
  placement simulation's cost, which is the planner's, sharded or not (``benchmarks/placement_scale.py``). In a
  fresh process (a cold Lambda): the shard's Nodes decoded (the object ``prepare`` wrote), one pod list
  answer per node decoded (``services.shard.pods_on``: bytes → compact ``Pod``, as ``list_models``), its
  series reduced to device signals (``collect_signals``: every raw sample of the window read, an upper
  bound of the live path's per-step aggregates) and the ``ShardPartial`` encoded (the S3 body).
- **The merge**: the shard's partial copied ``--nodes / --per-shard`` times under renamed nodes, instances
  and node groups (100 distinct shards of 1,000 nodes), with every Node and the AWS inventory of all of
  them. In a fresh process, ``services.shard.merge`` itself: every partial and the Nodes decoded
  (``adapters.shard_codec``), the cluster-wide snapshot built (``snapshot_from_documents``),
  ``merge_shards``, then the scheduled assessment (``run_assessment``, the default policy) on in-memory
  state.

Cost per run (public us-east-1 prices, 2026-12): AWS Lambda x86 $0.0000166667 per GB-s and $0.20 per 1M
requests (https://aws.amazon.com/lambda/pricing/); Step Functions Standard $0.025 per 1,000 state
transitions, a Distributed Map child execution's transitions included
(https://aws.amazon.com/step-functions/pricing/); S3 Standard $0.005 per 1,000 PUT and $0.0004 per 1,000 GET
requests (https://aws.amazon.com/s3/pricing/). Billed duration = the measured CPU seconds (single-threaded
and CPU-bound: a Lambda's wall on its own vCPU; this machine's wall is inflated by its neighbours) plus
``--io-s-per-shard`` for what a shard waits on the API server and Prometheus (an assumption stated in the
output), at the template's memory sizes.

Usage: ``timeout 3600 .venv/bin/python benchmarks/shard_scale.py [--nodes 100000] [--per-shard 1000]``.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions"), str(ROOT / "benchmarks")]

#: The per-node agents a GPU node of EKS runs (DaemonSet pods: the drain leaves them, nothing to place).
AGENTS = (
    "aws-node",
    "kube-proxy",
    "ebs-csi-node",
    "nvidia-device-plugin",
    "gpu-feature-discovery",
    "node-exporter",
    "fluent-bit",
    "efa-device-plugin",
    "nvidia-dcgm",
    "cloudwatch-agent",
    "eks-pod-identity-agent",
    "secrets-store-csi",
    "falco",
    "nvidia-mig-manager",
)
LAMBDA_GB_S = 0.0000166667
LAMBDA_REQUEST = 0.20 / 1_000_000
SFN_TRANSITION = 0.025 / 1_000
S3_PUT = 0.005 / 1_000
S3_GET = 0.0004 / 1_000
#: template.yaml: ShardObserveFunction, ShardMergeFunction, ShardPrepareFunction, assess (MB).
SHARD_MB, MERGE_MB, PREPARE_MB, ASSESS_MB = 1769, 10240, 2048, 2048


def _hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _measure(fn: Any) -> dict[str, float]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    extra = fn()
    return {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0, **extra}


# ------------------------------------------------------------------------------------------ generate


def generate(work: Path, per_shard: int, pods_per_node: int) -> None:
    """One shard's cluster in ``work``: examplegen's scale scenario plus Deployment pods per node, the pod
    list answer of each node (``pods/<node>.json``)."""
    from tests.support.examplegen import generate_snapshot

    from k8s_objects import pod

    directory = generate_snapshot(work / "shard", scenario="scale", nodes=per_shard, seed=7)
    nodes = json.loads((directory / "nodes.json").read_text())["items"]
    pods = json.loads((directory / "pods.json").read_text())["items"]
    by_node: dict[str, list[Any]] = {n["metadata"]["name"]: [] for n in nodes}
    for p in pods:
        by_node.setdefault(p["spec"].get("nodeName", ""), []).append(p)
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/{}:v2.14.3"
    for i, node in enumerate(nodes):
        name = node["metadata"]["name"]
        ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        for k in range(max(0, pods_per_node - len(by_node[name]))):
            app = AGENTS[k % len(AGENTS)]
            by_node[name].append(
                pod(
                    f"{app}-{i:05d}{k}",
                    "kube-system",
                    name,
                    ip,
                    f"10.{100 + i // 250 % 100}.{i % 250}.{k + 2}",
                    app=app,
                    owner=("DaemonSet", app),
                    image=image.format(app),
                )
            )
    answers = work / "pods"
    answers.mkdir()
    for name, items in by_node.items():
        if name:
            (answers / f"{name}.json").write_text(json.dumps({"kind": "PodList", "items": items}))


# --------------------------------------------------------------------------------------------- steps


def shard_child(work: Path) -> dict[str, Any]:
    """One shard, as the observe task runs it (a fresh process)."""
    from rightsizer.adapters.kubernetes_models import ModelPages
    from rightsizer.adapters.snapshot_dir import load_snapshot
    from rightsizer.domain.join import NodeJoiner
    from rightsizer.domain.model import Node
    from rightsizer.domain.policy import Policy
    from rightsizer.domain.shard import PARTIAL_CODEC, ShardPartial
    from rightsizer.domain.usage import Window, collect_signals
    from rightsizer.gc_pause import cyclic_gc_paused
    from rightsizer.services.shard import NODES_CODEC, pods_on

    base = load_snapshot(work / "shard")  # metrics and Nodes from disk: not measured (the answers)
    node_bytes = NODES_CODEC.dump_json(list(base.nodes))
    answers = {p.stem: p.read_bytes() for p in (work / "pods").iterdir()}
    metrics, stamps = base.metrics, base.timestamps
    policy = Policy()

    class Reader:
        """``ClusterReader.list_models`` over the answers: one page a node, decoded as the adapter does."""

        def list_models(self, kind: Any, project: Any, *, field_selector: str = "") -> list[Any]:
            pages = ModelPages(kind)
            with cyclic_gc_paused():
                objects, _ = pages.page(answers[field_selector.removeprefix("spec.nodeName=")])
            pages.close()
            return [kept for obj in objects if (kept := project(obj)) is not None]

    def run() -> dict[str, float]:
        nodes = NODES_CODEC.validate_json(node_bytes)
        pods = pods_on(Reader(), [n.name for n in nodes])
        window = Window.ending(base.meta.taken_at, policy.idle_window, base.meta.step_seconds)
        signals = collect_signals(
            metrics, stamps, NodeJoiner(nodes, pods), window, policy.gpu_activity_max_pct
        )
        names = tuple(sorted(n.name for n in nodes))
        partial = ShardPartial("run", "s0000", names, tuple(pods), signals)
        body = PARTIAL_CODEC.dump_json(partial)
        (work / "partial.json").write_bytes(body)
        return {"nodes": len(nodes), "pods": len(pods), "partial_mib": len(body) / 2**20}

    assert all(isinstance(n, Node) for n in base.nodes)
    out = _measure(run)
    out["peak_mib"] = _hwm_mib()
    return out


def _renamed(data: bytes, k: int) -> bytes:
    """``data`` with every node, instance and node group name of shard ``k``'s copy."""
    data = data.replace(b".ec2.internal", f".s{k:03d}.ec2.internal".encode())
    data = data.replace(b"gpu-p4d-", f"gpu-p4d-s{k:03d}-".encode())
    return re.sub(rb"i-[0-9a-f]{3}([0-9a-f]{14})", lambda m: f"i-{k:03x}".encode() + m.group(1), data)


class DirStore:
    """The shard bucket as a directory (``services.shard.BlobStore``)."""

    def __init__(self, root: Path) -> None:
        self.bucket = str(root)
        self._root = root

    def put_bytes(self, key: str, body: bytes) -> None:
        path = self._root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)

    def get_bytes(self, key: str) -> bytes:
        return (self._root / key).read_bytes()


def build_merge_inputs(work: Path, shards: int) -> None:
    """The run's objects as the merge reads them (``services.shard`` keys: every Node, the shard list, each
    shard's partial), and the AWS inventory of all the nodes (what the merge's own reads return)."""
    from rightsizer.adapters.snapshot_dir import load_snapshot
    from rightsizer.domain.shard import SPECS_CODEC, ShardSpec
    from rightsizer.services.shard import NODES_CODEC, partial_key, run_key

    store = DirStore(work / "bucket")
    partial = (work / "partial.json").read_bytes()
    source = work / "shard"
    nodes = NODES_CODEC.dump_json(list(load_snapshot(source).nodes))
    groups = (source / "nodegroups.json").read_bytes()
    instances = (source / "instances.json").read_bytes()
    inventory: dict[str, list[Any]] = {"autoScalingGroups": [], "autoScalingInstances": [], "nodegroups": []}
    reservations: list[Any] = []
    specs, node_lists = [], []
    for k in range(shards):
        body = _renamed(partial, k).replace(b'"shard":"s0000"', f'"shard":"s{k:04d}"'.encode())
        store.put_bytes(partial_key("run", f"s{k:04d}"), body)
        specs.append(ShardSpec(id=f"s{k:04d}", nodes=tuple(json.loads(body)["nodes"])))
        node_lists.append(_renamed(nodes, k)[1:-1])
        for key, value in json.loads(_renamed(groups, k)).items():
            inventory[key] += value
        reservations += json.loads(_renamed(instances, k))["Reservations"]
    store.put_bytes(run_key("run", "shards.json"), SPECS_CODEC.dump_json(specs))
    store.put_bytes(run_key("run", "nodes.json"), b"[" + b",".join(node_lists) + b"]")
    (work / "nodegroups.json").write_text(json.dumps(inventory))
    (work / "instances.json").write_text(json.dumps({"Reservations": reservations}))


def merge_child(work: Path) -> dict[str, Any]:
    """The merge, as the merge task runs it (a fresh process): ``services.shard.merge`` — the run's objects
    (``load_run``), the cluster-wide snapshot (``snapshot_from_documents`` of the documents the merge's
    own reads return), ``merge_shards``, then the scheduled assessment (``run_assessment``: healing, the
    plan, budgets, decision records) on in-memory state with the run lock held."""
    from datetime import datetime

    from rightsizer.adapters.memory_state import MemoryState
    from rightsizer.adapters.shard_codec import RunDecoder
    from rightsizer.adapters.snapshot_dir import snapshot_from_documents
    from rightsizer.domain.model import ClusterSnapshot
    from rightsizer.domain.policy import Policy
    from rightsizer.services.assess import AssessmentDeps
    from rightsizer.services.drain import DrainRequest
    from rightsizer.services.shard import RUN_LOCK, merge
    from rightsizer.services.snapshot import kubectl_list
    from rightsizer.testing.fakes import FakeClusterWriter

    inventory = {
        name: json.loads((work / name).read_text()) for name in ("nodegroups.json", "instances.json")
    }
    meta = json.loads((work / "shard" / "snapshot.json").read_text())
    now = datetime.fromisoformat(meta["taken_at"].replace("Z", "+00:00"))

    def facts(nodes: Any, pods: Any) -> ClusterSnapshot:
        documents = {
            "snapshot.json": meta,
            "nodes.json": kubectl_list(nodes),
            "pods.json": kubectl_list(pods),
            "pdbs.json": {"items": []},
            **inventory,
        }
        return snapshot_from_documents(documents, root=work)

    class Starter:
        def start(self, request: DrainRequest) -> str:
            return request.execution_id

    state = MemoryState("bench")
    assert state.acquire(RUN_LOCK, "run", now, 3600) is not None
    deps = AssessmentDeps("bench", lambda _at: facts([], []), Policy(), FakeClusterWriter(), state, Starter())

    def run() -> dict[str, Any]:
        summary = merge("run", now, deps, DirStore(work / "bucket"), facts, RunDecoder(), lock_seconds=3600)
        return {
            "nodes": len(summary.records),
            "started": len(summary.started),
            **{f"v_{k}": v for k, v in sorted(summary.verdicts.items())},
        }

    out = _measure(run)
    out["peak_mib"] = _hwm_mib()
    return out


def _child(step: str, work: Path, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", step, "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{step} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------------------------------- cost


def cost(
    shards: int, shard: dict[str, Any], merge: dict[str, Any], io_s: float
) -> list[tuple[str, float, str]]:
    """(item, USD, basis) of one run."""
    # CPU-bound single-threaded work: on a Lambda's own vCPU its wall is its CPU time (this machine's wall
    # is inflated by whatever else runs on its two cores)
    shard_s = shard["cpu_s"] + io_s
    merge_s = merge["cpu_s"]
    prepare_s = 0.05 * shards  # a Node list and one S3 PUT per shard (not measured: Node decoding ~ merge's)
    lambda_gb_s = (
        shards * shard_s * SHARD_MB / 1024
        + merge_s * MERGE_MB / 1024
        + prepare_s * PREPARE_MB / 1024
        + 2 * ASSESS_MB / 1024
    )
    invocations = shards + 3  # the assess hand-off, prepare, shards, merge
    # parent: Prepare, the Choice, the Map, Merge, Succeed; each child: its start and ObserveShard
    transitions = 5 + 2 * shards
    puts = 2 + shards + shards + 3  # prepare (Nodes, shard list, one input per shard), partials, ResultWriter
    gets = 1 + shards + 2 + shards  # ItemReader, shard inputs, merge (Nodes, list, partials)
    return [
        ("Lambda GB-s", lambda_gb_s * LAMBDA_GB_S, f"{lambda_gb_s:,.0f} GB-s"),
        ("Lambda requests", invocations * LAMBDA_REQUEST, f"{invocations} invocations"),
        ("Step Functions", transitions * SFN_TRANSITION, f"{transitions} state transitions"),
        ("S3 requests", puts * S3_PUT + gets * S3_GET, f"{puts} PUT, {gets} GET"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=15)
    parser.add_argument("--io-s-per-shard", type=float, default=10.0)
    parser.add_argument("--child", choices=("shard", "merge"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        result = shard_child(args.work) if args.child == "shard" else merge_child(args.work)
        print(json.dumps(result))
        return 0
    shards = -(-args.nodes // args.per_shard)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate(work, args.per_shard, args.pods_per_node)
        shard = _child("shard", work, 3600)
        build_merge_inputs(work, shards)
        merge = _child("merge", work, 3600)
    rows = cost(shards, shard, merge, args.io_s_per_shard)
    total = sum(usd for _, usd, _ in rows)
    print(
        f"sharded assessment: {args.nodes:,} GPU nodes × 8 GPUs, {shards} shards of {args.per_shard:,}, "
        f"{args.pods_per_node} pods a node (max RSS of this driver {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)"
    )
    print(f"{'step':<24}{'nodes':>9}{'pods':>11}{'CPU s':>9}{'wall s':>9}{'peak MiB':>10}")
    print(
        f"{'one shard (observe)':<24}{shard['nodes']:>9,}{shard['pods']:>11,}{shard['cpu_s']:>9.1f}{shard['wall_s']:>9.1f}{shard['peak_mib']:>10.0f}"
        f"   partial {shard['partial_mib']:.1f} MiB"
    )
    print(
        f"{'all shards (sum)':<24}{shards * shard['nodes']:>9,}{shards * shard['pods']:>11,}{shards * shard['cpu_s']:>9.1f}{'':>9}{'':>10}"
        f"   {min(shards, 40)} at a time: ~{-(-shards // 40) * (shard['wall_s'] + args.io_s_per_shard):.0f} s"
    )
    print(
        f"{'merge + assessment':<24}{merge['nodes']:>9,}{shards * shard['pods']:>11,}{merge['cpu_s']:>9.1f}{merge['wall_s']:>9.1f}{merge['peak_mib']:>10.0f}"
        f"   drains started {merge['started']}, "
        + ", ".join(f"{k[2:]} {v}" for k, v in merge.items() if k.startswith("v_"))
    )
    print(
        f"\ncost of one run (us-east-1; billed = CPU s, a shard + {args.io_s_per_shard:.0f} s assumed API server/Prometheus waits)"
    )
    for item, usd, basis in rows:
        print(f"  {item:<18}${usd:>9.4f}   {basis}")
    print(
        f"  {'total':<18}${total:>9.4f}   per run; ×{24 * 12} runs a day (5 min) = ${total * 24 * 12:,.2f}/day"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The real alert chain's parts for ``tests/e2e`` and ``tests/integration/test_apply.py`` (docs/architecture.md §7).

- :func:`start_serialized_moto`: a private moto server that handles one request at a time (moto applies
  DynamoDB conditional writes without a lock; our state store relies on DynamoDB's per-item atomicity,
  and here a drain, the webhook and background reconcilers write concurrently — see
  ``tests/integration/test_state_contract.py``).
- :class:`GpuCluster`: EKS cluster ``prod-eks`` with managed node group ``gpu-a10g`` (g5.2xlarge, one
  A10G each) on moto, the state table, and the Kubernetes double holding one Node per instance (its
  ``providerID`` naming the instance), a dcgm-exporter DaemonSet pod per node, a kubeconfig for the double,
  the node group ⇄ ASG reconciler, and :class:`InstanceFollower` (a terminated instance's Node goes away
  and its exporter stops serving it, as on EKS).
- :class:`DcgmExporter`: an ``http.server`` serving dcgm-exporter text whose values move with time
  (power jitter, a climbing energy counter) per node profile ``idle`` / ``busy``, switchable at run time;
  :func:`dcgm_families` gives the same series as backfill input for :mod:`tests.support.prometheus_server`.
- :func:`write_config`: a config file (docs/architecture.md §5 "Config") for ``rightsizer apply`` / ``serve``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import boto3
import httpx
import yaml

from rightsizer.adapters.aws import AwsClients, make_clients
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.k8s.api import Placement
from rightsizer.testing.moto_eks import (
    BuiltCluster,
    MotoServer,
    NodeGroupReconciler,
    NodeGroupSpec,
    build_cluster,
    reset_moto,
)
from rightsizer.testing.periodic import Periodic
from tests.builders import gpu_node, pod
from tests.support.cluster_package import plain_files, rules_with_window

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "tests" / "e2e" / "policy.yaml"
REGION = "us-east-1"
CLUSTER = "prod-eks"
NODEGROUP = "gpu-a10g"
INSTANCE_TYPE = "g5.2xlarge"
TABLE = "rightsizer-e2e"
KUBE_CONTEXT = "e2e"
KUBE_TOKEN = "e2e-kube-token"
JOB = "gpu-operator/nvidia-dcgm-exporter"
EXPORTER_NAMESPACE = "gpu-operator"
MODEL = "NVIDIA A10G"
#: DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE of an A10G as the g5 scrape reports it (MiB).
FB_TOTAL_MIB = 22576
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}

Profile = Literal["idle", "busy"]


# --------------------------------------------------------------------------------------------------
# moto, one request at a time
# --------------------------------------------------------------------------------------------------


def _one_request_at_a_time(app: Callable[..., Any]) -> Callable[..., Any]:
    lock = threading.Lock()

    def serialised(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))  # the body may be built lazily from shared state

    return serialised


def start_serialized_moto() -> MotoServer:
    """A private ``ThreadedMotoServer`` on 127.0.0.1 (OS-chosen port) handling one request at a time.

    moto's backends are process-global: the server is reset on start (another test's resources must not
    leak in) and by :func:`stop_moto`.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    wsgi = server._server
    assert wsgi is not None
    wsgi.app = _one_request_at_a_time(wsgi.app)
    host, port = server.get_host_and_port()
    moto = MotoServer(server=server, endpoint_url=f"http://{host}:{port}")
    reset_moto(moto.endpoint_url)
    return moto


def stop_moto(moto: MotoServer) -> None:
    """Forget every resource (best effort) and stop the server."""
    with contextlib.suppress(Exception):
        reset_moto(moto.endpoint_url)
    moto.stop()


# --------------------------------------------------------------------------------------------------
# DCGM exporter
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuNode:
    """One GPU node of the cluster: Kubernetes name, EC2 instance, IPs, exporter pod, GPU UUID."""

    name: str
    instance_id: str
    ip: str
    exporter_pod: str
    exporter_ip: str
    uuid: str
    #: Serve ``node`` as the shipped scrape relabeling would add it (False: dcgm-exporter's own labels only).
    relabelled: bool = True

    def labels(self) -> dict[str, str]:
        """The series labels dcgm-exporter writes (``node`` added by the scrape relabelling on EKS;
        ``Hostname`` is the exporter pod's name, BUG-01)."""
        labels = {
            "gpu": "0",
            "UUID": self.uuid,
            "device": "nvidia0",
            "modelName": MODEL,
            "Hostname": self.exporter_pod,
            "DCGM_FI_DRIVER_VERSION": "535.183.01",
        }
        return {**labels, "node": self.name} if self.relabelled else labels


GAUGES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE")
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    ENERGY: ("counter", "Total energy consumption since boot (in mJ)."),
}


def gauge_values(profile: Profile, t: float, phase: float = 0.0) -> dict[str, float]:
    """The gauges of one A10G at Unix time ``t``: idle (0 %, driver-only framebuffer, ~27 W) or busy."""
    if profile == "idle":
        used, util, power = 312.0, 0.0, 27.0 + 1.5 * math.sin(1.7 * t + phase)
    else:
        used, util = 19456.0, float(round(85 + 10 * math.sin(0.9 * t + phase)))
        power = 190.0 + 15.0 * math.sin(1.3 * t + phase)
    return {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_FREE": FB_TOTAL_MIB - used,
        "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
    }


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def _label_text(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


class DcgmExporter:
    """dcgm-exporter's ``/metrics`` for several nodes on 127.0.0.1; every scrape reads the clock.

    ``set_profile(node, "busy")`` switches a node's values at once; ``remove(node)`` stops serving it
    (its instance is gone). ``scrapes`` counts the requests served.
    """

    def __init__(self, nodes: Sequence[GpuNode], profiles: Mapping[str, Profile]) -> None:
        self._lock = threading.Lock()
        self._nodes = {n.name: n for n in nodes}
        self._profiles: dict[str, Profile] = {n.name: profiles.get(n.name, "idle") for n in nodes}
        self._energy: dict[str, tuple[float, float]] = {n.name: (9.8e10, time.time()) for n in nodes}
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render(time.time()).encode()
                self.send_response(200 if self.path.startswith("/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1})
        self._thread.daemon = True

    @property
    def target(self) -> str:
        """``127.0.0.1:<port>`` (a Prometheus static target)."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> DcgmExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def set_profile(self, node: str, profile: Profile) -> None:
        with self._lock:
            self._profiles[node] = profile

    def remove(self, node: str) -> None:
        with self._lock:
            self._nodes.pop(node, None)

    def serves(self, node: str) -> bool:
        with self._lock:
            return node in self._nodes

    def render(self, now: float) -> str:
        """The exposition text at ``now``: gauges per profile, energy integrated from the power drawn."""
        with self._lock:
            self.scrapes += 1
            rows: dict[str, list[str]] = {name: [] for name in (*GAUGES, ENERGY)}
            for index, (name, node) in enumerate(sorted(self._nodes.items())):
                values = gauge_values(self._profiles[name], now, phase=index)
                energy, since = self._energy[name]
                energy += max(0.0, now - since) * values["DCGM_FI_DEV_POWER_USAGE"] * 1000.0
                self._energy[name] = (energy, now)
                labels = _label_text(node.labels())
                for metric in GAUGES:
                    rows[metric].append(f"{metric}{{{labels}}} {_fmt(values[metric])}")
                rows[ENERGY].append(f"{ENERGY}{{{labels}}} {int(energy)}")
        lines = []
        for metric, samples in rows.items():
            kind, text = _HELP[metric]
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", *samples]
        return "\n".join(lines) + "\n"


def dcgm_families(
    nodes: Sequence[tuple[GpuNode, Profile]], times: Sequence[float]
) -> dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]]:
    """The series per-node exporter targets (``instance`` = the exporter pod's IP and port 9400, as with
    Kubernetes service discovery) would store when scraped at ``times``, as
    ``tests.support.prometheus_server`` backfills them."""
    families: dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]] = {}
    for index, (node, profile) in enumerate(nodes):
        labels = {**node.labels(), "job": JOB, "instance": f"{node.exporter_ip}:9400"}
        samples: dict[str, list[tuple[float, float]]] = {m: [] for m in (*GAUGES, ENERGY)}
        energy = 9.8e10
        previous = times[0]
        for t in times:
            values = gauge_values(profile, t, phase=index)
            energy += (t - previous) * values["DCGM_FI_DEV_POWER_USAGE"] * 1000.0
            previous = t
            for metric in GAUGES:
                samples[metric].append((t, values[metric]))
            samples[ENERGY].append((t, float(int(energy))))
        for metric, points in samples.items():
            families.setdefault(metric, []).append((dict(labels), points))
    return families


# --------------------------------------------------------------------------------------------------
# The cluster: moto + Kubernetes double
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtraPod:
    """A workload pod to put on node number ``node_index`` (a ``tests.builders.pod`` keyword set)."""

    name: str
    node_index: int
    options: Mapping[str, Any] = field(default_factory=dict)


class InstanceFollower:
    """Makes the double and the exporter follow moto: a Node whose instance left the node group's Auto
    Scaling group or is shutting down/terminated is deleted with its pods, and its series stop."""

    def __init__(
        self, clients: AwsClients, double: KubernetesDouble, asg_name: str, exporter: DcgmExporter | None
    ) -> None:
        self._clients = clients
        self._double = double
        self._asg = asg_name
        self.exporter = exporter
        self._worker = Periodic(self.sync, "e2e-instance-follower")
        self.removed: list[str] = []
        self.errors = self._worker.errors  # kept for the test's teardown assertion

    def sync(self) -> None:
        group = self._clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self._asg])
        members = {i["InstanceId"] for g in group["AutoScalingGroups"] for i in g.get("Instances", [])}
        for node in self._double.list_nodes():
            name = str(node["metadata"]["name"])
            instance_id = str(node["spec"].get("providerID", "")).rpartition("/")[2]
            if instance_id and instance_id not in members:
                self._double.delete_node(name)
                if self.exporter is not None:
                    self.exporter.remove(name)
                self.removed.append(name)

    def start(self, interval_s: float = 0.3) -> None:
        self._worker.start(interval_s)

    def stop(self) -> None:
        self._worker.stop()


@dataclass
class GpuCluster:
    """What :func:`gpu_cluster` built; ``nodes`` in instance launch order."""

    moto: MotoServer
    clients: AwsClients
    dynamodb: Any
    built: BuiltCluster
    double: KubernetesDouble
    nodes: list[GpuNode]
    kubeconfig: Path
    reconciler: NodeGroupReconciler
    follower: InstanceFollower
    region: str = REGION

    @property
    def asg_name(self) -> str:
        return self.built.nodegroups[NODEGROUP].asg_name

    def asg(self) -> dict[str, Any]:
        """The node group's Auto Scaling group as DescribeAutoScalingGroups returns it."""
        answer = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg_name])
        group: dict[str, Any] = dict(answer["AutoScalingGroups"][0])
        return group

    def in_service(self) -> set[str]:
        return {
            str(i["InstanceId"])
            for i in self.asg().get("Instances", [])
            if i["LifecycleState"] == "InService"
        }

    def instance_state(self, instance_id: str) -> str:
        answer = self.clients.ec2.describe_instances(
            Filters=[{"Name": "instance-id", "Values": [instance_id]}]
        )
        states = [str(i["State"]["Name"]) for r in answer["Reservations"] for i in r["Instances"]]
        return states[0] if states else "unknown"

    def node(self, name: str) -> dict[str, Any] | None:
        return self.double.get_node(name)


def _node_object(node: GpuNode, created: datetime, region: str = REGION) -> dict[str, Any]:
    obj = gpu_node(
        node.name,
        instance_type=INSTANCE_TYPE,
        gpus=1,
        instance_id=node.instance_id,
        ip=node.ip,
        nodegroup=NODEGROUP,
        created=created,
        labels={
            "topology.kubernetes.io/region": region,
            "topology.kubernetes.io/zone": f"{region}a",
            "nvidia.com/gpu.product": "NVIDIA-A10G",
        },
        capacity={"cpu": "8", "memory": "32Gi"},
        allocatable={"cpu": "7910m", "memory": "29317Mi"},
    )
    obj["status"]["addresses"].append({"type": "Hostname", "address": node.name})
    return obj


def _exporter_pod(node: GpuNode) -> dict[str, Any]:
    obj = pod(node.exporter_pod, node.name, namespace=EXPORTER_NAMESPACE, pod_ip=node.exporter_ip, cpu="100m",
              memory="128Mi", labels={"app": "nvidia-dcgm-exporter"})  # fmt: skip
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-dcgm-exporter", "controller": True}
    ]
    return obj


@contextlib.contextmanager
def gpu_cluster(
    tmp: Path,
    *,
    nodes: int,
    extra_pods: Sequence[ExtraPod] = (),
    exporter: Callable[[list[GpuNode]], DcgmExporter | None] = lambda _nodes: None,
    sizes: tuple[int, int] = (1, 6),
    region: str = REGION,
    node_annotations: Mapping[int, Mapping[str, str]] | None = None,
    placement: Callable[[KubernetesDouble], Placement] | None = None,
) -> Iterator[tuple[GpuCluster, DcgmExporter | None]]:
    """Build the cluster (``nodes`` instances in ``gpu-a10g``, min/max ``sizes``) in ``region``, start its
    background workers, yield it with the exporter ``exporter(nodes)`` built (not started), and stop
    everything — whatever happens inside. ``node_annotations`` by node index; ``placement(double)``
    places the double's replacement pods (default: its ``first_fit``)."""
    stack = contextlib.ExitStack()
    with stack:
        # moto logs every request through werkzeug; a failing test's output should show the chain instead.
        werkzeug = logging.getLogger("werkzeug")
        stack.callback(werkzeug.setLevel, werkzeug.level)
        werkzeug.setLevel(logging.ERROR)
        moto = start_serialized_moto()
        stack.callback(stop_moto, moto)
        session = boto3.session.Session(
            region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
        )
        clients = make_clients(region, endpoint_url=moto.endpoint_url, session=session)
        dynamodb = session.client("dynamodb", endpoint_url=moto.endpoint_url)
        spec = NodeGroupSpec(NODEGROUP, INSTANCE_TYPE, min_size=sizes[0], desired=nodes, max_size=sizes[1])
        built = build_cluster(clients, cluster=CLUSTER, region=region, nodegroups=[spec])
        create_state_table(dynamodb, TABLE)
        ids = built.nodegroups[NODEGROUP].instance_ids
        described = clients.ec2.describe_instances(InstanceIds=list(ids))
        ips = {
            i["InstanceId"]: i["PrivateIpAddress"] for r in described["Reservations"] for i in r["Instances"]
        }
        gpu_nodes = [
            GpuNode(
                name=f"ip-{ips[iid].replace('.', '-')}.ec2.internal",
                instance_id=iid,
                ip=ips[iid],
                exporter_pod=f"nvidia-dcgm-exporter-{'bcdfgnpqrs'[k]}{'hjklmtvwxz'[k]}x7q",
                exporter_ip=f"10.0.64.{10 + k}",
                uuid=f"GPU-5b3ac1d0-7e2f-4c11-9a6b-0000000000{k:02d}",
            )
            for k, iid in enumerate(ids)
        ]
        made_double: list[KubernetesDouble] = []
        chosen: dict[str, Any] = (
            {"placement": lambda p, n, prev: placement(made_double[0])(p, n, prev)} if placement else {}
        )
        double = KubernetesDouble(seed=11, resource_api_versions=None, **chosen)
        made_double.append(double)
        created = datetime.now(UTC) - timedelta(days=2)
        for k, node in enumerate(gpu_nodes):
            obj = _node_object(node, created, region)
            obj["metadata"]["annotations"].update((node_annotations or {}).get(k, {}))
            double.add_node(obj)
            double.add_pod(_exporter_pod(node))
        for extra in extra_pods:
            double.add_pod(pod(extra.name, gpu_nodes[extra.node_index].name, **dict(extra.options)))
        double.accept_tokens(KUBE_TOKEN)
        double.start()
        stack.callback(double.stop)
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"current-context: {KUBE_CONTEXT}\n"
            f"clusters:\n- name: {KUBE_CONTEXT}\n  cluster:\n    server: {double.base_url}\n"
            f"users:\n- name: rightsizer\n  user:\n    token: {KUBE_TOKEN}\n"
            f"contexts:\n- name: {KUBE_CONTEXT}\n  context:\n    cluster: {KUBE_CONTEXT}\n    user: rightsizer\n",
            encoding="utf-8",
        )
        kubeconfig.chmod(0o600)
        made = exporter(gpu_nodes)
        if made is not None:
            stack.callback(made.stop)
        reconciler = NodeGroupReconciler(clients, CLUSTER, region=region)
        reconciler.reconcile()
        reconciler.start(0.5)
        stack.callback(reconciler.stop)
        follower = InstanceFollower(clients, double, built.nodegroups[NODEGROUP].asg_name, made)
        follower.start()
        stack.callback(follower.stop)
        cluster = GpuCluster(
            moto, clients, dynamodb, built, double, gpu_nodes, kubeconfig, reconciler, follower, region
        )
        yield cluster, made
        # Only on success: a background failure would otherwise hide behind a confusing assertion.
        assert reconciler.errors == [], reconciler.errors
        assert follower.errors == [], follower.errors
        assert double.internal_errors == [], double.internal_errors


def write_config(
    path: Path,
    cluster: GpuCluster,
    prometheus_url: str,
    *,
    policy: Path = POLICY_FILE,
    pricing_endpoint_url: str | None = None,
) -> Path:
    """A config file for ``cluster``: the double by kubeconfig context, EKS name for AWS, moto, the state
    table, Prometheus with a 1 s step and the exporter's job, and the policy file; the Price List Query API
    at ``pricing_endpoint_url`` when given (``tests.support.pricing_double``), else at moto (which answers
    500: the packaged prices)."""
    document: dict[str, Any] = {
        "cluster": {
            "name": CLUSTER,
            "region": cluster.region,
            "context": KUBE_CONTEXT,
            "kubeconfig": str(cluster.kubeconfig),
        },
        "prometheus": {
            "url": prometheus_url,
            "step": "1s",
            "job": JOB,
            "node_label": "node",
            "timeout": "10s",
        },
        "aws": {"region": cluster.region, "endpoint_url": cluster.moto.endpoint_url, "table": TABLE},
        "policy": str(policy),
    }
    if pricing_endpoint_url is not None:
        document["aws"]["pricing_endpoint_url"] = pricing_endpoint_url
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    describe: Callable[[], str] = lambda: "",
    interval_s: float = 0.2,
) -> float:
    """Poll ``predicate`` until it holds and return the seconds it took; after ``timeout_s`` fail naming
    ``what`` with ``describe()`` (the state worth seeing)."""
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{describe()}")
        time.sleep(interval_s)
    return time.monotonic() - began


# --------------------------------------------------------------------------------------------------
# Prometheus and Alertmanager processes (Debian packages) with their own config and data directories
# --------------------------------------------------------------------------------------------------

READY_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    """A server process we started: ``url`` (``http://127.0.0.1:<port>``), its log file."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """Terminate the process we started (by its pid) and wait for it; kill when it hangs."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_process(name: str, argv: Sequence[str], port: int, log: Path) -> Process:
    """Start ``argv`` (listening on 127.0.0.1:``port``) and wait for ``/-/ready``; stop it on failure."""
    with log.open("wb") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
    started = Process(name, f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}): {started.log_tail()}")
        try:
            if httpx.get(f"{started.url}/-/ready", timeout=1.0).status_code == 200:
                return started
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            started.stop()
            raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S:.0f}s: {started.log_tail()}")
        time.sleep(0.1)


def render_rules(path: Path, idle_window: str) -> Path:
    """The rules file users install — ``gpu-idle-rules.yaml`` from the ConfigMap ``kubectl kustomize
    infra/overlays/plain-prometheus`` renders — with the alert's ``for`` set to ``idle_window`` (shipped:
    the default 30 m window); expressions and labels unchanged."""
    path.write_text(rules_with_window(plain_files()["gpu-idle-rules.yaml"], idle_window), encoding="utf-8")
    return path


def render_alertmanager(path: Path, webhook_url: str, token_file: Path) -> Path:
    """The route and receiver users install (``alertmanager-route.yaml`` from the same overlay) pointing at
    ``webhook_url`` with the bearer token from ``token_file``, and notifications without delay
    (``group_wait: 0s``, ``group_interval: 1s``); grouping, ``send_resolved`` and the receiver unchanged."""
    config = yaml.safe_load(plain_files()["alertmanager-route.yaml"])
    [route] = config["route"]["routes"]
    route.update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"})
    [hook] = next(r for r in config["receivers"] if r["name"] == route["receiver"])["webhook_configs"]
    hook["url"] = webhook_url
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def start_alertmanager(binary: str, root: Path, config: Path) -> Process:
    """Alertmanager 0.25 on 127.0.0.1 with its own storage, clustering off (else it binds 0.0.0.0:9094)."""
    port = free_port()
    (root / "data").mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=debug",
    ]
    return start_process("alertmanager", argv, port, root / "alertmanager.log")


def start_scraping_prometheus(
    binary: str, root: Path, *, port: int, target: str, rules: Path, alertmanager: str, interval: str = "1s"
) -> Process:
    """Prometheus 2.x on 127.0.0.1:``port`` scraping ``target`` as the dcgm-exporter job, evaluating
    ``rules`` and notifying ``alertmanager`` (``host:port``), every ``interval``."""
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    argv = [
        binary,
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return start_process("prometheus", argv, port, root / "prometheus.log")

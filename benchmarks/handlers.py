"""Cold start of the Lambda handlers (docs/architecture.md §8, issue 33 item 4), against ``import boto3``.

Two figures per handler, each from fresh interpreters (interpreter start-up excluded), with a bare
``import boto3`` — the floor every Python Lambda that talks to AWS pays — measured in the same run,
alternated with the handlers round by round (this machine is shared and noisy: read the ratios, which
compare figures taken seconds apart):

* **import** — ``import <handler module>``: what Lambda's init phase runs before the first request;
* **first invocation** (``--first``) — the import plus the handler's first call with its ``events/`` file
  (``assess`` a tick, ``drain`` a Start task, ``offhours`` a tick, ``alert_webhook`` a firing alert,
  ``fleet`` a discovery) against local backends started here: moto in server mode (the state table, the
  drain state machine, an EKS cluster with two node groups, SSM, S3), the Kubernetes API double over HTTP
  and a real Prometheus holding DCGM series (the planted cluster of ``tests/support/planted_cluster``).
  Wall time includes the servers' answers (moto is slower than AWS); CPU time is this process's only.

Every run reads ``.pyc`` files, as the artifact's precompiled bytecode does (``functions/Makefile``), and
sets ``PYDANTIC_DISABLE_PLUGINS`` as ``template.yaml`` does. Also printed: whether the import pulled in
the Kubernetes client, boto3, the X-Ray SDK, and how many modules it loaded.

Run: ``.venv/bin/python benchmarks/handlers.py [--rounds 7] [--first] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
sys.path[:0] = [p for p in (str(ROOT), str(FUNCTIONS)) if p not in sys.path]  # the backends' doubles
#: (label, module, handler attribute, event file or None): every function module of template.yaml.
HANDLERS: tuple[tuple[str, str, str, str | None], ...] = (
    ("assess", "assess.app", "handler", "assess-tick"),
    ("alert_webhook", "alert_webhook.app", "lambda_handler", "alert-webhook-firing"),
    ("drain", "drain.app", "handler", "drain-start"),
    ("offhours", "offhours.app", "handler", "offhours-tick"),
    ("fleet", "fleet.app", "discover", ""),
    ("assess_shard", "assess.shard", "prepare", None),  # import only: its tasks need a sharded run
)
TOKEN = "s3cr3t-webhook-token"

PROBE = """
import json, sys, time
sys.path.insert(0, {functions!r})
event = json.loads(sys.stdin.read() or "null")
c0, t0 = time.process_time(), time.perf_counter()
import {module}
c1, t1 = time.process_time(), time.perf_counter()
out = {{"import_s": t1 - t0, "import_cpu_s": c1 - c0, "modules": len(sys.modules),
       "kubernetes": "kubernetes" in sys.modules, "boto3": "boto3" in sys.modules,
       "xray": "aws_xray_sdk" in sys.modules}}
if event is not None:
    class Context:  # the attributes Powertools reads from a Lambda context
        function_name = "rightsizer-bench"
        memory_limit_in_mb = 1024
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:rightsizer-bench"
        aws_request_id = "0d7e1a8c-0000-4000-8000-000000000001"
        def get_remaining_time_in_millis(self): return 300_000
    c1, t1 = time.process_time(), time.perf_counter()
    result = getattr(sys.modules[{module!r}], {attr!r})(event, Context())
    out.update(invoke_s=time.perf_counter() - t1, invoke_cpu_s=time.process_time() - c1, result=result,
               modules_after=len(sys.modules), kubernetes_after="kubernetes" in sys.modules)
print("@@" + json.dumps(out, default=str))
"""


def first_event(label: str, round_no: int) -> dict[str, Any]:
    """The handler's event for round ``round_no``: the ``events/`` file with a new id each round, so every
    round does the first request's full work (no duplicate, no existing record)."""
    from tests.builders import AT

    if label == "fleet":
        return {"run": {"id": f"bench-{round_no}", "at": AT.isoformat()}}
    name = dict((h[0], h[3]) for h in HANDLERS)[label]
    event: dict[str, Any] = json.loads((ROOT / "events" / f"{name}.json").read_text(encoding="utf-8"))
    if label in ("assess", "offhours"):
        event["scheduled_time"] = AT.isoformat()
        event["execution_id"] = f"{event['execution_id']}-{round_no}"
    elif label == "drain":
        event["request"]["execution_id"] = f"{event['request']['execution_id']}-{round_no}"
    elif label == "alert_webhook":
        body = json.loads(event["body"])
        for alert in body["alerts"]:
            alert["fingerprint"] = f"{round_no:016x}"
        event["body"] = json.dumps(body)
        event["headers"]["content-length"] = str(len(event["body"]))
        event["headers"]["authorization"] = f"Bearer {TOKEN}"
    return event


def outcome(result: dict[str, Any]) -> str:
    """A short proof the call did its work (a status code, verdict counts, a workflow status)."""
    if "statusCode" in result:
        return f"HTTP {result['statusCode']}"
    if "verdicts" in result:
        return f"verdicts {result['verdicts']}, started {len(result.get('started', []))}"
    if "status" in result:
        return f"{result.get('step')} -> {result.get('next_step')} ({result['status']})"
    if "groups" in result:
        return f"{len(result['groups'])} groups"
    if "manifest" in result:
        return f"manifest of {result['manifest'].get('count')} clusters"
    return ",".join(sorted(result))[:60]


@contextlib.contextmanager
def backends(workdir: Path) -> Iterator[dict[str, str]]:
    """Start moto (server mode), the Kubernetes API double and Prometheus with the planted cluster;
    yield the functions' environment as ``template.yaml`` sets it, plus the local endpoints."""
    import boto3
    from tests.support.asl import load_asl
    from tests.support.planted_cluster import dcgm_families, seed_cluster, write_kubeconfig
    from tests.support.prometheus_server import openmetrics_lines, require_binaries, start_prometheus

    from rightsizer.adapters.aws import make_clients
    from rightsizer.testing.dynamodb_table import create_state_table
    from rightsizer.testing.k8s import KubernetesDouble
    from rightsizer.testing.moto_eks import NodeGroupSpec, build_cluster, start_moto_server

    credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    os.environ.update(credentials)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    moto = start_moto_server()

    def write(path: Path) -> None:
        with path.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in openmetrics_lines(dcgm_families()))

    prometheus = start_prometheus(require_binaries(), workdir / "prometheus", write_openmetrics=write)
    try:
        clients = make_clients("us-east-1", endpoint_url=moto.endpoint_url)
        groups = [
            NodeGroupSpec(name="gpu-a10g", instance_type="g5.2xlarge", min_size=1, desired=3, max_size=6),
            NodeGroupSpec(name="gpu-l4", instance_type="g6.xlarge", min_size=0, desired=1, max_size=2),
        ]
        cluster = build_cluster(clients, cluster="prod-eks", region="us-east-1", nodegroups=groups)
        session = boto3.session.Session(region_name="us-east-1")
        create_state_table(session.client("dynamodb", endpoint_url=moto.endpoint_url), "rightsizer-state")
        sfn = session.client("stepfunctions", endpoint_url=moto.endpoint_url)
        machine = sfn.create_state_machine(
            name="rightsizer-drain",
            definition=json.dumps(
                load_asl("arn:aws:lambda:us-east-1:123456789012:function:rightsizer-drain")
            ),
            roleArn="arn:aws:iam::123456789012:role/rightsizer-drain-machine",
        )
        session.client("s3", endpoint_url=moto.endpoint_url).create_bucket(Bucket="rightsizer-fleet")
        night = {
            "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
            "start": "20:00",
            "end": "07:00",
            "timezone": "UTC",
        }
        offhours = {"schedules": {"night": [night]}, "node_groups": [{"name": "gpu-l4", "schedule": "night"}]}
        with KubernetesDouble(seed=7, resource_api_versions=None) as double:
            seed_cluster(double, cluster.nodegroups["gpu-a10g"].instance_ids)
            kubeconfig = write_kubeconfig(workdir / "kubeconfig", double.base_url)
            yield {
                **credentials,
                "RIGHTSIZER_CLUSTER_NAME": cluster.cluster,
                "AWS_REGION": "us-east-1",
                "RIGHTSIZER_TABLE": "rightsizer-state",
                "RIGHTSIZER_DRY_RUN": "true",
                "RIGHTSIZER_PROMETHEUS_URL": prometheus.url,
                "RIGHTSIZER_PROMETHEUS_AUTH": "none",
                "RIGHTSIZER_NODE_LABEL": "",
                "RIGHTSIZER_PRICING_API": "false",
                "RIGHTSIZER_POLICY_INLINE": "max_nodes_per_run: 10\ncooldown: 0s\n",
                "RIGHTSIZER_OFFHOURS": json.dumps(offhours),
                "RIGHTSIZER_STATE_MACHINE_ARN": machine["stateMachineArn"],
                "RIGHTSIZER_WEBHOOK_TOKEN": TOKEN,
                "RIGHTSIZER_FLEET_BUCKET": "rightsizer-fleet",
                "RIGHTSIZER_FLEET_ACCOUNTS": "123456789012",
                "RIGHTSIZER_AWS_ENDPOINT_URL": moto.endpoint_url,
                "RIGHTSIZER_KUBE_CONTEXT": "double",
                "KUBECONFIG": str(kubeconfig),
            }
    finally:
        prometheus.stop()
        moto.server.stop()


def template_runtime_env() -> dict[str, str]:
    """The interpreter settings ``template.yaml``'s Globals give every function (``PYDANTIC_*``,
    ``PYTHON*``): the benchmark runs the handlers as deployed."""
    import yaml

    class Tagged(yaml.SafeLoader):
        """Accepts CloudFormation short-form tags (!Ref, !Sub, ...)."""

    Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)
    template = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=Tagged)
    variables = template["Globals"]["Function"].get("Environment", {}).get("Variables", {})
    return {k: str(v) for k, v in variables.items() if k.startswith(("PYDANTIC_", "PYTHON"))}


def probe(
    label: str, module: str, attr: str, *, call: bool, round_no: int, env: dict[str, str], where: Where
) -> dict[str, Any]:
    """One fresh interpreter: import ``module`` (and call it once when ``call``); its figures."""
    code = PROBE.format(functions=str(where.code), module=module, attr=attr or None)
    event = json.dumps(first_event(label, round_no)) if call else ""
    done = subprocess.run(
        [where.python, "-c", code], input=event, capture_output=True, text=True, env=env, cwd=where.code
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{label}: {done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(lines[-1][2:])
    if call:
        found["outcome"] = outcome(found.pop("result"))
    return found


@dataclasses.dataclass(frozen=True)
class Where:
    """What runs the handlers: ``python`` on the ``code`` directory (``functions/`` with this
    environment's packages, or a built artifact alone)."""

    python: str
    code: Path
    artifact: bool


def run(rounds: int, first: bool, where: Where) -> dict[str, Any]:
    """``rounds`` rounds; each runs ``import boto3`` and every handler once, in a rotated order."""
    base_env = {
        **os.environ,
        "RIGHTSIZER_TRACING": "false",
        "PYTHONPATH": str(where.code),
        "POWERTOOLS_METRICS_NAMESPACE": "GPURightsizer",
    }
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    if where.artifact:  # Lambda's /var/task is read-only: only the .pyc files the artifact ships are read
        base_env["PYTHONDONTWRITEBYTECODE"] = "1"
    base_env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    base_env.update(template_runtime_env())
    probes = [("boto3", "boto3", "", ""), *list(HANDLERS)]
    # an older build (a "before") may not hold every handler of today's template
    probes = [p for p in probes if p[0] == "boto3" or (where.code / f"{p[1].replace('.', '/')}.py").exists()]
    samples: dict[str, list[dict[str, Any]]] = {p[0]: [] for p in probes}
    with contextlib.ExitStack() as stack:
        env = dict(base_env)
        if first:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="handlers-bench-")))
            env.update(stack.enter_context(backends(workdir)))
        for label, module, attr, _ in probes:  # warm-up: .pyc written, page cache filled
            probe(label, module, attr, call=False, round_no=-1, env=env, where=where)
        for r in range(rounds):
            k = r % len(probes)
            for label, module, attr, event in probes[k:] + probes[:k]:
                call = first and label != "boto3" and event is not None
                samples[label].append(probe(label, module, attr, call=call, round_no=r, env=env, where=where))
    version = subprocess.run(
        [where.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    return {"python": version, "rounds": rounds, "samples": samples}


def summarize(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Medians per handler and their ratios to ``import boto3``'s median of the same run."""
    samples = measured["samples"]
    med = statistics.median
    boto_wall = med(s["import_s"] for s in samples["boto3"])
    boto_cpu = med(s["import_cpu_s"] for s in samples["boto3"])
    rows = []
    for label, runs in samples.items():
        row: dict[str, Any] = {
            "handler": label,
            "import_ms": med(s["import_s"] for s in runs) * 1000,
            "import_cpu_ms": med(s["import_cpu_s"] for s in runs) * 1000,
            "modules": runs[-1]["modules"],
            "kubernetes": runs[-1]["kubernetes"],
            "boto3": runs[-1]["boto3"],
            "xray": runs[-1]["xray"],
        }
        row["import_x"] = row["import_ms"] / 1000 / boto_wall
        row["import_cpu_x"] = row["import_cpu_ms"] / 1000 / boto_cpu
        if "invoke_s" in runs[-1]:
            total = [s["import_s"] + s["invoke_s"] for s in runs]
            total_cpu = [s["import_cpu_s"] + s["invoke_cpu_s"] for s in runs]
            row.update(
                first_ms=med(total) * 1000,
                first_x=med(total) / boto_wall,
                first_cpu_ms=med(total_cpu) * 1000,
                first_cpu_x=med(total_cpu) / boto_cpu,
                modules_after=runs[-1]["modules_after"],
                kubernetes_after=runs[-1]["kubernetes_after"],
                outcome=runs[-1]["outcome"],
            )
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print one row per handler (or ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--first", action="store_true", help="also time each handler's first invocation")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--artifact",
        type=Path,
        help="run the handlers from this built artifact alone, read-only (make -C functions "
        "build-AssessFunction ARTIFACTS_DIR=DIR): the runtime's packages and bytecode as deployed",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter (the artifact's: python3.12)"
    )
    args = parser.parse_args(argv)
    where = Where(args.python, (args.artifact or FUNCTIONS).resolve(), args.artifact is not None)
    measured = run(args.rounds, args.first, where)
    rows = summarize(measured)
    if args.json:
        print(json.dumps({"python": measured["python"], "rounds": args.rounds, "rows": rows}, indent=2))
        return 0
    print(f"{where.code}{' (artifact, read-only)' if where.artifact else ''}")
    print(f"python {measured['python']}, medians of {args.rounds} alternated rounds of fresh interpreters")
    head = f"{'handler':<14} {'import ms':>9} {'x boto3':>7} {'cpu x':>6} {'modules':>7}  k8s   boto3 xray"
    print(head + ("   first ms  x boto3  cpu ms  cpu x  k8s   outcome" if args.first else ""))
    for row in rows:
        line = (
            f"{row['handler']:<14} {row['import_ms']:>9.1f} {row['import_x']:>6.2f}x {row['import_cpu_x']:>5.2f}x"
            f" {row['modules']:>7}  {row['kubernetes']!s:<5} {row['boto3']!s:<5} {row['xray']!s:<5}"
        )
        if "first_ms" in row:
            line += (
                f" {row['first_ms']:>9.1f} {row['first_x']:>6.2f}x {row['first_cpu_ms']:>7.1f}"
                f" {row['first_cpu_x']:>5.2f}x  {row['kubernetes_after']!s:<5} {row['outcome']}"
            )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``rightsizer restore WORKLOAD|--all``: bring workloads scaled to zero back exactly (issue 32,
``rightsizer.services.workloads``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rightsizer.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, deployed_config, emit_json

__all__ = ["add_parsers", "cmd_restore"]


def cmd_restore(args: argparse.Namespace) -> int:
    """``rightsizer restore (WORKLOAD | --all) (--stack NAME | --config FILE) [--execute] [--json]``: put
    back exactly the state saved before a workload's scale-to-zero (replicas through the scale
    subresource, the Notebook's ``kubeflow-resource-stopped``, the InferenceService's ``minReplicas``,
    the ScaledObject's ``autoscaling.keda.sh/paused-replicas``), read from the state table (else from
    the owner's ``rightsizer.io/scaled-to-zero`` annotation), then forget it. WORKLOAD is
    ``Kind/namespace/name`` (``Deployment/ml/llm``). Without ``--execute`` (or with the policy's
    ``dry_run: true``) it only says what it would restore. Exit 0 restored (or nothing to do), 1 a
    workload is gone, 2 bad input."""
    from rightsizer.wiring import Runtime

    if bool(args.workload) == bool(args.all):
        print("rightsizer: error: give exactly one of WORKLOAD or --all", file=sys.stderr)
        return EXIT_BAD_INPUT
    runtime = Runtime(deployed_config(args), "cli", dry_run=not args.execute)
    scaler = runtime.workload_scaler()
    try:
        outcomes = scaler.restore_all() if args.all else [scaler.restore(args.workload)]
    except ValueError as exc:
        print(f"rightsizer: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        emit_json(
            [
                {
                    "workload": o.workload,
                    "result": o.result,
                    "message": o.message,
                    "saved": o.saved.model_dump(mode="json") if o.saved else None,
                }
                for o in outcomes
            ]
        )
    else:
        for o in outcomes or ():
            print(f"{o.workload}: {o.result} — {o.message}")
        if not outcomes:
            print("no workload is saved as scaled to zero")
    return EXIT_FAILED if any(o.result == "not_found" for o in outcomes) else EXIT_OK


def add_parsers(sub: Any) -> None:
    """Register ``restore``."""
    r = sub.add_parser("restore", help="bring workloads scaled to zero back exactly (with your credentials)")
    r.add_argument(
        "workload", nargs="?", metavar="WORKLOAD", help="Kind/namespace/name, e.g. Deployment/ml/llm"
    )
    r.add_argument("--all", action="store_true", help="every workload the state table saved")
    r.add_argument(
        "--stack", metavar="NAME", help="a deployed CloudFormation stack (its outputs name the table)"
    )
    r.add_argument("--region", metavar="REGION", help="the stack's region (default: the AWS environment's)")
    r.add_argument("--config", metavar="FILE", help="a config file instead of --stack")
    r.add_argument("--execute", action="store_true", help="act (otherwise only say what would be restored)")
    r.add_argument("--json", action="store_true", help="print the outcomes as one JSON document")
    r.set_defaults(func=cmd_restore)

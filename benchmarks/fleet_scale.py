"""Fleet scaling benchmark (issue 31): the fleet state machine over N simulated clusters on moto.

Builds an organisation on an in-process moto server (member accounts x regions x EKS clusters, created
through each account's spoke role), then runs the whole fleet state machine (discovery through every
account's role, the Distributed Map with one member invocation per cluster, ResultWriter to S3, the
summary) in the project's ASL interpreter with the real handlers; each cluster's assessment is stubbed
(``tests.support.fleet_scale.stub_assessment``), so this measures the fleet's own cost. Prints per N: wall
seconds of the run, traced peak memory (tracemalloc: handlers, interpreter and moto, one process), Lambda
invocations, state transitions, S3 requests of the run, and the result files' bytes.
Usage: ``.venv/bin/python benchmarks/fleet_scale.py [--sizes 10,100,1000]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10,100,1000")
    args = parser.parse_args()
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }
    )
    from tests.support.fleet_scale import build_organisation, fleet_environment, run_fleet, stub_assessment

    import rightsizer.wiring.fleet as wiring
    from rightsizer.testing.moto_eks import reset_moto, start_moto_server

    wiring.assess_config = stub_assessment  # type: ignore[assignment]
    server = start_moto_server()
    print(
        f"{'clusters':>8} {'wall s':>8} {'peak MiB':>9} {'invocations':>12} {'transitions':>12} {'results KiB':>12}"
    )
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            regions = ["us-east-1", "eu-west-1"]
            accounts = max(1, size // 100)
            per_region = size // (accounts * len(regions))
            reset_moto(server.endpoint_url)
            os.environ.update(fleet_environment(server.endpoint_url, regions, 100))
            build_organisation(server.endpoint_url, accounts, regions, per_region)
            run = run_fleet(server.endpoint_url)
            assert run.execution.status == "SUCCEEDED", run.execution.error
            import boto3

            s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=server.endpoint_url)
            listed = s3.list_objects_v2(Bucket="fleet-scale-bucket", Prefix="fleet/results/")
            result_bytes = sum(o["Size"] for o in listed.get("Contents", []))
            # Transitions as Step Functions counts them: every state entered, the children's included.
            print(
                f"{run.report.clusters:>8} {run.wall_s:>8.1f} {run.peak_bytes / 2**20:>9.1f} "
                f"{len(run.execution.invocations):>12} {len(run.execution.states):>12} {result_bytes / 1024:>12.1f}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""The test ASL interpreter's Map state (``tests.support.asl_map``) against moto S3: Distributed Map items from
an S3 JSON array, ItemSelector with ``$$.Map.Item``, MaxConcurrency waves on the fake clock, the tolerated
failure threshold, and ResultWriter's manifest and result files as Step Functions writes them.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from rightsizer.testing.fakes import FakeClock
from rightsizer.testing.moto_eks import MotoServer
from tests.support.asl import AslInterpreter

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

FN = "arn:aws:lambda:us-east-1:123456789012:function:square"


def definition(**map_fields: Any) -> dict[str, Any]:
    return {
        "StartAt": "Each",
        "States": {
            "Each": {
                "Type": "Map",
                "ItemReader": {
                    "Resource": "arn:aws:states:::s3:getObject",
                    "ReaderConfig": {"InputType": "JSON"},
                    "Parameters": {"Bucket.$": "$.bucket", "Key.$": "$.key"},
                },
                "ItemSelector": {
                    "n.$": "$$.Map.Item.Value",
                    "index.$": "$$.Map.Item.Index",
                    "tag.$": "$.tag",
                },
                "ItemProcessor": {
                    "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                    "StartAt": "Square",
                    "States": {
                        "Square": {
                            "Type": "Task",
                            "Resource": "arn:aws:states:::lambda:invoke",
                            "Parameters": {"FunctionName": FN, "Payload.$": "$"},
                            "OutputPath": "$.Payload",
                            "End": True,
                        }
                    },
                },
                "ResultWriter": {
                    "Resource": "arn:aws:states:::s3:putObject",
                    "Parameters": {"Bucket": "map-bucket", "Prefix": "out"},
                },
                "ResultPath": "$.results",
                "End": True,
                **map_fields,
            }
        },
    }


@pytest.fixture
def s3(aws_clients: Any, moto_server: MotoServer) -> Any:
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_server.endpoint_url)
    client.create_bucket(Bucket="map-bucket")
    client.put_object(Bucket="map-bucket", Key="items.json", Body=json.dumps(list(range(10))).encode())
    return client


def machine(s3: Any, fields: dict[str, Any], fail: set[int] = frozenset()) -> AslInterpreter:  # type: ignore[assignment]
    def invoke(arn: str, payload: dict[str, Any]) -> Any:
        assert arn == FN and payload["tag"] == "t"
        if payload["n"] in fail:
            raise ValueError(f"cannot square {payload['n']}")
        return {"square": payload["n"] ** 2, "index": payload["index"]}

    return AslInterpreter(definition(**fields), invoke, FakeClock(0.0), invoke_latency_s=10.0, s3=s3)


def test_items_from_s3_run_in_waves_and_results_are_written_as_step_functions_does(s3: Any) -> None:
    interp = machine(s3, {"MaxConcurrencyPath": "$.concurrency"})
    run = interp.run({"bucket": "map-bucket", "key": "items.json", "tag": "t", "concurrency": 4}, "ex")
    assert run.status == "SUCCEEDED"
    # 10 children, 4 at a time: 3 waves of one 10 s invocation each
    assert interp.clock() == 30.0
    details = run.output["results"]["ResultWriterDetails"]
    manifest = json.loads(s3.get_object(Bucket="map-bucket", Key=details["Key"])["Body"].read())
    assert details["Key"].startswith("out/") and manifest["DestinationBucket"] == "map-bucket"
    (succeeded,) = manifest["ResultFiles"]["SUCCEEDED"]
    assert manifest["ResultFiles"]["FAILED"] == []
    rows = json.loads(s3.get_object(Bucket="map-bucket", Key=succeeded["Key"])["Body"].read())
    assert sorted(json.loads(r["Output"])["square"] for r in rows) == [n * n for n in range(10)]
    assert json.loads(rows[3]["Input"]) == {"n": 3, "index": 3, "tag": "t"}


def test_failed_children_within_the_threshold_are_written_as_failed(s3: Any) -> None:
    interp = machine(s3, {"ToleratedFailurePercentage": 20}, fail={2, 7})
    run = interp.run({"bucket": "map-bucket", "key": "items.json", "tag": "t"}, "ex")
    assert run.status == "SUCCEEDED"
    manifest = json.loads(
        s3.get_object(Bucket="map-bucket", Key=run.output["results"]["ResultWriterDetails"]["Key"])[
            "Body"
        ].read()
    )
    (failed,) = manifest["ResultFiles"]["FAILED"]
    rows = json.loads(s3.get_object(Bucket="map-bucket", Key=failed["Key"])["Body"].read())
    assert sorted(json.loads(r["Input"])["n"] for r in rows) == [2, 7]
    assert {r["Error"] for r in rows} == {"ValueError"}


def test_more_failures_than_tolerated_fail_the_map_state(s3: Any) -> None:
    interp = machine(s3, {"ToleratedFailurePercentage": 10}, fail={2, 7})
    run = interp.run({"bucket": "map-bucket", "key": "items.json", "tag": "t"}, "ex")
    assert (run.status, run.error) == ("FAILED", "States.ExceedToleratedFailureThreshold")
    assert interp.map_runs[0].succeeded == 8  # every child ran before the threshold was judged


def test_an_unreadable_item_source_fails_the_map_state(s3: Any) -> None:
    run = machine(s3, {}).run({"bucket": "map-bucket", "key": "missing.json", "tag": "t"}, "ex")
    assert (run.status, run.error) == ("FAILED", "States.ItemReaderFailed")

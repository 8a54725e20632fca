"""The Map state for the test ASL interpreter (``tests.support.asl``): inline and Distributed Map.

What ``infra/statemachine/fleet.asl.json`` uses, as Step Functions documents it (Developer Guide, "Map state
in Distributed mode", "ItemReader", "ResultWriter", "Tolerated failure threshold"):

- items from ``ItemsPath`` (inline) or ``ItemReader`` ``arn:aws:states:::s3:getObject`` with
  ``ReaderConfig.InputType`` ``JSON`` (a JSON array in S3, read through the interpreter's ``s3`` client —
  moto in tests);
- ``ItemSelector`` over the state input with ``$$.Map.Item.Value`` / ``$$.Map.Item.Index``;
- ``ItemProcessor`` run per item as a child execution in the parent's context; ``MaxConcurrency(Path)``
  children at a time — the fake clock moves by the slowest child of each wave, as parallel children do;
- ``ToleratedFailurePercentage(Path)``: more failed children than that fails the state with
  ``States.ExceedToleratedFailureThreshold`` (Catch-able) after every child ran;
- ``ResultWriter`` ``arn:aws:states:::s3:putObject``: ``<Prefix>/<map run id>/manifest.json`` plus
  ``SUCCEEDED_0.json`` / ``FAILED_0.json`` with the child records (``Input`` and ``Output`` as JSON strings,
  ``Error``/``Cause`` of failed children) and the state's result ``{"MapRunArn", "ResultWriterDetails":
  {"Bucket", "Key"}}``; without it, the result is the list of child outputs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.support.asl import Execution, StatesError, _get, _set, _template

if TYPE_CHECKING:
    from tests.support.asl import AslInterpreter

READ_S3 = "arn:aws:states:::s3:getObject"
WRITE_S3 = "arn:aws:states:::s3:putObject"


@dataclass
class MapRun:
    """What one Map state did (the interpreter's ``map_runs`` keeps every one, for tests)."""

    arn: str
    items: int
    succeeded: int = 0
    failed: int = 0
    children: list[Execution] = field(default_factory=list)
    result_keys: list[str] = field(default_factory=list)


def _items(
    interp: AslInterpreter, state: dict[str, Any], document: Any, context: dict[str, Any]
) -> list[Any]:
    reader = state.get("ItemReader")
    if reader is None:
        items = _get(document, state.get("ItemsPath", "$"), context)
        assert isinstance(items, list), "ItemsPath must select an array"
        return items
    assert reader["Resource"] == READ_S3, reader["Resource"]
    assert reader.get("ReaderConfig", {}).get("InputType") == "JSON", "only JSON manifests are read"
    params = _template(reader["Parameters"], document, context)
    try:
        body = interp.s3.get_object(Bucket=params["Bucket"], Key=params["Key"])["Body"].read()
    except Exception as exc:  # S3 answers are the Map's failure (States.ItemReaderFailed)
        raise StatesError("States.ItemReaderFailed", str(exc)) from exc
    items = json.loads(body)
    if not isinstance(items, list):
        raise StatesError("States.ItemReaderFailed", "the JSON item source is not an array")
    return items


def _setting(state: dict[str, Any], name: str, document: Any, context: dict[str, Any], default: int) -> int:
    if name in state:
        return int(state[name])
    if f"{name}Path" in state:
        return int(_get(document, state[f"{name}Path"], context))
    return default


def _write_results(
    interp: AslInterpreter, writer: dict[str, Any], run: MapRun, name: str, records: dict[str, list[Any]]
) -> dict[str, Any]:
    assert writer["Resource"] == WRITE_S3, writer["Resource"]
    params = writer["Parameters"]
    bucket, prefix = params["Bucket"], params.get("Prefix", "").rstrip("/")
    base = f"{prefix}/{name}" if prefix else name
    files: dict[str, list[dict[str, Any]]] = {"FAILED": [], "PENDING": [], "SUCCEEDED": []}
    for status, rows in records.items():
        if not rows:
            continue
        key = f"{base}/{status}_0.json"
        body = json.dumps(rows).encode()
        interp.s3.put_object(Bucket=bucket, Key=key, Body=body)
        files[status].append({"Key": key, "Size": len(body)})
        run.result_keys.append(key)
    manifest_key = f"{base}/manifest.json"
    manifest = {"DestinationBucket": bucket, "MapRunArn": run.arn, "ResultFiles": files}
    interp.s3.put_object(Bucket=bucket, Key=manifest_key, Body=json.dumps(manifest).encode())
    run.result_keys.append(manifest_key)
    return {"MapRunArn": run.arn, "ResultWriterDetails": {"Bucket": bucket, "Key": manifest_key}}


def run_map(
    interp: AslInterpreter, state: dict[str, Any], document: Any, context: dict[str, Any], parent: Execution
) -> Any:
    """Run the Map ``state`` on ``document``; returns the document after ResultPath/OutputPath.

    Raises:
        StatesError: ``States.ItemReaderFailed``, ``States.ExceedToleratedFailureThreshold``.
    """
    from tests.support.asl import AslInterpreter

    items = _items(interp, state, document, context)
    concurrency = _setting(state, "MaxConcurrency", document, context, 0) or len(items) or 1
    tolerated = _setting(state, "ToleratedFailurePercentage", document, context, 0)
    processor = state["ItemProcessor"]
    definition = {"StartAt": processor["StartAt"], "States": processor["States"]}
    child = AslInterpreter(
        definition,
        interp.invoke,
        interp.clock,
        invoke_latency_s=interp.invoke_latency_s,
        max_transitions=interp.max_transitions,
        tokens=interp.tokens,
        s3=interp.s3,
    )
    name = f"{context['Execution']['Name']}-map-{len(interp.map_runs)}"
    run = MapRun(arn=f"arn:aws:states:us-east-1:123456789012:mapRun:{name}", items=len(items))
    records: dict[str, list[Any]] = {"SUCCEEDED": [], "FAILED": []}
    outputs: list[Any] = []
    for wave in range(math.ceil(len(items) / concurrency)):
        began, slowest = interp.clock.t, interp.clock.t
        for index in range(wave * concurrency, min(len(items), (wave + 1) * concurrency)):
            interp.clock.t = began  # the wave's children run side by side
            item_context = {**context, "Map": {"Item": {"Index": index, "Value": items[index]}}}
            selector = state.get("ItemSelector")
            child_input = _template(selector, document, item_context) if selector else items[index]
            outcome = child.run_in(child_input, item_context)
            slowest = max(slowest, interp.clock.t)
            run.children.append(outcome)
            parent.invocations.extend(outcome.invocations)
            parent.states.extend(f"{index}:{s}" for s in outcome.states)
            row: dict[str, Any] = {
                "ExecutionArn": f"{run.arn}:{index}",
                "Input": json.dumps(child_input),
                "Name": str(index),
                "Status": outcome.status,
            }
            if outcome.status == "SUCCEEDED":
                run.succeeded += 1
                row["Output"] = json.dumps(outcome.output)
                records["SUCCEEDED"].append(row)
                outputs.append(outcome.output)
            else:
                run.failed += 1
                row.update(Error=outcome.error or "", Cause=outcome.cause or "")
                records["FAILED"].append(row)
                outputs.append(None)
        interp.clock.t = slowest
    interp.map_runs.append(run)
    result: Any = outputs
    if "ResultWriter" in state:
        result = _write_results(interp, state["ResultWriter"], run, name, records)
    if items and run.failed * 100 > tolerated * len(items):
        raise StatesError(
            "States.ExceedToleratedFailureThreshold",
            f"{run.failed} of {len(items)} child executions failed (tolerated {tolerated} %)",
        )
    document = _set(document, state.get("ResultPath", "$"), result)
    if "OutputPath" in state:
        document = _get(document, state["OutputPath"], context)
    return document

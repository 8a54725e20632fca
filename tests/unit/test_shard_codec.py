"""A sharded run's objects read back from their bytes (``adapters.shard_codec``, issue 33 item 3).

GIVEN a shard's partial (pods of several kinds, device signals with NaN and ±Inf facts, XID facts) and a
run's Nodes, written by their codecs, WHEN the merge's ``RunDecoder`` reads them THEN the pods and Nodes are
the very models the unsharded read makes of the same objects (``kubernetes_models.ModelPages``: equal, with
equal parts shared across partials), the rest of the partial is what was written, non-finite facts
included; a partial of the previous release's format (1: NaN as bare constants, no ``format``) reads the
same; a partial of a format this release does not know, or a malformed one, is refused naming why.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
from typing import Any

import pytest

from rightsizer.adapters.kubernetes_models import ModelPages
from rightsizer.adapters.shard_codec import RunDecoder
from rightsizer.domain.model import Node, Pod
from rightsizer.domain.pod_parts import CompactObjects
from rightsizer.domain.shard import PARTIAL_CODEC, PARTIAL_FORMAT, ShardPartial, ShardsIncomplete
from rightsizer.domain.usage import CollectedSignals, DeviceSignals, UnmappedSeries
from rightsizer.services.shard import NODES_CODEC
from tests.builders import exporter_pod, gpu_node, pod

NODES = ("gpu-a", "gpu-b")


def pod_dicts(shard: str) -> list[dict[str, Any]]:
    """What a shard's pod lists answer: exporters, Deployment pods, a GPU holder, a finished Job pod."""
    out: list[dict[str, Any]] = []
    for i, node in enumerate(NODES):
        out.append(exporter_pod(node, f"10.0.{i}.9", name=f"dcgm-{shard}-{i}"))
        out.append(pod(f"web-{shard}-{i}", node, labels={"app": "web"}, annotations={"a": "b"}))
        out.append(pod(f"train-{shard}-{i}", node, gpus=1, namespace="ml"))
    out.append(pod(f"done-{shard}", NODES[0], owner=("Job", "batch/v1"), phase="Succeeded"))
    return out


def unsharded(items: list[dict[str, Any]], kind: type[Node] | type[Pod]) -> list[Any]:
    """The models the unsharded assessment's list read makes of ``items`` (one list page)."""
    objects, _ = ModelPages(kind).page(json.dumps({"items": items}).encode())
    return objects


def signals() -> CollectedSignals:
    return CollectedSignals(
        devices={
            "gpu-a": [
                DeviceSignals(
                    "gpu-a",
                    "GPU-1",
                    activity_max_pct=math.nan,
                    power_max_w=math.inf,
                    fb_used_max_mib=-math.inf,
                    active_steps=frozenset({1, 3}),
                    non_finite=("DCGM_FI_DEV_GPU_UTIL",),
                )
            ],
            "gpu-b": [DeviceSignals("gpu-b", "GPU-2", activity_max_pct=0.0, coverage=1.0)],
        },
        up_coverage={"gpu-a": 1.0},
        unmapped=[UnmappedSeries("DCGM_FI_DEV_GPU_UTIL", {"Hostname": "x"}, "no_node")],
        node_problems={"gpu-b": ("DCGM_FI_DEV_FB_USED",)},
        present=frozenset({"DCGM_FI_DEV_GPU_UTIL"}),
    )


def partial(shard: str) -> ShardPartial:
    """A partial as the shard writes it: its pods as ``services.shard.pods_on`` makes them."""
    compact = CompactObjects()
    pods = tuple(compact.pod(p) for p in pod_dicts(shard))
    return ShardPartial(
        "run-1", shard, NODES, pods, signals(), signals(), {"gpu-a": (("79",), ("2026-12-07T00:00:00Z",))}
    )


def rest(p: ShardPartial) -> str:
    """Everything but the pods, non-finite floats as written (NaN compares unequal to itself)."""
    return PARTIAL_CODEC.dump_json(dataclasses.replace(p, pods=())).decode()


def format_1(body: bytes) -> bytes:
    """The previous release's body of the same partial: non-finite floats as bare JSON constants (its
    ``ser_json_inf_nan="constants"``) and no ``format`` field."""
    for text in (b"-Infinity", b"Infinity", b"NaN"):
        body = body.replace(b'"' + text + b'"', text)
    return body.replace(b',"format":2', b"")


def test_a_partial_reads_back_as_the_unsharded_read_would_make_its_pods() -> None:
    written = partial("s0000")
    body = PARTIAL_CODEC.dump_json(written)
    assert b'"NaN"' in body and b'"format":2' in body
    json.loads(body, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))

    decoder = RunDecoder()
    got = decoder.partial(body)
    assert got.format == PARTIAL_FORMAT
    assert list(got.pods) == unsharded(pod_dicts("s0000"), Pod)
    assert rest(got) == rest(written)
    assert math.isnan(got.signals.devices["gpu-a"][0].activity_max_pct or 0.0)
    assert got.signals.devices["gpu-a"][0].fb_used_max_mib == -math.inf
    # equal parts are one object across partials (1.5 million pods at 100,000 GPU nodes)
    other = decoder.partial(PARTIAL_CODEC.dump_json(partial("s0001")))
    assert other.pods[0].spec.containers is got.pods[0].spec.containers


def test_the_previous_release_format_reads_the_same() -> None:
    written = partial("s0000")
    old = format_1(PARTIAL_CODEC.dump_json(written))
    assert b"NaN" in old and b'"NaN"' not in old and b"format" not in old
    got = RunDecoder().partial(old)
    assert got.format == 1
    assert list(got.pods) == unsharded(pod_dicts("s0000"), Pod)
    assert rest(dataclasses.replace(got, format=PARTIAL_FORMAT)) == rest(written)
    # a format-1 partial whose facts are all finite is strict JSON: told apart by its missing format
    finite = dataclasses.replace(written, signals=CollectedSignals(), workload_signals=None)
    assert RunDecoder().partial(format_1(PARTIAL_CODEC.dump_json(finite))).format == 1


@pytest.mark.parametrize("nan", [False, True])
def test_a_partial_of_an_unknown_format_is_refused_naming_it(nan: bool) -> None:
    body = PARTIAL_CODEC.dump_json(partial("s0000")).replace(b'"format":2', b'"format":3')
    if nan:
        body = body.replace(b'"NaN"', b"NaN")
    with pytest.raises(ShardsIncomplete, match="format 3; this release reads formats 1, 2"):
        RunDecoder().partial(body)
    # a newer format whose shape changed too is refused for its format, not called malformed
    changed = body.replace(b'"pods":[', b'"pods":{"v3":[').replace(b'],"signals"', b']},"signals"')
    with pytest.raises(ShardsIncomplete, match="format 3"):
        RunDecoder().partial(changed)


def test_a_malformed_partial_is_refused_naming_the_field() -> None:
    body = PARTIAL_CODEC.dump_json(partial("s0000")).replace(b'"name":"dcgm-s0000-0"', b'"name":7')
    with pytest.raises(ShardsIncomplete, match=r"malformed: Expected `str`, got `int` - at `\$\.pods\[0\]"):
        RunDecoder().partial(body)
    with pytest.raises(ShardsIncomplete, match="malformed"):
        RunDecoder().partial(b'{"run": "r", "shard": "s0000"}')


def test_the_run_nodes_read_back_as_the_unsharded_read_makes_them() -> None:
    items = [gpu_node(n, labels={"zone": "a"}) for n in NODES]
    body = NODES_CODEC.dump_json([CompactObjects().node(n) for n in items])
    assert RunDecoder().nodes(body) == unsharded(items, Node)
    with pytest.raises(ShardsIncomplete, match="not a Node array"):
        RunDecoder().nodes(b'{"items": []}')


@pytest.mark.parametrize("old", [False, True], ids=["format-2", "format-1"])
@pytest.mark.parametrize("missing", ["run", "shard", "nodes", "pods", "signals", "workload_signals", "xids"])
def test_a_partial_missing_a_field_is_refused_naming_it_never_read_as_its_default(
    missing: str, old: bool
) -> None:
    """Both formats write every field (format 1 all but ``format``). A body without one was cut or made by
    hand: read with the field's default, a partial without ``pods`` would be a shard whose nodes run
    nothing - the merge could call them idle. It is refused, naming the field, and the collector is on."""
    document = json.loads(PARTIAL_CODEC.dump_json(partial("s0000")))
    del document[missing]
    body = json.dumps(document, separators=(",", ":")).encode()
    if old:
        body = format_1(body)
    with pytest.raises(ShardsIncomplete, match=f"malformed: Object missing required field `{missing}`"):
        RunDecoder().partial(body)
    assert gc.isenabled()


@pytest.mark.parametrize("found", ["true", '"2"', "2.0", "1.0", "0", "3"])
def test_a_format_that_is_not_one_of_ours_exactly_is_refused(found: str) -> None:
    body = PARTIAL_CODEC.dump_json(partial("s0000")).replace(b'"format":2', b'"format":' + found.encode())
    with pytest.raises(ShardsIncomplete, match="this release reads formats 1, 2"):
        RunDecoder().partial(body)

"""The generated example snapshots decide as their provenance notes (expected.json) say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.cli import example_snapshot_dir
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.support.examplegen import generate_snapshot


def _check(directory: Path) -> None:
    expected = json.loads((directory / "expected.json").read_text())
    result = plan(load_snapshot(directory), Policy())
    assert {n.node for n in result.nodes} == set(expected)
    for node, want in expected.items():
        report = result.node(node)
        assert report.verdict == want["verdict"], (node, report.reasons)
        got = [r.split(":", 1)[0] for r in report.reasons]
        for code in want["reasons_include"]:
            assert code in got, (node, code, report.reasons)


def test_packaged_demo_snapshot_decides_as_documented() -> None:
    directory = example_snapshot_dir()
    _check(directory)
    result = plan(load_snapshot(directory), Policy())
    assert [(a.kind, a.node) for a in result.actions if a.kind == "scale_in"] == [
        ("scale_in", "ip-10-0-83-246.ec2.internal")
    ]
    assert result.savings.hourly_usd == pytest.approx(5.672)
    # The gpu-dev nodes are idle by metrics too, but the budget slot goes to the node that saves the most.
    dev = [n for n in result.nodes if n.node.startswith("ip-10-5-")]
    assert len(dev) == 2
    assert {n.verdict for n in dev} == {"protected"}


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_scale_scenario_decides_as_documented(tmp_path: Path, seed: int) -> None:
    _check(generate_snapshot(tmp_path / "scale", scenario="scale", nodes=40, seed=seed))

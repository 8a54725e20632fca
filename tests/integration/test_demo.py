"""`rightsizer demo` end to end on the embedded default: removes the idle node, saves money, restores
the dev node group exactly (issue "End to end")."""

from __future__ import annotations

import io
import json

import pytest

from rightsizer.cli import main
from rightsizer.demo import run_demo

# Each test runs the whole demo once: 107-136 s (about 51 CPU-s) at load 12-14 on the shared 2-core
# machine; before the demo's workloads exited on SIGTERM (testing.demo_env.DEMO_CONTAINER_EXIT_S) it was
# 214 s (77 CPU-s) back to back at the same load. 300 s leaves about x2.2 over the slowest loaded run.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def test_demo_removes_the_idle_node_and_restores_off_hours_exactly() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_demo(out=out, err=err) == 0
    text = out.getvalue()
    assert "== Scheduled assessment ==" in text
    assert "removed ip-10-0-83-246.ec2.internal (i-" in text and "Node gone: True" in text
    assert "before: min 1 / desired 5 / max 8, 5 instances in service" in text
    assert "after:  min 1 / desired 4 / max 8, 4 instances in service" in text
    # The drain saves the g5.12xlarge (5.672 USD/h); the resize g5.4xlarge -> g5.xlarge saves 1.624 - 1.006;
    # the replacement of gpu-a10g-serve (2 x g5.12xlarge -> 2 x g5.xlarge) saves (5.672 - 1.006) x 2.
    assert "Saved: 15.62 USD/hour, 11,404.06 USD/month" in text
    assert "old gpu-a10g-serve (g5.12xlarge): before 1/2/3 -> after 0/0/3, kept: True" in text
    assert "new gpu-a10g-serve-g5-xlarge (g5.xlarge): ACTIVE, sizes 1/2/3; Nodes Ready with GPUs: 2" in text
    assert "old Nodes left: 0; cordoned by us anywhere: []" in text
    assert (
        "-> EC2 now g5.xlarge running; Node g5.xlarge, Ready True, 1 GPU allocatable, cordoned False" in text
    )
    assert "exact restore: True" in text
    # The assessment's decision records, read back as `rightsizer status` reads a deployed stack
    assert "== rightsizer status" in text and "Latest assessment:" in text
    status = text[text.index("== rightsizer status") :]
    assert "drain_started" in status and "resize_started" in status and "none: protected:" in status
    assert "replace_started" in status
    assert "validate   → cordon" in err.getvalue() and "verify     → succeeded" in err.getvalue()


def test_demo_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    [removed] = doc["assessment"]["removed"]
    assert removed["node"] == "ip-10-0-83-246.ec2.internal"
    assert doc["assessment"]["node_group"] == {"name": "gpu-a10g", "before": [1, 5, 8], "after": [1, 4, 8]}
    assert doc["assessment"]["savings"]["hourly_usd"] == pytest.approx(
        5.672 + 1.624 - 1.006 + 2 * (5.672 - 1.006)
    )
    [replaced] = doc["assessment"]["replaced"]
    assert (replaced["old"], replaced["new"], replaced["from"], replaced["to"]) == (
        "gpu-a10g-serve",
        "gpu-a10g-serve-g5-xlarge",
        "g5.12xlarge",
        "g5.xlarge",
    )
    assert (replaced["old_after"], replaced["new_status"], replaced["ready"], replaced["ok"]) == (
        "0/0/3",
        "ACTIVE",
        2,
        True,
    )
    [resized] = doc["assessment"]["resized"]
    assert (resized["from"], resized["ec2_type"], resized["node_type"], resized["status"]) == (
        "g5.4xlarge",
        "g5.xlarge",
        "g5.xlarge",
        "succeeded",
    )
    assert resized["ready"] is True and resized["cordoned"] is False
    assert doc["offhours"]["before"] == doc["offhours"]["up"] == [0, 2, 2]
    assert doc["offhours"]["down"] == [0, 0, 2]
    # one decision record per GPU node, with the verdicts of the plan table
    decisions = {d["node"]: d for d in doc["decisions"]}
    assert len(decisions) == len(doc["decisions"]) == sum(doc["assessment"]["verdicts"].values())
    assert decisions["ip-10-0-83-246.ec2.internal"]["action"] == "drain_started"
    assert all(d["why_not"] for d in decisions.values() if d["action"] == "none")

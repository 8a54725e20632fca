"""The fleet at 1,000 clusters (issue 31 item 5): 10 member accounts x 2 regions x 50 EKS clusters on moto,
every cluster's assessment stubbed (``tests.support.fleet_scale``), the whole state machine run by the ASL
interpreter with the real handlers. What is proven: Lambda invocations and state transitions per run are
linear in the clusters (no recursion, no polling loop), one cluster in ten failing stops none of the
others, and the hub's wall time and traced memory stay bounded. The figures themselves are printed by
``benchmarks/fleet_scale.py`` (docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rightsizer.testing.moto_eks import MotoServer, reset_moto
from tests.support.fleet_scale import build_organisation, fleet_environment, run_fleet, stub_assessment

pytest_plugins = ["tests.support.moto_fixtures"]
# ~200-270 s on a loaded 2-core machine (moto answers ~1,050 discovery calls over HTTP): past the 300 s default.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ACCOUNTS, REGIONS, PER_REGION = 10, ["us-east-1", "eu-west-1"], 50
CLUSTERS = ACCOUNTS * len(REGIONS) * PER_REGION


@pytest.fixture
def organisation(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    import rightsizer.wiring.fleet as wiring

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    base = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}  # fmt: skip
    for name, value in {**base, **fleet_environment(moto_server.endpoint_url, REGIONS, 100)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(wiring, "assess_config", stub_assessment)
    reset_moto(moto_server.endpoint_url)
    yield build_organisation(moto_server.endpoint_url, ACCOUNTS, REGIONS, PER_REGION)
    reset_moto(moto_server.endpoint_url)


def test_a_thousand_clusters_cost_one_invocation_each_and_bounded_time_and_memory(
    moto_server: MotoServer, organisation: list[str]
) -> None:
    run = run_fleet(moto_server.endpoint_url)

    assert run.execution.status == "SUCCEEDED", (run.execution.error, run.execution.cause)
    report = run.report
    # Every cluster is in the report; the one in ten whose API refused connections did not stop the rest
    assert report.clusters == CLUSTERS
    assert report.outcomes == {"assessed": CLUSTERS * 9 // 10, "unreachable_endpoint": CLUSTERS // 10}
    assert report.verdicts == {"busy": 3 * 900, "idle": 2 * 900}
    assert report.idle_usd_per_hour == pytest.approx(900 * 2 * 1.212)
    # O(clusters): one member invocation per cluster, one discovery, one summary; transitions linear
    assert len(run.execution.invocations) == CLUSTERS + 2
    child_states = [s for s in run.execution.states if ":" in s]
    assert len(child_states) == CLUSTERS  # one state per child (AssessCluster)
    assert len(run.execution.states) - len(child_states) == 5  # Discover, Map, Summarize, Choice, Done
    # 100 at a time: 10 waves of one member invocation on the fake clock
    assert run.fake_s < 60
    # Bounded: the hub's side (handlers, interpreter, moto in this process) within generous limits
    assert run.wall_s < 600, run.wall_s
    assert run.peak_bytes < 512 * 2**20, run.peak_bytes

"""Contract suite of the state ports: one set of tests, run on the in-memory and the DynamoDB store.

``params=["fake", "real"]``: ``fake`` is :class:`MemoryState`; ``real`` is :class:`DynamoDbState` on a moto
server over HTTP (boto3 ``endpoint_url``), a fresh table per test. Whatever the fake does, DynamoDB does.

Why this module starts its own moto server instead of ``tests.support.moto_fixtures.moto_server``:
moto evaluates a write's condition and applies it without a lock, so two concurrent conditional
writes can both succeed (seen: 1 race in 30 with 8 threads on UpdateItem; TransactWriteItems even fails
with "dictionary changed size during iteration"). DynamoDB serialises writes to an item and isolates
transactions, and our stores rely on exactly that. This server therefore handles one request at a
time (:func:`_one_request_at_a_time`); the clients still race over HTTP. Changing the shared session
server would change it for every other test, hence a private one.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from botocore.config import Config
from hypothesis import given, settings
from hypothesis import strategies as st
from moto.server import ThreadedMotoServer

from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import GroupSizes
from rightsizer.domain.workflow_details import ScaleInDetails
from rightsizer.state import (
    REFUSAL_AT_MIN_SIZE,
    REFUSAL_BUDGET_EXHAUSTED,
    REFUSAL_SLOT_HELD,
    ConflictError,
    EvictedPod,
    Lease,
    LeaseLostError,
    LedgerEntry,
    Slot,
    SlotRefusal,
    StateStore,
    WorkflowRecord,
    lease_ttl_seconds,
)
from rightsizer.testing.dynamodb_table import create_state_table

pytestmark = pytest.mark.integration

CLUSTER = "prod-eks"
T0 = datetime(2024, 5, 14, 9, 50, 30, tzinfo=UTC)
TTL = lease_ttl_seconds(timedelta(minutes=10))  # default drain_timeout: 900 s
CEST = timezone(timedelta(hours=2))


# --------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------


def _one_request_at_a_time(app: Callable[..., Any]) -> Callable[..., Any]:
    """WSGI middleware: serialise requests so moto's conditional writes are atomic, as DynamoDB's are."""
    lock = threading.Lock()

    def serialised(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            # Materialise the body under the lock: moto may build it lazily from shared state.
            return list(app(environ, start_response))

    return serialised


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A private ``ThreadedMotoServer`` on 127.0.0.1 (OS-chosen port) handling one request at a time."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    wsgi = server._server
    assert wsgi is not None
    wsgi.app = _one_request_at_a_time(wsgi.app)
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def dynamodb(moto_endpoint: str) -> Any:
    """A DynamoDB client on the moto server, built as the wiring builds it (standard retry mode)."""
    session = boto3.session.Session(
        region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    return session.client(
        "dynamodb",
        endpoint_url=moto_endpoint,
        # Enough pooled connections for the racing threads below.
        config=Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=16),
    )


@dataclass
class Backend:
    """The store under test and, for DynamoDB, a reader of raw items (``None`` for the fake)."""

    store: StateStore
    raw: Callable[[str, str], dict[str, Any] | None] | None


@pytest.fixture(params=["fake", "real"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """A fresh, empty store of each kind bound to ``prod-eks``."""
    if request.param == "fake":
        return Backend(MemoryState(CLUSTER), None)
    client = request.getfixturevalue("dynamodb")
    table = f"rightsizer-state-{uuid.uuid4().hex[:12]}"
    create_state_table(client, table)

    def raw(pk: str, sk: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = client.get_item(
            TableName=table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True
        ).get("Item")
        return item

    return Backend(DynamoDbState(client, table, CLUSTER), raw)


@pytest.fixture
def store(backend: Backend) -> StateStore:
    """The store under test."""
    return backend.store


def race(workers: int, action: Callable[[int], Any]) -> list[Any]:
    """Run ``action(i)`` in ``workers`` threads released at the same instant; results by worker."""
    results: list[Any] = [None] * workers
    barrier = threading.Barrier(workers)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = action(index)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


# --------------------------------------------------------------------------------------------------
# Node lease
# --------------------------------------------------------------------------------------------------


def test_first_acquisition_gets_epoch_1_until_now_plus_ttl(store: StateStore) -> None:
    # GIVEN a node nobody leased  WHEN a workflow acquires it
    lease = store.acquire("gpu-node-a", "exec-1", T0, TTL)
    # THEN it holds epoch 1 until now + drain_timeout + 5 min
    assert lease == Lease(CLUSTER, "gpu-node-a", 1, "exec-1", T0 + timedelta(minutes=15))
    assert store.get("gpu-node-a") == lease
    assert store.get("gpu-node-b") is None


def test_reacquire_by_the_holder_is_idempotent(store: StateStore) -> None:
    # GIVEN exec-1 holds the lease  WHEN it acquires again later (a retried validate step)
    first = store.acquire("gpu-node-a", "exec-1", T0, TTL)
    again = store.acquire("gpu-node-a", "exec-1", T0 + timedelta(minutes=3), TTL)
    # THEN the same lease comes back: same epoch, same expiry
    assert again == first


def test_live_lease_refuses_another_owner_until_expires_at(store: StateStore) -> None:
    held = store.acquire("gpu-node-a", "exec-1", T0, TTL)
    assert held is not None
    just_before = held.expires_at - timedelta(microseconds=1)
    # WHEN another execution tries while the lease is live THEN it is refused
    assert store.acquire("gpu-node-a", "exec-2", T0, TTL) is None
    assert store.acquire("gpu-node-a", "exec-2", just_before, TTL) is None
    assert store.get("gpu-node-a") == held
    # WHEN it tries at exactly expires_at (expired means expires_at <= now) THEN it takes over, epoch 2
    taken = store.acquire("gpu-node-a", "exec-2", held.expires_at, TTL)
    assert taken == Lease(CLUSTER, "gpu-node-a", 2, "exec-2", held.expires_at + timedelta(seconds=TTL))


def test_own_expired_lease_is_a_new_acquisition_with_a_new_epoch(store: StateStore) -> None:
    first = store.acquire("gpu-node-a", "exec-1", T0, TTL)
    assert first is not None
    again = store.acquire("gpu-node-a", "exec-1", first.expires_at, TTL)
    assert again is not None and again.epoch == 2


def test_renew_only_by_the_holder_of_that_epoch(store: StateStore) -> None:
    lease = store.acquire("gpu-node-a", "exec-1", T0, TTL)
    assert lease is not None
    later = T0 + timedelta(minutes=10)
    # WHEN the holder renews THEN the expiry moves to now + ttl, the epoch stays
    renewed = store.renew("gpu-node-a", "exec-1", 1, later, TTL)
    assert renewed.epoch == 1 and renewed.expires_at == later + timedelta(seconds=TTL)
    # WHEN a wrong epoch, a wrong owner or an unknown node renews THEN the lease is lost
    with pytest.raises(LeaseLostError):
        store.renew("gpu-node-a", "exec-1", 2, later, TTL)
    with pytest.raises(LeaseLostError):
        store.renew("gpu-node-a", "exec-2", 1, later, TTL)
    with pytest.raises(LeaseLostError):
        store.renew("gpu-node-z", "exec-1", 1, later, TTL)
    # WHEN the holder renews after expiry THEN the lease is lost (a heal may have uncordoned)
    with pytest.raises(LeaseLostError):
        store.renew("gpu-node-a", "exec-1", 1, renewed.expires_at, TTL)
    # WHEN another execution took over THEN the old holder can no longer renew
    assert store.acquire("gpu-node-a", "exec-2", renewed.expires_at, TTL) is not None
    with pytest.raises(LeaseLostError):
        store.renew("gpu-node-a", "exec-1", 1, renewed.expires_at, TTL)
    assert store.renew("gpu-node-a", "exec-2", 2, renewed.expires_at, TTL).owner == "exec-2"


def test_release_by_holder_and_epochs_keep_increasing(store: StateStore) -> None:
    assert store.acquire("gpu-node-a", "exec-1", T0, TTL) is not None
    assert store.release("gpu-node-a", "exec-2", 1) is False
    assert store.release("gpu-node-a", "exec-1", 2) is False
    assert store.release("gpu-node-a", "exec-1", 1) is True
    assert store.release("gpu-node-a", "exec-1", 1) is False
    assert store.get("gpu-node-a") is None
    # THEN the next acquisition (by anyone, at once) gets epoch 2: epoch 1 never comes back
    lease = store.acquire("gpu-node-a", "exec-3", T0, TTL)
    assert lease is not None and lease.epoch == 2
    assert store.release("gpu-node-a", "exec-1", 1) is False
    assert store.release("gpu-node-z", "exec-1", 1) is False


def test_expired_lists_held_expired_leases_by_node(store: StateStore) -> None:
    store.acquire("gpu-node-c", "exec-c", T0, 60)
    store.acquire("gpu-node-a", "exec-a", T0, 60)
    store.acquire("gpu-node-b", "exec-b", T0, 3600)
    store.acquire("gpu-node-d", "exec-d", T0, 60)
    store.release("gpu-node-d", "exec-d", 1)
    assert store.expired(T0 + timedelta(seconds=59)) == []
    expired = store.expired(T0 + timedelta(seconds=60))
    assert [(lease.node, lease.owner) for lease in expired] == [
        ("gpu-node-a", "exec-a"),
        ("gpu-node-c", "exec-c"),
    ]


def test_live_lists_held_unexpired_leases_under_a_prefix_by_key(store: StateStore) -> None:
    store.acquire("nodegroup:gpu-b", "exec-1", T0, 60)
    store.acquire("nodegroup:gpu-a", "exec-1", T0, 3600)
    store.acquire("nodegroup:gpu-c", "exec-2", T0, 3600)
    store.release("nodegroup:gpu-c", "exec-2", 1)  # a tombstone: not held
    store.acquire("gpu-node-a", "exec-3", T0, 3600)  # another prefix
    live = store.live(T0 + timedelta(seconds=59), prefix="nodegroup:")
    assert [(lease.node, lease.owner) for lease in live] == [
        ("nodegroup:gpu-a", "exec-1"),
        ("nodegroup:gpu-b", "exec-1"),
    ]
    assert [lease.node for lease in store.live(T0 + timedelta(seconds=60), prefix="nodegroup:")] == [
        "nodegroup:gpu-a"
    ]
    assert [lease.node for lease in store.live(T0)] == ["gpu-node-a", "nodegroup:gpu-a", "nodegroup:gpu-b"]


def test_eight_racing_starters_exactly_one_wins(store: StateStore) -> None:
    for round_ in range(5):
        node = f"gpu-node-{round_}"

        def start(index: int, node: str = node) -> Lease | None:
            return store.acquire(node, f"exec-{index}", T0, TTL)

        results = race(8, start)
        winners = [lease for lease in results if lease is not None]
        assert len(winners) == 1, results
        assert winners[0].epoch == 1
        assert store.get(node) == winners[0]


def test_eight_racing_starters_after_expiry_exactly_one_takes_over(store: StateStore) -> None:
    stale = store.acquire("gpu-node-a", "exec-old", T0, 60)
    assert stale is not None
    results = race(8, lambda index: store.acquire("gpu-node-a", f"exec-{index}", stale.expires_at, TTL))
    winners = [lease for lease in results if lease is not None]
    assert len(winners) == 1 and winners[0].epoch == 2


def test_cancel_is_honoured_only_by_its_epoch(store: StateStore) -> None:
    # GIVEN no lease: a resolved alert is a no-op
    assert store.request_cancel("gpu-node-a", 1) is False
    assert store.get("gpu-node-a") is None
    lease = store.acquire("gpu-node-a", "exec-1", T0, TTL)
    assert lease is not None
    # WHEN a cancel names another epoch THEN nothing is recorded
    assert store.request_cancel("gpu-node-a", 2) is False
    assert store.renew("gpu-node-a", "exec-1", 1, T0, TTL).cancel_requested is False
    # WHEN a cancel names the held epoch THEN the holder sees it on its next renew
    assert store.request_cancel("gpu-node-a", 1) is True
    assert store.renew("gpu-node-a", "exec-1", 1, T0, TTL).cancel_requested is True
    # WHEN the lease expires and a new epoch starts THEN the old cancel does not apply to it
    taken = store.acquire("gpu-node-a", "exec-2", lease.expires_at, TTL)
    assert taken is not None and taken.epoch == 2 and taken.cancel_requested is False
    assert store.request_cancel("gpu-node-a", 1) is False
    assert store.get("gpu-node-a") == taken
    # WHEN released THEN a cancel is a no-op again
    assert store.release("gpu-node-a", "exec-2", 2) is True
    assert store.request_cancel("gpu-node-a", 2) is False


def test_naive_datetimes_are_refused(store: StateStore) -> None:
    naive = datetime(2024, 5, 14, 9, 50)  # noqa: DTZ001 - the point of the test
    with pytest.raises(ValueError, match="timezone-aware"):
        store.acquire("gpu-node-a", "exec-1", naive, TTL)


def test_times_come_back_in_utc_whatever_zone_went_in(store: StateStore) -> None:
    lease = store.acquire("gpu-node-a", "exec-1", T0.astimezone(CEST), TTL)
    assert lease is not None and lease.expires_at.utcoffset() == timedelta(0)
    assert lease.expires_at == T0 + timedelta(seconds=TTL)


# --------------------------------------------------------------------------------------------------
# Budget slots
# --------------------------------------------------------------------------------------------------


def take(
    store: StateStore,
    node: str,
    *,
    group: str = "gpu-a10g",
    owner: str | None = None,
    max_per_run: int = 5,
    max_per_group: int = 5,
    desired: int = 10,
    min_size: int = 0,
) -> Slot | SlotRefusal:
    """``take_slot`` with roomy defaults; owner defaults to ``exec-<node>``."""
    return store.take_slot(
        group,
        node,
        owner or f"exec-{node}",
        T0,
        max_per_run=max_per_run,
        max_per_group=max_per_group,
        desired=desired,
        min_size=min_size,
    )


def test_slot_granted_and_listed(store: StateStore) -> None:
    slot = take(store, "gpu-node-a")
    assert slot == Slot(CLUSTER, "gpu-a10g", "gpu-node-a", "exec-gpu-node-a", T0)
    assert store.slots() == [slot]


def test_max_nodes_per_run_counts_every_group_of_the_cluster(store: StateStore) -> None:
    assert isinstance(take(store, "gpu-node-a", group="gpu-a10g", max_per_run=1), Slot)
    refused = take(store, "gpu-node-b", group="gpu-l4", max_per_run=1)
    assert isinstance(refused, SlotRefusal)
    assert refused.reason == REFUSAL_BUDGET_EXHAUSTED and CLUSTER in refused.detail
    assert isinstance(take(store, "gpu-node-b", group="gpu-l4", max_per_run=2), Slot)


def test_max_nodes_per_node_group(store: StateStore) -> None:
    assert isinstance(take(store, "gpu-node-a", max_per_group=1), Slot)
    refused = take(store, "gpu-node-b", max_per_group=1)
    assert isinstance(refused, SlotRefusal)
    assert refused.reason == REFUSAL_BUDGET_EXHAUSTED and "gpu-a10g" in refused.detail
    assert isinstance(take(store, "gpu-node-c", group="gpu-l4", max_per_group=1), Slot)


def test_desired_minus_held_minus_one_must_stay_at_or_above_min_size(store: StateStore) -> None:
    # GIVEN the BUG-23 group: min 1, desired 3
    assert isinstance(take(store, "gpu-node-a", desired=3, min_size=1), Slot)  # 3 − 0 − 1 = 2 ≥ 1
    assert isinstance(take(store, "gpu-node-b", desired=3, min_size=1), Slot)  # 3 − 1 − 1 = 1 ≥ 1
    refused = take(store, "gpu-node-c", desired=3, min_size=1)  # 3 − 2 − 1 = 0 < 1
    assert isinstance(refused, SlotRefusal) and refused.reason == REFUSAL_AT_MIN_SIZE
    # AND a group already at its minimum gets nothing, even with no slot held
    at_min = take(store, "gpu-node-x", group="gpu-l4", desired=1, min_size=1)
    assert isinstance(at_min, SlotRefusal) and at_min.reason == REFUSAL_AT_MIN_SIZE


def test_min_size_is_reported_before_the_budget(store: StateStore) -> None:
    assert isinstance(take(store, "gpu-node-a", max_per_run=1), Slot)
    refused = take(store, "gpu-node-b", max_per_run=1, desired=2, min_size=1)
    assert isinstance(refused, SlotRefusal) and refused.reason == REFUSAL_AT_MIN_SIZE


def test_zero_budget_refuses(store: StateStore) -> None:
    refused = take(store, "gpu-node-a", max_per_run=0)
    assert isinstance(refused, SlotRefusal) and refused.reason == REFUSAL_BUDGET_EXHAUSTED
    refused = take(store, "gpu-node-a", max_per_group=0)
    assert isinstance(refused, SlotRefusal) and refused.reason == REFUSAL_BUDGET_EXHAUSTED
    assert store.slots() == []


def test_retake_by_the_holder_is_idempotent_whatever_the_limits(store: StateStore) -> None:
    first = take(store, "gpu-node-a", max_per_run=1, max_per_group=1, desired=3, min_size=1)
    assert isinstance(first, Slot)
    # WHEN the same execution asks again (limits now full, later, other sizes) THEN it gets its slot
    again = store.take_slot(
        "gpu-a10g",
        "gpu-node-a",
        "exec-gpu-node-a",
        T0 + timedelta(minutes=1),
        max_per_run=1,
        max_per_group=1,
        desired=2,
        min_size=1,
    )
    assert again == first
    assert store.slots() == [first]
    # WHEN another execution asks for the same node THEN it is refused
    other = take(store, "gpu-node-a", owner="exec-other")
    assert isinstance(other, SlotRefusal) and other.reason == REFUSAL_SLOT_HELD


def test_release_slot_frees_the_budget(store: StateStore) -> None:
    assert isinstance(take(store, "gpu-node-a", max_per_run=1), Slot)
    assert store.release_slot("gpu-node-a", "exec-someone-else") is False
    assert store.release_slot("gpu-node-z", "exec-gpu-node-a") is False
    assert store.release_slot("gpu-node-a", "exec-gpu-node-a") is True
    assert store.release_slot("gpu-node-a", "exec-gpu-node-a") is False
    assert store.slots() == []
    assert isinstance(take(store, "gpu-node-b", max_per_run=1), Slot)


def test_reap_releases_slots_whose_lease_is_not_alive(store: StateStore) -> None:
    # GIVEN three slots: a live lease, an expired lease, and a lease taken over by another execution
    store.acquire("gpu-node-a", "exec-gpu-node-a", T0, TTL)
    store.acquire("gpu-node-b", "exec-gpu-node-b", T0, 60)
    store.acquire("gpu-node-c", "exec-gpu-node-c", T0, 60)
    store.acquire("gpu-node-c", "exec-new", T0 + timedelta(seconds=60), TTL)
    for node in ("gpu-node-a", "gpu-node-b", "gpu-node-c"):
        assert isinstance(take(store, node, max_per_run=3), Slot)
    # WHEN the assessment reaps at T0 + 2 min
    reaped = store.reap_slots(T0 + timedelta(minutes=2))
    # THEN only the slots without a live lease of their owner are released
    assert [slot.node for slot in reaped] == ["gpu-node-b", "gpu-node-c"]
    assert [slot.node for slot in store.slots()] == ["gpu-node-a"]
    assert store.reap_slots(T0 + timedelta(minutes=2)) == []
    # AND a slot whose node was never leased is reaped too (lease first, then slot)
    assert isinstance(take(store, "gpu-node-d", max_per_run=3), Slot)
    assert [slot.node for slot in store.reap_slots(T0)] == ["gpu-node-d"]


def test_racing_takes_never_exceed_the_group_budget(store: StateStore) -> None:
    results = race(8, lambda index: take(store, f"gpu-node-{index}", max_per_group=2, desired=10))
    granted = [result for result in results if isinstance(result, Slot)]
    refused = [result for result in results if isinstance(result, SlotRefusal)]
    assert len(granted) == 2 and len(refused) == 6
    assert {result.reason for result in refused} == {REFUSAL_BUDGET_EXHAUSTED}
    assert sorted(slot.node for slot in store.slots()) == sorted(slot.node for slot in granted)


# --------------------------------------------------------------------------------------------------
# Ledger
# --------------------------------------------------------------------------------------------------


def entry(execution_id: str, node: str | None, step: str, at: datetime, **overrides: Any) -> LedgerEntry:
    """A ledger entry of a scale-in step with BUG-23-like savings."""
    fields: dict[str, Any] = {
        "execution_id": execution_id,
        "node": node,
        "instance_id": "i-0abc" if node else None,
        "node_group": "gpu-a10g",
        "kind": "scale_in",
        "step": step,
        "result": "applied",
        "reason": "idle_window_clean",
        "hourly_savings_usd": 1.212,
        "monthly_savings_usd": 884.76,
        "at": at,
    }
    fields.update(overrides)
    return LedgerEntry(**fields)


def test_ledger_lists_newest_last_and_filters(store: StateStore) -> None:
    late = entry("exec-1", "gpu-node-a", "remove", T0 + timedelta(minutes=9))
    early = entry("exec-1", "gpu-node-a", "cordon", T0 + timedelta(minutes=1))
    other = entry("exec-2", "gpu-node-b", "cordon", T0 + timedelta(minutes=5), result="dry_run")
    group_action = entry("exec-3", None, "scale", T0, kind="scale_node_group", hourly_savings_usd=None)
    for item in (late, early, other, group_action):
        assert store.record(item) is True
    assert store.entries() == [group_action, early, other, late]
    assert store.entries(execution_id="exec-1") == [early, late]
    assert store.entries(node="gpu-node-b") == [other]
    assert store.entries(execution_id="exec-1", node="gpu-node-b") == []
    assert store.entries(execution_id="exec-404") == []


def test_ledger_entry_carries_ttl_and_exact_savings(backend: Backend) -> None:
    store = backend.store
    written = entry("exec-1", "gpu-node-a", "remove", T0.astimezone(CEST), hourly_savings_usd=0.1 + 0.2)
    store.record(written)
    [stored] = store.entries(execution_id="exec-1")
    assert stored == written
    assert stored.hourly_savings_usd == 0.1 + 0.2 and stored.monthly_savings_usd == 884.76
    assert stored.at == T0 and stored.ttl == int((T0 + timedelta(days=90)).timestamp())
    if backend.raw is not None:
        raw = backend.raw("ledger#exec-1", f"entry#{written.entry_id}")
        assert raw is not None
        assert raw["ttl"] == {"N": str(stored.ttl)}
        assert raw["monthly_savings_usd"] == {"N": "884.76"}


def test_a_replacement_s_entry_keeps_how_many_instances_it_saves_for(backend: Backend) -> None:
    store = backend.store
    group = entry("exec-r", "nodegroup:gpu-a10g", "ng_gone", T0, kind="replace_node_group", instance_id=None,
                  hourly_savings_usd=9.332, instances=2)  # fmt: skip
    single = entry("exec-s", "gpu-node-a", "remove", T0)
    store.record(group)
    store.record(single)
    assert store.entries(execution_id="exec-r") == [group] and group.instances == 2
    assert store.entries(execution_id="exec-s")[0].instances is None
    if backend.raw is not None:
        raw = backend.raw("ledger#exec-r", f"entry#{group.entry_id}")
        assert raw is not None and raw["instances"] == {"N": "2"}
        single_raw = backend.raw("ledger#exec-s", f"entry#{single.entry_id}")
        assert single_raw is not None and "instances" not in single_raw


def test_recording_the_same_outcome_twice_keeps_one_entry(store: StateStore) -> None:
    first = entry("exec-1", "gpu-node-a", "remove", T0)
    retry = entry("exec-1", "gpu-node-a", "remove", T0 + timedelta(minutes=2))
    assert first.entry_id == retry.entry_id
    assert store.record(first) is True
    assert store.record(retry) is False
    assert store.entries(execution_id="exec-1") == [first]
    # AND an explicit entry id records a repeated outcome
    assert store.record(entry("exec-1", "gpu-node-a", "remove", T0, entry_id="attempt-2")) is True
    assert len(store.entries(execution_id="exec-1")) == 2


def test_ledger_refuses_an_unknown_result() -> None:
    with pytest.raises(ValueError, match="ledger result"):
        entry("exec-1", "gpu-node-a", "remove", T0, result="done")


# --------------------------------------------------------------------------------------------------
# Workflow records (BUG-32)
# --------------------------------------------------------------------------------------------------


def record(**overrides: Any) -> WorkflowRecord:
    """The BUG-32 drain of gpu-node-k, in evict, one pod evicted."""
    fields: dict[str, Any] = {
        "execution_id": "exec-k",
        "node": "gpu-node-k",
        "instance_id": "i-0k",
        "step": "evict",
        "status": "running",
        "started_at": T0,
        "deadline": T0 + timedelta(minutes=10),
        "cordoned_at": T0 + timedelta(seconds=1),
        "evicted": (EvictedPod("uid-1", "ml", "trainer-2", T0 + timedelta(seconds=961)),),
        "lease_epoch": 1,
    }
    fields.update(overrides)
    return WorkflowRecord(**fields)


def test_workflow_record_round_trip_and_versions(store: StateStore) -> None:
    assert store.load("exec-k") is None
    saved = store.save(record(step="cordon", cordoned_at=None, evicted=()), expected_version=0)
    assert saved.version == 1
    assert store.load("exec-k") == saved
    progressed = store.save(record(started_at=T0.astimezone(CEST)), expected_version=1)
    assert progressed.version == 2 and progressed.started_at == T0
    assert store.load("exec-k") == progressed == record(version=2)


def test_workflow_record_stale_version_conflicts(store: StateStore) -> None:
    store.save(record(), expected_version=0)
    store.save(record(step="wait"), expected_version=1)
    # WHEN a second invocation saves from the version it read earlier THEN ConflictError, nothing written
    with pytest.raises(ConflictError) as stale:
        store.save(record(step="remove"), expected_version=1)
    assert (stale.value.expected, stale.value.actual) == (1, 2)
    with pytest.raises(ConflictError):
        store.save(record(step="remove"), expected_version=0)
    loaded = store.load("exec-k")
    assert loaded is not None and (loaded.step, loaded.version) == ("wait", 2)
    # AND a version for a record that does not exist conflicts too
    with pytest.raises(ConflictError) as missing:
        store.save(record(execution_id="exec-new"), expected_version=3)
    assert missing.value.actual is None


def test_racing_saves_of_one_version_one_wins(store: StateStore) -> None:
    store.save(record(), expected_version=0)

    def save(index: int) -> bool:
        try:
            store.save(record(step=f"step-{index}"), expected_version=1)
        except ConflictError:
            return False
        return True

    assert sum(race(8, save)) == 1


# --------------------------------------------------------------------------------------------------
# Off-hours saved sizes
# --------------------------------------------------------------------------------------------------


def test_sizes_are_saved_once_and_never_overwritten(backend: Backend) -> None:
    store = backend.store
    original = GroupSizes(min=1, desired=3, max=6)
    saved = store.save_sizes("gpu-a10g", original, T0)
    assert (saved.group, saved.sizes, saved.saved_at, saved.restore_started_at) == (
        "gpu-a10g",
        original,
        T0,
        None,
    )
    # WHEN a second going-down run saves the already-reduced sizes THEN the original stays
    again = store.save_sizes("gpu-a10g", GroupSizes(min=0, desired=1, max=6), T0 + timedelta(hours=1))
    assert again == saved
    assert store.get_sizes("gpu-a10g") == saved
    assert store.get_sizes("gpu-l4") is None
    if backend.raw is not None:
        raw = backend.raw(f"offhours#{CLUSTER}#gpu-a10g", "sizes")
        assert raw is not None and "ttl" not in raw
        assert (raw["min_size"], raw["desired_size"], raw["max_size"]) == ({"N": "1"}, {"N": "3"}, {"N": "6"})


def test_restore_started_at_is_recorded_once(store: StateStore) -> None:
    assert store.mark_restore_started("gpu-a10g", T0) is None
    store.save_sizes("gpu-a10g", GroupSizes(min=1, desired=3, max=6), T0)
    first = store.mark_restore_started("gpu-a10g", T0 + timedelta(hours=10))
    assert first is not None and first.restore_started_at == T0 + timedelta(hours=10)
    again = store.mark_restore_started("gpu-a10g", T0 + timedelta(hours=11))
    assert again == first == store.get_sizes("gpu-a10g")


def test_forget_sizes_then_a_new_night_saves_again(store: StateStore) -> None:
    assert store.forget_sizes("gpu-a10g") is False
    store.save_sizes("gpu-a10g", GroupSizes(min=1, desired=3, max=6), T0)
    assert store.forget_sizes("gpu-a10g") is True
    assert store.get_sizes("gpu-a10g") is None
    fresh = store.save_sizes("gpu-a10g", GroupSizes(min=1, desired=2, max=6), T0 + timedelta(days=1))
    assert fresh.sizes == GroupSizes(min=1, desired=2, max=6)


def test_group_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="min ≤ desired ≤ max"):
        GroupSizes(min=2, desired=1, max=6)


# --------------------------------------------------------------------------------------------------
# DynamoDB adapter only: errors leave as the taxonomy
# --------------------------------------------------------------------------------------------------


def test_missing_table_fails_closed_as_config_error(dynamodb: Any) -> None:
    store = DynamoDbState(dynamodb, "no-such-table", CLUSTER)
    with pytest.raises(ConfigError, match="no-such-table"):
        store.acquire("gpu-node-a", "exec-1", T0, TTL)
    with pytest.raises(ConfigError):
        store.take_slot(
            "gpu-a10g", "gpu-node-a", "exec-1", T0, max_per_run=1, max_per_group=1, desired=3, min_size=1
        )


# --------------------------------------------------------------------------------------------------
# Property (fake): random interleavings of take/release never exceed the limits
# --------------------------------------------------------------------------------------------------

_GROUPS = ("gpu-a10g", "gpu-l4", "gpu-h100")
#: (take|release, group index, node index, owner index, owner is the node's usual execution)
_op = st.tuples(
    st.sampled_from(["take", "release"]),
    st.integers(0, 2),
    st.integers(0, 7),
    st.integers(0, 2),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    max_per_run=st.integers(0, 4),
    max_per_group=st.integers(0, 3),
    group_sizes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=len(_GROUPS), max_size=len(_GROUPS)
    ),
    ops=st.lists(_op, max_size=40),
)
def test_property_take_release_never_exceed_the_limits(
    max_per_run: int, max_per_group: int, group_sizes: list[tuple[int, int]], ops: list[Any]
) -> None:
    store = MemoryState(CLUSTER)
    sizes = {
        group: (min_size, min_size + extra)
        for group, (min_size, extra) in zip(_GROUPS, group_sizes, strict=True)
    }
    node_group: dict[str, str] = {}
    for kind, group_index, node_index, owner_index, same_owner in ops:
        node = f"gpu-node-{node_index}"
        # A node belongs to one group for the whole run, as in a cluster.
        group = node_group.setdefault(node, _GROUPS[group_index])
        owner = f"exec-{node}" if same_owner else f"exec-{owner_index}"
        min_size, desired = sizes[group]
        before = store.slots()
        if kind == "take":
            result = store.take_slot(
                group,
                node,
                owner,
                T0,
                max_per_run=max_per_run,
                max_per_group=max_per_group,
                desired=desired,
                min_size=min_size,
            )
            in_group = sum(1 for slot in before if slot.group == group)
            held = next((slot for slot in before if slot.node == node), None)
            if held is not None:
                # An existing slot is returned to its owner, refused to anyone else.
                if held.owner == owner:
                    assert result == held
                else:
                    assert isinstance(result, SlotRefusal) and result.reason == REFUSAL_SLOT_HELD
            elif isinstance(result, SlotRefusal):
                # No false refusal: the named limit really is reached.
                if result.reason == REFUSAL_AT_MIN_SIZE:
                    assert desired - in_group - 1 < min_size
                else:
                    assert result.reason == REFUSAL_BUDGET_EXHAUSTED
                    assert len(before) >= max_per_run or in_group >= max_per_group
            else:
                assert desired - in_group - 1 >= min_size
                assert len(before) < max_per_run and in_group < max_per_group
        else:
            store.release_slot(node, owner)
        after = store.slots()
        assert len(after) <= max_per_run
        for name, (min_size, desired) in sizes.items():
            held_in_group = sum(1 for slot in after if slot.group == name)
            assert held_in_group <= max_per_group
            assert desired - held_in_group >= min_size


def test_workflow_record_details_round_trip_and_are_not_shared(store: StateStore) -> None:
    details = ScaleInDetails(
        asg="eks-gpu-a10g", validated_pods=("uid-1", "uid-2"), attempts={"uid-1": 2}, dry_run=False
    )
    store.save(record(details=details), expected_version=0)
    loaded = store.load("exec-k")
    assert loaded is not None and loaded.details == details
    assert loaded.details.stored() == {
        "asg": "eks-gpu-a10g", "validated_pods": ["uid-1", "uid-2"], "attempts": {"uid-1": 2}, "dry_run": False
    }  # fmt: skip
    loaded.details.attempts["uid-1"] = 99
    again = store.load("exec-k")
    assert again is not None and isinstance(again.details, ScaleInDetails)
    assert again.details.attempts == {"uid-1": 2}


def test_workflow_records_expire_with_dynamodb_ttl_after_the_ledger_retention(backend: Backend) -> None:
    backend.store.save(record(), expected_version=0)
    if backend.raw is not None:
        raw = backend.raw("wf#exec-k", "wf")
        assert raw is not None
        assert int(raw["ttl"]["N"]) == int((T0 + timedelta(days=90)).timestamp())

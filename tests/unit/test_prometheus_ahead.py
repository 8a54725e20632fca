"""Prometheus answers read ahead of the join (``adapters.prometheus_ahead``, issue 33 item 2).

The live assessment hands ``collect_live`` its joiner as a ``Future`` and lists the Pods while the
queries run: every query goes out before the join is known, the answers wait (bounded), and the signals
are those of a collection given the joiner at once; a failed Kubernetes read stops the queries.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from rightsizer.adapters.prometheus import PrometheusClient, collect_live, plan_queries
from rightsizer.adapters.prometheus_ahead import ReadAhead
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import CollectedSignals, Window
from tests.builders import AT, STEP, gpu_node, snapshot
from tests.unit.test_prometheus_in_flight import Counting, collect_serial, counting_server, large_first_answer

WINDOW = Window.ending(AT, Policy().idle_window, STEP)


def _joiner() -> NodeJoiner:
    base = snapshot([gpu_node("gpu-a", ip="10.0.0.5")], [])
    return NodeJoiner(base.nodes, base.pods)


def test_every_query_goes_out_before_the_join_and_the_signals_are_the_same() -> None:
    answers = large_first_answer()  # > 1 MiB first: the rest go 4 at a time, all held
    counting = Counting()
    counting.script.by_query = answers
    joiner: Future[NodeJoiner] = Future()
    done: list[CollectedSignals | BaseException] = []
    with counting_server(counting) as url, PrometheusClient(url, retries=0) as client:

        def run() -> None:
            try:
                done.append(collect_live(client, joiner, WINDOW, Policy()))
            except BaseException as exc:  # pragma: no cover - shown by the assertion below
                done.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 30
        while len(counting.script.seen) < len(plan_queries(WINDOW)) and time.monotonic() < deadline:
            time.sleep(0.02)
        thread.join(timeout=0.3)  # answered: it would end now if it did not wait for the join
        asked = len(counting.script.seen)
        waiting = thread.is_alive()
        joiner.set_result(_joiner())
        thread.join(timeout=30)

    assert (asked, waiting) == (len(plan_queries(WINDOW)), True)  # all asked, none reduced yet
    signals = done[0]
    assert isinstance(signals, CollectedSignals)
    assert signals == collect_serial(answers)
    assert len(signals.unmapped) == 1600


def test_a_failed_kubernetes_read_stops_the_queries() -> None:
    counting = Counting()
    counting.script.by_query = large_first_answer()
    joiner: Future[NodeJoiner] = Future()
    joiner.set_exception(TimeoutError("pods list timed out"))
    with (
        counting_server(counting) as url,
        PrometheusClient(url, retries=0) as client,
        pytest.raises(TimeoutError, match="pods list timed out"),
    ):
        collect_live(client, joiner, WINDOW, Policy())
    assert counting.script.seen == []


def test_answers_beyond_the_budget_wait_for_the_joiner_and_the_wait_is_counted() -> None:
    now = [0.0]
    joiner: Future[NodeJoiner] = Future()
    made: list[NodeJoiner] = []
    ahead: ReadAhead[str, int] = ReadAhead(
        joiner, lambda j: made.append(j) or len(made), budget=10, clock=lambda: now[0]
    )

    assert ahead.hold("first", b"12345") and ahead.hold("second", b"678")
    assert not ahead.hold("third", b"abc")  # 11 bytes > 10: the caller must drain (and wait)
    assert not ahead.failed()

    drained: list[Any] = []
    waiter = threading.Thread(target=lambda: drained.append(ahead.drain()))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and drained == []  # waiting for the join
    now[0] = 7.0
    joiner.set_result(_joiner())
    waiter.join(timeout=5)

    assert drained == [[("first", b"12345"), ("second", b"678")]]
    assert ahead.waited == 7.0 and ahead.made() == 1 and len(made) == 1
    assert not ahead.hold("fourth", b"x")  # the join is known: reduce at once
    assert ahead.drain() == []


def test_a_joiner_given_at_once_holds_nothing() -> None:
    ahead: ReadAhead[str, NodeJoiner] = ReadAhead(_joiner(), lambda j: j)
    assert not ahead.hold("a", b"x") and ahead.drain() == [] and not ahead.failed()
    failed: Future[NodeJoiner] = Future()
    failed.set_exception(RuntimeError("403"))
    broken: ReadAhead[str, NodeJoiner] = ReadAhead(failed, lambda j: j)
    assert broken.failed() and not broken.hold("a", b"x")
    with pytest.raises(RuntimeError, match="403"):
        broken.made()


def test_a_wait_under_way_is_already_left_out_of_prometheus_time() -> None:
    """``collect_live`` reads ``waited`` outside its lock while one thread waits for the join (a query
    failing meanwhile is judged against the deadline): the wait so far must already be left out, or a
    long Pods list turns one failed query into a false ``deadline`` expiry of the whole read."""
    now = [0.0]
    asked = threading.Event()

    def clock() -> float:
        asked.set()  # made() reads the clock as its wait begins
        return now[0]

    joiner: Future[NodeJoiner] = Future()
    ahead: ReadAhead[str, NodeJoiner] = ReadAhead(joiner, lambda j: j, budget=1, clock=clock)
    assert not ahead.hold("big", b"too large")
    waiter = threading.Thread(target=ahead.made)
    waiter.start()
    assert asked.wait(5)
    now[0] = 40.0  # the Pods list still under way
    during = ahead.waited
    joiner.set_result(_joiner())
    waiter.join(timeout=5)
    now[0] = 50.0  # Prometheus' own time again
    assert (during, ahead.waited) == (40.0, 40.0)

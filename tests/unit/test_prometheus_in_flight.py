"""How many queries ``collect_live`` keeps in flight, against a real ``http.server`` that counts them.

One at a time while every answer is small and quick (a small fleet: threads would cost Prometheus and the
client more CPU than they save time), ``max_workers`` at a time from the first answer larger than
``SERIAL_BYTES`` or request slower than ``SERIAL_SECONDS`` (a large fleet or a slow server); the signals
are the same either way, and ``max_workers=1`` always asks one at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from rightsizer.adapters.prometheus import (
    SERIAL_BYTES,
    SERIAL_SECONDS,
    PrometheusClient,
    collect_live,
    plan_queries,
)
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import GPU_UTIL, CollectedSignals, Window
from tests.builders import AT, STEP, gpu_node, snapshot
from tests.support.http_serve import reply, serving
from tests.unit.test_prometheus_unit import Script, Seen, _matrix, _query, _steps, idle_answers

PAUSE = 0.05  # every answer waits this long, so requests sent together overlap at the server


@dataclass
class Counting:
    """A scripted Prometheus that records the most requests it held at once."""

    script: Script = field(default_factory=Script)
    in_flight: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def counting_server(counting: Counting) -> Iterator[str]:
    """Serve ``counting.script`` on 127.0.0.1, counting the requests held at once; yields the URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            with counting.lock:
                counting.in_flight += 1
                counting.most = max(counting.most, counting.in_flight)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            status, headers, payload, delay = counting.script.reply(seen)
            time.sleep(max(delay, PAUSE))
            with counting.lock:  # before answering: the client's next request cannot overlap this one
                counting.in_flight -= 1
            reply(self, status, headers, payload)

        def log_message(self, *_args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url


@pytest.fixture
def server() -> Iterator[tuple[str, Counting]]:
    counting = Counting()
    with counting_server(counting) as url:
        yield url, counting


def collect(url: str, answers: dict[str, Any], counting: Counting, max_workers: int) -> CollectedSignals:
    counting.script.by_query = answers
    policy = Policy()
    window = Window.ending(AT, policy.idle_window, STEP)
    base = snapshot([gpu_node("gpu-a", ip="10.0.0.5")], [])
    with PrometheusClient(url, retries=0) as client:
        signals = collect_live(
            client, NodeJoiner(base.nodes, base.pods), window, policy, max_workers=max_workers
        )
    assert len(counting.script.seen) == len(plan_queries(window))
    assert plan(replace(base, signals=signals), policy).nodes[0].verdict == "idle"
    return signals


def large_first_answer() -> dict[str, Any]:
    """The healthy idle answers, with the per-step activity answer (asked first) over ``SERIAL_BYTES``:
    series of 1,600 other nodes' GPUs, which the join leaves unmapped."""
    answers = idle_answers()
    key = _query(GPU_UTIL, "step")
    steps = _steps("0")
    other = [({"node": f"other-{i:04d}", "gpu": "0", "UUID": f"GPU-o{i}"}, steps) for i in range(1600)]
    answers[key] = _matrix([*((labels, steps) for labels in _devices()), *other])
    assert len(answers[key][2]) > SERIAL_BYTES
    return answers


def _devices() -> list[dict[str, str]]:
    return [
        {"node": "gpu-a", "gpu": str(g), "UUID": f"GPU-{g}", "instance": "10.1.0.1:9400"} for g in range(4)
    ]


def test_small_answers_are_asked_one_at_a_time_with_the_same_signals(server: tuple[str, Counting]) -> None:
    url, counting = server
    signals = collect(url, idle_answers(), counting, max_workers=4)
    assert counting.most == 1
    assert signals == collect_serial(idle_answers())


def test_after_a_large_answer_the_rest_go_max_workers_at_a_time(server: tuple[str, Counting]) -> None:
    url, counting = server
    answers = large_first_answer()
    signals = collect(url, answers, counting, max_workers=4)
    assert counting.script.seen[0].form["query"] == _query(GPU_UTIL, "step")
    assert 1 < counting.most <= 4
    assert len(signals.unmapped) == 1600
    assert signals.devices == collect_serial(answers).devices


def test_after_a_slow_answer_the_rest_go_max_workers_at_a_time(server: tuple[str, Counting]) -> None:
    url, counting = server
    answers = idle_answers()
    key = _query(GPU_UTIL, "step")
    answers[key] = (*answers[key][:3], SERIAL_SECONDS + 0.2)
    collect(url, answers, counting, max_workers=4)
    assert counting.script.seen[0].form["query"] == key
    assert 1 < counting.most <= 4


def test_max_workers_one_asks_one_at_a_time_whatever_the_answers(server: tuple[str, Counting]) -> None:
    url, counting = server
    collect(url, large_first_answer(), counting, max_workers=1)
    assert counting.most == 1


def collect_serial(answers: dict[str, Any]) -> CollectedSignals:
    """The signals of ``answers`` asked one at a time (``max_workers=1``) from a server of their own."""
    alone = Counting()
    with counting_server(alone) as url:
        signals = collect(url, answers, alone, max_workers=1)
    assert alone.most == 1
    return signals

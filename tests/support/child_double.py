"""Kubernetes API doubles served from forked child processes, so a test's memory figures count only the
client (tests of bounded memory: test_paged_lists, test_snapshot_memory)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any


def child_doubles(serve: Callable[[int, Connection], None]) -> Iterator[Callable[[int], str]]:
    """Yield ``start(size) -> base URL``, each call forking a child that runs ``serve(size, conn)``.

    ``serve`` sends the double's base URL on ``conn`` and keeps serving until it receives a message; on
    exit every child is told to stop and joined (at most 30 s each). Use from a fixture:
    ``yield from child_doubles(_serve)``.
    """
    ctx = multiprocessing.get_context("fork")
    started: list[tuple[Any, Connection]] = []

    def start(size: int) -> str:
        parent, child = ctx.Pipe()
        process = ctx.Process(target=serve, args=(size, child), daemon=True)
        process.start()
        started.append((process, parent))
        return str(parent.recv())

    yield start
    for process, conn in started:
        conn.send("stop")
        process.join(timeout=30)


def answer_commands(double: Any, conn: Connection, count: Callable[[], object]) -> None:
    """The child's side of ``conn`` once its double serves: "count" is answered with ``count()``,
    "clear" forgets the double's recorded requests (answered with None), ``("bind", role)`` binds that
    ClusterRole (``KubernetesDouble.bind_cluster_role``: the next requests are one function's identity;
    answered with None), and any other message stops the double, is answered with None and returns
    (benchmarks/validate_scale.py, k8s_lists_scale.py)."""
    while True:
        command = conn.recv()
        if isinstance(command, tuple) and command[0] == "bind":
            double.bind_cluster_role(command[1])
            conn.send(None)
        elif command == "count":
            conn.send(count())
        elif command == "clear":
            double.clear_requests()
            conn.send(None)
        else:
            double.stop()
            conn.send(None)
            return

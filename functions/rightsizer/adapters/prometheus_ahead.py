"""Prometheus answers read ahead of the join (issue 33 item 2).

``collect_live`` may be handed the node joiner as a ``Future``: the live assessment then starts its
queries as soon as the Nodes are listed (the shards need only the GPU node count) and lists the Pods, the
budgets and the volumes while Prometheus works. Answers cannot be reduced before the join is known (a
series maps to a node only when every join method agrees, and the Pods are one of them), so they are held
as raw bytes, at most :data:`READ_AHEAD_BYTES`, and reduced in arrival order once it is; beyond that budget
the collection waits for the join, so the client's memory stays bounded whatever the fleet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final, Generic, TypeVar

from rightsizer.domain.join import NodeJoiner

__all__ = ["READ_AHEAD_BYTES", "ReadAhead"]

#: Raw answers held while the join is not known. At 10,000 GPU nodes × 8 the answers total ~420 MiB
#: (``benchmarks/collect_scale.py``) and the Kubernetes read peaks at ~390 MiB before they are reduced
#: (``benchmarks/assess_memory.py``, whose whole run peaks at ~760 MiB): a third of the answers held
#: keeps the read's peak under the run's.
READ_AHEAD_BYTES: Final = 128 << 20

T = TypeVar("T")
Item = TypeVar("Item")


class ReadAhead(Generic[Item, T]):
    """What ``make`` builds from the joiner (the reducer), and the answers held until it can be built.

    Not thread-safe: the caller serializes every call (``collect_live`` holds its lock).

    Args:
        joiner: the joiner, or a ``Future`` of it (set by the caller once its Kubernetes read is done, or
            failed with that read's exception).
        make: builds what answers are fed to, from the joiner (called once).
        budget: bytes of answers held at most while the joiner is not known.
        clock: monotonic seconds (tests).

    Read :attr:`waited` from any thread (``collect_live``'s deadline is read outside its lock).
    """

    def __init__(
        self,
        joiner: NodeJoiner | Future[NodeJoiner],
        make: Callable[[NodeJoiner], T],
        budget: int = READ_AHEAD_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._future = joiner if isinstance(joiner, Future) else None
        self._make = make
        self._made: T | None = make(joiner) if isinstance(joiner, NodeJoiner) else None
        self._budget = budget
        self._clock = clock
        self._held: list[tuple[Item, bytes]] = []
        self._bytes = 0
        self._waited = 0.0
        self._since: float | None = None  # when the wait under way began
        self._clock_lock = threading.Lock()

    @property
    def waited(self) -> float:
        """Seconds spent waiting for the joiner, including a wait still under way (not Prometheus' time:
        ``collect_live`` leaves it out of ``prometheus.deadline``; a query failing while another thread
        waits is then judged on Prometheus' time alone, not taken for an expired deadline)."""
        with self._clock_lock:
            since = self._since
            return self._waited + (0.0 if since is None else self._clock() - since)

    def failed(self) -> bool:
        """Whether the joiner will never come (the Kubernetes read failed): ask nothing more."""
        future = self._future
        return future is not None and future.done() and future.exception() is not None

    def hold(self, item: Item, content: bytes) -> bool:
        """Keep ``content`` (with ``item``, what it answers) when the joiner is not known yet and the
        budget allows; False: the caller reduces it now (after :meth:`drain`)."""
        if self._made is not None or (self._future is not None and self._future.done()):
            return False
        if self._bytes + len(content) > self._budget:
            return False
        self._held.append((item, content))
        self._bytes += len(content)
        return True

    def made(self) -> T:
        """What ``make`` built, waiting for the joiner first if need be.

        Raises:
            Exception: the one the joiner's ``Future`` failed with.
        """
        if self._made is None:
            assert self._future is not None
            with self._clock_lock:
                self._since = self._clock()
            try:
                joiner = self._future.result()
            finally:
                with self._clock_lock:
                    assert self._since is not None
                    self._waited += self._clock() - self._since
                    self._since = None
            self._made = self._make(joiner)
        return self._made

    def drain(self) -> list[tuple[Item, bytes]]:
        """The held answers, oldest first, released; waits for the joiner (:meth:`made`) when any are held."""
        if not self._held:
            return []
        self.made()
        held, self._held, self._bytes = self._held, [], 0
        return held

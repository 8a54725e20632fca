"""A background worker that calls one method every few seconds (test and demo support).

The moto node group reconciler, the demo's node lifecycle syncer and the e2e instance follower all mirror
one system into another on a timer; this is that timer, once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Periodic:
    """Runs ``tick`` every ``interval_s`` seconds on a daemon thread between :meth:`start` and :meth:`stop`.

    Exceptions from ``tick`` are kept in :attr:`errors` (a dying thread would hide the failure from the
    test or demo) and the loop goes on.
    """

    def __init__(self, tick: Callable[[], object], name: str) -> None:
        self._tick = tick
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []

    def start(self, interval_s: float) -> None:
        """Start ticking every ``interval_s`` seconds; a no-op when already running."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self._tick()
                except Exception as exc:
                    self.errors.append(exc)

        self._thread = threading.Thread(target=loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (if any) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

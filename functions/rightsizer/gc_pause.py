"""Pausing Python's cyclic garbage collector around work that builds millions of acyclic objects.

Reference counting still frees every object as soon as it is unreferenced; only the cyclic collector's
passes are held back. Those passes rescan the whole heap each time enough new objects accumulate: at
10,000 GPU nodes the assessment holds ~1.5 M objects after the Kubernetes read, and the plan's few
full collections over them cost ~2 of its ~9 CPU-s (``benchmarks/assess_memory.py``), as parsing the
Prometheus answers once spent half its CPU in them (``adapters.prometheus``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Generator
from typing import ParamSpec, TypeVar

__all__ = ["cyclic_gc_paused", "gc_paused"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


_lock = threading.RLock()  # re-entrant: a finalizer run by a collection inside it may pause too
_depth = 0  # pauses open now, in every thread: the collector is process-wide
_resume = False  # whether the collector was enabled when the first of them began


@contextlib.contextmanager
def cyclic_gc_paused() -> Generator[None, None, None]:
    """Disable the cyclic collector inside the block; the last pause to end (in any thread: the live
    assessment pauses in its Prometheus thread and its Kubernetes read at once) enables it again when it
    was enabled before the first began, even when the block raised. Garbage cycles made inside are
    collected afterwards.

    One count under a lock: a pause reading ``gc.isenabled()`` on its own would, between another
    thread's disable and enable, leave the collector disabled for good or end a pause still open.
    """
    global _depth, _resume
    with _lock:
        _depth += 1  # first: a pause begun inside (a finalizer) then counts as nested
        if _depth == 1:
            _resume = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _lock:
            last, resume = _depth == 1, _resume  # read before a pause begun inside could change them
            _depth -= 1
            if last and resume:
                gc.enable()


def gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run with the cyclic collector paused (:func:`cyclic_gc_paused`)."""

    @functools.wraps(fn)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with cyclic_gc_paused():
            return fn(*args, **kwargs)

    return paused

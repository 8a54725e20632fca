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
from collections.abc import Callable, Generator
from typing import ParamSpec, TypeVar

__all__ = ["cyclic_gc_paused", "gc_paused"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def cyclic_gc_paused() -> Generator[None, None, None]:
    """Disable the cyclic collector inside the block, and enable it again after it when it was enabled
    (nested pauses leave it to the outermost). Garbage cycles made inside are collected afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run with the cyclic collector paused (:func:`cyclic_gc_paused`)."""

    @functools.wraps(fn)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with cyclic_gc_paused():
            return fn(*args, **kwargs)

    return paused

"""``rightsizer.gc_pause``: the cyclic collector is process-wide, and the live assessment pauses it in
two threads at once (its Prometheus thread's collection, its Kubernetes read's pages). Whatever the
interleaving, nesting or exceptions, a pause holds while any is open and the collector is enabled again
after the last one (a warm Lambda runs the next assessment in the same process)."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import pytest

from rightsizer.gc_pause import cyclic_gc_paused, gc_paused


@pytest.fixture(autouse=True)
def _collector_enabled() -> Iterator[None]:
    gc.enable()
    yield
    assert gc.isenabled()  # every test leaves it as it found it
    gc.enable()


def test_a_pause_open_in_one_thread_holds_when_another_thread_ends_its_own() -> None:
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with cyclic_gc_paused():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        with cyclic_gc_paused():
            b_in.set()
            a_out.wait(5)
            seen.append(gc.isenabled())  # the first pause ended, this one is still open

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)

    assert seen == [False]
    assert gc.isenabled()


def test_pauses_racing_in_threads_never_leave_the_collector_disabled() -> None:
    # before the count under a lock, ~1 run in 300 ended disabled for good: a pause read isenabled()
    # False between another's disable and enable, then disabled it after that enable
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(150):

            def work() -> None:
                for _ in range(100):
                    with cyclic_gc_paused():
                        pass

            threads = [threading.Thread(target=work) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
            assert gc.isenabled()
    finally:
        sys.setswitchinterval(interval)


def test_nested_and_failing_pauses_enable_the_collector_after_the_outermost() -> None:
    @gc_paused
    def fails() -> None:
        assert not gc.isenabled()
        raise RuntimeError("decode failed")

    with cyclic_gc_paused():
        with pytest.raises(RuntimeError, match="decode failed"):
            fails()
        assert not gc.isenabled()  # the outer pause is still open
    assert gc.isenabled()

    with pytest.raises(KeyError), cyclic_gc_paused(), cyclic_gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_begun_while_the_count_is_updated_in_the_same_thread_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A collection may run a finalizer between bytecodes while the count's lock is held (Python runs
    the collector at such points); a finalizer that pauses too must not wait for its own thread."""
    import rightsizer.gc_pause as module

    disable = gc.disable
    nested: list[bool] = []

    def disable_running_a_finalizer() -> None:
        disable()
        if not nested:
            nested.append(True)
            with cyclic_gc_paused():  # as a finalizer that pauses would, under the lock
                pass

    monkeypatch.setattr(module.gc, "disable", disable_running_a_finalizer)

    def pause_once() -> None:
        with cyclic_gc_paused():
            pass

    worker = threading.Thread(target=pause_once, daemon=True)
    worker.start()
    worker.join(5)
    monkeypatch.undo()
    assert not worker.is_alive()
    assert nested == [True]

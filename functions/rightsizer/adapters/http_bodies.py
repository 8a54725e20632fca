"""Answers freed as soon as they are used, whether or not Python's cyclic garbage collector runs.

httpx binds a response's stream to the response (``httpx._client.BoundSyncStream`` holds the
``Response`` whose ``stream`` it is, httpx 0.28): a reference cycle, so a response and its body outlive
their last use until the cyclic collector runs. ``collect_live`` pauses that collector while it decodes
(``rightsizer.gc_pause.cyclic_gc_paused``), so every answer of a collection stayed in memory to its end:
180 MiB of bytes at 10,000 GPU nodes (194 answers), where one at a time is what the reducer needs
(``benchmarks/assess_memory.py``).
"""

from __future__ import annotations

import httpx

__all__ = ["unbound"]


def unbound(response: httpx.Response) -> httpx.Response:
    """``response`` with its body read (``content``) and its stream no longer bound to it, so reference
    counting frees both when the caller drops it. Returns ``response``.

    Raises:
        httpx.StreamError / httpx.TransportError: as ``Response.read`` when the body was not read yet.
    """
    response.read()
    response.stream = httpx.ByteStream(b"")  # the body is in ``content``; nothing reads the stream again
    return response

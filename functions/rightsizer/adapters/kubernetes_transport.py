"""One connection to a Kubernetes API server: send a request, parse its JSON answer, follow a paginated
list, rebuild credentials after a 401 and translate every failure into our error types.

:class:`rightsizer.adapters.kubernetes.KubernetesCluster` builds its reads and writes on this class.
The official ``kubernetes`` client is imported lazily (see that module's docstring: the webhook must not
pay ~0.7 s for it). Answers are read raw (``_preload_content=False``) and parsed with ``json`` — the
API server's JSON exactly as ``kubectl get -o json`` prints it.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from rightsizer.adapters.kubernetes_errors import (
    ApiAnswer,
    ListExpired,
    parse_error_body,
    translate_api_error,
)
from rightsizer.domain.errors import TransientError
from rightsizer.ports import JSON, AccessCheck

__all__ = ["DEFAULT_PAGE_SIZE", "KubernetesTransport", "client_module"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _whole(item: JSON) -> JSON:
    return item


#: ``limit`` of every list call (items per page) unless the caller chooses another.
DEFAULT_PAGE_SIZE: Final = 500


def client_module() -> Any:
    """``kubernetes.client``, imported on first use (cold start of the webhook, docs/architecture.md §8)."""
    import kubernetes.client

    return kubernetes.client


class KubernetesTransport:
    """The request machinery shared by every read and write of one cluster.

    ``connect`` builds a fresh ``kubernetes.client.ApiClient`` (called lazily and again after a 401).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        reauthenticate: Callable[[], None] | None = None,
        identity: Callable[[], str] | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: float = 30.0,
    ) -> None:
        """Args:
        connect: builds an ``ApiClient`` (host, TLS, credentials).
        reauthenticate: drops cached credentials after a 401 (e.g. ``EksTokenSource.invalidate``).
        identity: who we are, for error messages (an IAM ARN on EKS).
        page_size: ``limit`` of every list call (items per page).
        request_timeout: read timeout per request in seconds (the connect timeout is at most 10 s).

        Raises:
            ValueError: ``page_size`` is below 1.
        """
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self._connect = connect
        self._reauthenticate = reauthenticate
        self._identity = identity
        self.page_size = page_size
        self._timeout = (min(10.0, request_timeout), request_timeout)
        self._api: Any = None

    def identity(self) -> str:
        """Who the cluster sees us as (an IAM ARN with EKS tokens, a kubeconfig user otherwise)."""
        return self._identity() if self._identity else "<unknown identity>"

    def _list(self, check: AccessCheck, kind: str, api_version: str, call: Callable[..., Any]) -> list[JSON]:
        """Every item of a list call, following ``continue`` tokens; ⌈N/page_size⌉ requests."""
        return self._collect(check, kind, api_version, call, _whole)

    def _collect(
        self,
        check: AccessCheck,
        kind: str,
        api_version: str,
        call: Callable[..., Any],
        project: Callable[[JSON], T | None],
        *,
        enough: Callable[[list[T]], bool] | None = None,
        page_size: int | None = None,
        restart: Callable[[], None] | None = None,
    ) -> list[T]:
        """What ``project`` keeps of every item of a list call, page by page (issue 11 item 7).

        Each page is projected as soon as it arrives and dropped before the next one is requested, so
        the client holds at most one raw page (``page_size`` items, default ``self.page_size``) beside
        the projections: at 150,000 pods only what the caller keeps grows with the cluster.
        ``project`` returns what to keep of an item (in kubectl form: ``kind``/``apiVersion`` added back)
        or None to drop it. ``enough``, when given, is asked after each page and ends the list early
        (a search that found its answer).

        A 410 Expired continue token restarts the list once from the beginning (as client-go's pager
        does) with the projections discarded, so the result is still one consistent list, never a
        splice of two; ``restart``, when given, is called first, so a caller whose ``project`` has side
        effects (a snapshot written while it is read) can discard them too.
        """

        def decode(data: bytes) -> tuple[list[T], str | None]:
            page = _parsed(check, data)
            version = str(page.get("apiVersion") or api_version)
            kept: list[T] = []
            for item in page.get("items") or []:
                # The API server omits kind/apiVersion on list items; kubectl adds them back.
                projected = project({"apiVersion": version, "kind": kind, **item})
                if projected is not None:
                    kept.append(projected)
            return kept, (page.get("metadata") or {}).get("continue") or None

        return self._pages(check, call, decode, enough=enough, page_size=page_size, restart=restart)

    def _pages(
        self,
        check: AccessCheck,
        call: Callable[..., Any],
        decode: Callable[[bytes], tuple[list[T], str | None]],
        *,
        enough: Callable[[list[T]], bool] | None = None,
        page_size: int | None = None,
        restart: Callable[[], None] | None = None,
    ) -> list[T]:
        """What ``decode`` keeps of every page of a list call (``decode(body) -> (kept, continue token)``),
        requested page after page; each page's bytes are released before the next one is requested.
        ``enough``, ``page_size`` and ``restart`` as in :meth:`_collect`."""
        limit = page_size or self.page_size
        for attempt in (1, 2):
            kept: list[T] = []
            token: str | None = None
            try:
                while True:
                    data = self._fetch(
                        check,
                        functools.partial(
                            call,
                            limit=limit,
                            _continue=token,
                            _preload_content=False,
                            _request_timeout=self._timeout,
                        ),
                        expired_ok=token is not None,
                    )
                    items, token = decode(data)
                    kept += items
                    del data, items  # one raw page at a time: released before the next request
                    if token is None or (enough is not None and enough(kept)):
                        return kept
            except ListExpired as exc:
                if attempt == 2:
                    raise TransientError(
                        f"{check.describe()}: continue token expired twice", retry_after=1.0
                    ) from exc
                log.info("%s: continue token expired (410); listing again from the start", check.describe())
                if restart is not None:
                    restart()
        raise AssertionError("unreachable")

    def _client(self) -> Any:
        if self._api is None:
            self._api = self._connect()
        return self._api

    def _json(self, check: AccessCheck, send: Callable[[Any], Any], *, expired_ok: bool = False) -> JSON:
        """Send one idempotent request and parse its JSON, retrying once after a 401 with new credentials."""
        return self._call(check, send, expired_ok=expired_ok).body

    def _fetch(self, check: AccessCheck, send: Callable[[Any], Any], *, expired_ok: bool = False) -> bytes:
        """Send one idempotent request (retried once after a 401 with new credentials); its body's bytes."""
        answer = self._send(check, send, expired_ok=expired_ok)
        assert not isinstance(answer, ApiAnswer)  # no error status is answered: every one raised
        return answer[1]

    def _call(
        self,
        check: AccessCheck,
        send: Callable[[Any], Any],
        *,
        expired_ok: bool = False,
        answered: frozenset[int] = frozenset(),
    ) -> ApiAnswer:
        """Send one request (rebuilding credentials and resending once after a 401) and parse its JSON.

        Error statuses in ``answered`` come back as an :class:`ApiAnswer` for the caller to interpret
        (404 on a GET, 409 on a guarded patch, the Eviction statuses); every other error is translated
        into the taxonomy and raised.
        """
        answer = self._send(check, send, expired_ok=expired_ok, answered=answered)
        if isinstance(answer, ApiAnswer):
            return answer
        status, data, headers = answer
        return ApiAnswer(status, _parsed(check, data), headers)

    def _send(
        self,
        check: AccessCheck,
        send: Callable[[Any], Any],
        *,
        expired_ok: bool = False,
        answered: frozenset[int] = frozenset(),
    ) -> ApiAnswer | tuple[int, bytes, Mapping[str, str]]:
        """:meth:`_call` without parsing: (status, body bytes, headers), or the answered error."""
        k8s = client_module()
        import urllib3

        for attempt in (1, 2):
            try:
                response = send(self._client())
                data = response.data
                status = int(response.status)
                headers: Mapping[str, str] = response.headers or {}
                break
            except k8s.ApiException as exc:
                if exc.status in answered:
                    return ApiAnswer(int(exc.status), parse_error_body(exc), exc.headers or {})
                if exc.status == 401 and attempt == 1:
                    log.info(
                        "%s: 401 Unauthorized; rebuilding credentials and retrying once", check.describe()
                    )
                    if self._reauthenticate is not None:
                        self._reauthenticate()
                    self._api = None  # kubeconfig mode: re-read it (exec plugins run again)
                    continue
                if exc.status == 410 and expired_ok:
                    raise ListExpired(check.describe()) from exc
                raise translate_api_error(
                    exc, check, identity=self.identity, second_401=attempt == 2
                ) from exc
            except urllib3.exceptions.HTTPError as exc:
                raise TransientError(f"{check.describe()}: {exc}", retry_after=5.0) from exc
        else:  # pragma: no cover - the loop either breaks, continues once, or raises
            raise AssertionError("unreachable")
        return status, data, headers


def _parsed(check: AccessCheck, data: bytes) -> JSON:
    """The JSON object ``data`` holds.

    Raises:
        TransientError: ``data`` is not a JSON object.
    """
    try:
        parsed = json.loads(data)
    except (TypeError, ValueError) as exc:
        raise TransientError(f"{check.describe()}: the answer is not JSON") from exc
    if not isinstance(parsed, dict):
        raise TransientError(f"{check.describe()}: the answer is not a JSON object")
    return parsed

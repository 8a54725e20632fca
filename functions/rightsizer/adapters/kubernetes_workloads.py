"""Workload reads and patches (``ports.WorkloadWriter``, issue 32) over the official client's
``CustomObjectsApi``, which addresses any API group by path (``/apis/<group>/<version>/namespaces/<ns>/
<plural>/<name>[/scale]``): Deployments, StatefulSets and LeaderWorkerSets (and their ``scale``
subresource), Kubeflow Notebooks, KServe InferenceServices, HPAs and KEDA ScaledObjects
(``domain.workload_model.RESOURCES``). Every write is one JSON merge patch (RFC 7386).

A mixin of :class:`rightsizer.adapters.kubernetes.KubernetesCluster`: it shares its connection, token
refresh and error translation (403 ⇒ ``KubernetesAccessError`` naming the verb and resource).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from rightsizer.adapters.kubernetes_transport import KubernetesTransport, client_module
from rightsizer.adapters.kubernetes_writes import checked_name
from rightsizer.domain.workload_model import RESOURCES
from rightsizer.ports import JSON, AccessCheck

__all__ = ["KubernetesWorkloadWrites"]

_MERGE_PATCH: Final = "application/merge-patch+json"


def _resource(group: str, kind: str) -> tuple[str, str]:
    found = RESOURCES.get((group, kind))
    if found is None:
        raise ValueError(f"not a workload resource the rightsizer touches: {kind}.{group}")
    return found


class KubernetesWorkloadWrites(KubernetesTransport):
    """``ports.WorkloadWriter`` (see the module docstring)."""

    def get_object(
        self, group: str, kind: str, namespace: str, name: str, subresource: str | None = None
    ) -> JSON | None:
        """``GET`` the object or its ``scale`` subresource; None on 404 (also: the kind is not served).

        Raises:
            ValueError: (group, kind) is not in ``RESOURCES``. PermanentError: a name that is not DNS-1123.
        """
        version, plural = _resource(group, kind)
        checked_name(name, namespace=namespace)
        api = client_module().CustomObjectsApi
        answer = self._call(
            AccessCheck("get", plural, subresource or "", group),
            lambda c: getattr(
                api(c),
                "get_namespaced_custom_object_scale" if subresource else "get_namespaced_custom_object",
            )(
                group,
                version,
                namespace,
                plural,
                name,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def patch_object(
        self, group: str, kind: str, namespace: str, name: str, subresource: str | None, body: JSON
    ) -> JSON | None:
        """``PATCH`` (JSON merge patch) the object or its ``scale`` subresource; None on 404.

        Raises:
            ValueError: (group, kind) is not in ``RESOURCES``; PermanentError: 403, 422.
        """
        version, plural = _resource(group, kind)
        checked_name(name, namespace=namespace)
        api = client_module().CustomObjectsApi
        method = "patch_namespaced_custom_object_scale" if subresource else "patch_namespaced_custom_object"
        answer = self._call(
            AccessCheck("patch", plural, subresource or "", group),
            lambda c: getattr(api(c), method)(
                group,
                version,
                namespace,
                plural,
                name,
                body,
                _content_type=_MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def list_objects(
        self, group: str, kind: str, namespace: str, visit: Callable[[JSON], None] | None = None
    ) -> list[JSON]:
        """Every object of (group, kind) in ``namespace`` (one page of up to ``page_size``… each page
        followed); empty on 404 (the kind is not served: a CRD not installed)."""
        version, plural = _resource(group, kind)
        api = client_module().CustomObjectsApi
        items: list[JSON] = []
        token: str | None = None
        while True:

            def page(c: Any, t: str | None = token) -> Any:
                return api(c).list_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    limit=self.page_size,
                    _continue=t,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )

            answer = self._call(AccessCheck("list", plural, "", group), page, answered=frozenset({404}))
            if answer.status == 404:
                return []
            page_items = list(answer.body.get("items") or [])
            if visit is None:
                items += page_items
            else:  # page by page: nothing is held beyond one page (rightsizer snapshot)
                for item in page_items:
                    visit(item)
            token = (answer.body.get("metadata") or {}).get("continue")
            if not token:
                return items

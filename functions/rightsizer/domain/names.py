"""Kubernetes object names as the API server validates them (issue 14 "Inputs bounded and validated").

Source: ``k8s.io/apimachinery/pkg/util/validation/validation.go`` (``IsDNS1123Subdomain``,
``IsDNS1123Label``); Node, Pod and PersistentVolume names are DNS-1123 subdomains
(``ValidateNodeName`` = ``NameIsDNSSubdomain``), namespaces DNS-1123 labels. A name that fails here cannot
name an object, so it is refused before it reaches a request path or a field selector: ``.``, ``..``,
slashes, commas, ``?``, ``#``, upper case and whitespace never leave the process.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["DNS1123_LABEL_MAX", "DNS1123_SUBDOMAIN_MAX", "dns1123_label_problem", "dns1123_subdomain_problem"]

#: Longest DNS-1123 subdomain, in characters (RFC 1123 §2.1 via apimachinery ``DNS1123SubdomainMaxLength``).
DNS1123_SUBDOMAIN_MAX: Final = 253
#: Longest DNS-1123 label, in characters (apimachinery ``DNS1123LabelMaxLength``).
DNS1123_LABEL_MAX: Final = 63

_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_RE: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_LABEL_RE: Final = re.compile(_LABEL)


def dns1123_subdomain_problem(value: object) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (a Node or Pod name), or None when it is one.

    Returns:
        ``"empty"``, ``"too_long"`` (over 253 characters) or ``"not_dns1123_subdomain"`` (characters
        other than lower-case alphanumerics, ``-`` and ``.``, or a part that does not start and end with
        an alphanumeric — ``.``, ``..`` and ``a..b`` included).
    """
    if not isinstance(value, str) or value == "":
        return "empty"
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        return "too_long"
    # fullmatch: "$" would accept a trailing newline.
    return None if _SUBDOMAIN_RE.fullmatch(value) else "not_dns1123_subdomain"


def dns1123_label_problem(value: object) -> str | None:
    """Why ``value`` is not a DNS-1123 label (a namespace name), or None when it is one.

    Returns:
        ``"empty"``, ``"too_long"`` (over 63 characters) or ``"not_dns1123_label"``.
    """
    if not isinstance(value, str) or value == "":
        return "empty"
    if len(value) > DNS1123_LABEL_MAX:
        return "too_long"
    return None if _LABEL_RE.fullmatch(value) else "not_dns1123_label"

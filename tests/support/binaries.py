"""Locate the real Debian binaries the integration tests need (prometheus, promtool, alertmanager, amtool).

On a laptop without them the tests skip with a clear reason; with ``CI=true`` a missing binary fails the
run (docs/architecture.md §7), because CI must exercise the real parts.
"""

from __future__ import annotations

import os
import shutil

import pytest

ALIASES = {"alertmanager": ("prometheus-alertmanager", "alertmanager")}
#: Where each binary comes from (Debian packages; ``.ci/run`` installs them).
PACKAGES = {"kubectl": "kubernetes-client"}


def require_binary(name: str) -> str:
    """The path of ``name`` on PATH; skip (laptop) or fail (``CI=true``) when it is missing."""
    for candidate in ALIASES.get(name, (name,)):
        path = shutil.which(candidate)
        if path:
            return path
    package = PACKAGES.get(name, "prometheus prometheus-alertmanager")
    message = f"{name} not found on PATH (Debian: apt-get install {package})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)

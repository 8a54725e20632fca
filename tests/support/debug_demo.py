"""Run ``rightsizer -v demo`` in this fresh interpreter with a known Kubernetes bearer token.

The demo environment draws its API token at random; ``tests/integration/test_log_secrets.py`` needs to
know it to look for it in the logs, so this driver fixes it (``RIGHTSIZER_TEST_KUBE_TOKEN``) and then runs
the real CLI entry point, logging configuration included.
"""

from __future__ import annotations

import os
import sys

from rightsizer.cli import main
from rightsizer.testing import demo_env

if __name__ == "__main__":
    token = os.environ["RIGHTSIZER_TEST_KUBE_TOKEN"]
    demo_env.secrets.token_urlsafe = lambda _n=None: token  # type: ignore[assignment]
    sys.exit(main(["-v", "demo"]))

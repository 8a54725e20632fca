"""Run one Lambda function's handler at DEBUG as the Lambda Python runtime does (issue 14 item 4).

Usage: ``python lambda_at_debug.py FUNCTION EVENTS_JSON RESULTS_JSON`` — ``FUNCTION`` is a directory of
``functions/`` (``assess``, ``drain``, ``alert_webhook``, ``offhours``), ``EVENTS_JSON`` a file holding a
list of events, each invoked in order in this one warm interpreter; ``RESULTS_JSON`` receives one entry per
event: ``{"result": …}`` or ``{"errorType", "errorMessage"}``.

What the runtime does and this script repeats: its bootstrap puts a handler on the root logger *before*
it imports the function (at ``AWS_LAMBDA_LOG_LEVEL``, here DEBUG, on stdout); the function's module is
imported from ``functions/`` (``CodeUri``) with the role's credentials already in the environment; an
exception leaving the handler is printed by the runtime itself — ``errorMessage``, ``errorType`` and
``stackTrace`` as JSON, through no filter of ours. Powertools loggers write at ``POWERTOOLS_LOG_LEVEL``.
``tests/integration/test_lambda_log_secrets.py`` greps what this prints for planted credentials.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Context:
    """The attributes Powertools reads from a Lambda context."""

    def __init__(self, function: str, index: int) -> None:
        self.function_name = f"rightsizer-{function.replace('_', '-')}"
        self.memory_limit_in_mb = 512
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
        self.aws_request_id = f"00000000-0000-4000-8000-{index:012d}"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 300_000


def main(argv: list[str]) -> int:
    """Invoke ``argv[1]``'s handler with each event of ``argv[2]``; results to ``argv[3]``."""
    function, events_path, results_path = argv[1], Path(argv[2]), Path(argv[3])
    root_handler = logging.StreamHandler(sys.stdout)
    root_handler.setFormatter(
        logging.Formatter("[%(levelname)s]\t%(asctime)s\t%(name)s\t%(message)s")  # the runtime's format
    )
    logging.getLogger().addHandler(root_handler)
    logging.getLogger().setLevel(logging.DEBUG)
    sys.path.insert(0, str(ROOT / "functions"))
    module = importlib.import_module(f"{function}.app")
    if module.logger.log_level != logging.DEBUG:  # the function's Powertools logger
        print(f"Powertools logger of {function} at {module.logger.log_level}, not DEBUG", file=sys.stderr)
        return 3
    handler = getattr(module, "lambda_handler", None) or module.handler
    results: list[dict[str, Any]] = []
    for index, event in enumerate(json.loads(events_path.read_text(encoding="utf-8"))):
        try:
            results.append({"result": handler(event, Context(function, index))})
        except Exception as exc:  # printed as the runtime prints an invocation error
            error = {
                "errorMessage": str(exc),
                "errorType": type(exc).__name__,
                "stackTrace": traceback.format_exception(exc),
            }
            print(json.dumps(error), flush=True)
            results.append({k: error[k] for k in ("errorType", "errorMessage")})
    results_path.write_text(json.dumps(results, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

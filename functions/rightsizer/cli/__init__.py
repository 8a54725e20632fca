"""The ``rightsizer`` command line (docs/architecture.md §5 "CLI"): one module per command group.

Logs go to stderr; ``--json`` prints exactly one JSON document on stdout. Exit codes: 0 success, 1 an
action failed or another failure, 2 bad input or configuration (stderr names the file and the field).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from rightsizer import logsafety
from rightsizer.cli import backtest, deployment, fleet, offhours, plan, prices, restore, serve, validate
from rightsizer.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_OK,
    example_snapshot_dir,
    parse_time,
    read_policy_file,
)
from rightsizer.cli.offhours import build_offhours_deps, cmd_offhours
from rightsizer.domain.errors import ConfigError, RightsizerError

log = logging.getLogger("rightsizer")

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "build_offhours_deps",
    "build_parser",
    "cmd_offhours",
    "example_snapshot_dir",
    "main",
    "parse_time",
    "read_policy_file",
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(
        prog="rightsizer",
        description="Stop paying for idle GPUs on EKS. Commands that read a deployment (status, history, "
        "savings, approve, reject, snooze) take --stack NAME or --config FILE; the others a --config FILE "
        "(plan also a --snapshot DIR). Logs go to stderr; --json prints one JSON document on stdout.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (plan, deployment, validate, serve, offhours, backtest, prices, fleet, restore):
        group.add_parsers(sub)
    for command in sub.choices.values():
        command.epilog = command.epilog or EXIT_CODES
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rightsizer`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logsafety.install()  # -v is our debug, never the SDKs'; no handler prints a credential
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        # a missing AWS region/credentials under it names its own fix, not the caller's guess at a cause
        print(f"rightsizer: error: {_aws_setup_error(exc) or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader of stdout stopped early (`rightsizer plan ... | head`): nothing failed, so nothing says
        # so; stdout goes to /dev/null so the interpreter's flush at exit cannot raise again (Python docs,
        # "Note on SIGPIPE"), and the exit code is 1, as Python's own on EPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:  # one line naming the fix, never a traceback (-v logs it)
        setup = _aws_setup_error(exc)
        if setup is not None:
            print(f"rightsizer: error: {setup}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(exc, RightsizerError):
            print(f"rightsizer: failed: {exc}", file=sys.stderr)
            return EXIT_FAILED
        log.debug("unexpected failure", exc_info=True)
        hint = "" if args.verbose else " (rightsizer -v ... shows where)"
        print(f"rightsizer: failed: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return EXIT_FAILED
    return code


def _aws_setup_error(exc: BaseException) -> ConfigError | None:
    """The fix for a missing AWS region, credentials or profile anywhere in ``exc``'s chain (imports botocore
    only on this failure path: ``plan --snapshot`` never loads it)."""
    from rightsizer.adapters.aws_errors import environment_error

    return environment_error(exc)

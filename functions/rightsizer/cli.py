"""The ``rightsizer`` command line (design §5 "CLI").

Logs go to stderr; ``--json`` prints exactly one JSON document on stdout. Exit codes: 0 success, 1 an
action failed or another failure, 2 bad input or configuration (stderr names the file and the field).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.domain.errors import ConfigError, RightsizerError
from rightsizer.domain.planner import plan as make_plan
from rightsizer.domain.policy import Policy, load_policy
from rightsizer.render import render_plan

log = logging.getLogger("rightsizer")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 time with an offset (``2026-11-02T10:00:00Z``).

    Raises:
        ConfigError: when the text is not RFC 3339 or has no offset.
    """
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(f"{text!r} is not an RFC 3339 time", field="--at") from exc
    if value.tzinfo is None:
        raise ConfigError(f"{text!r} has no UTC offset (use e.g. 2026-11-02T10:00:00Z)", field="--at")
    return value


def read_policy_file(path: str | Path) -> Policy:
    """Load a policy YAML/JSON file.

    Raises:
        ConfigError: missing file, invalid YAML, or a key/value the policy rejects (named).
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(p)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=str(p)) from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError("a policy is a mapping of keys to values", source=str(p))
    return load_policy(data, source=str(p))


def example_snapshot_dir(name: str = "demo") -> Path:
    """The packaged example snapshot ``name`` (``rightsizer/data/examples/<name>``)."""
    return Path(str(resources.files("rightsizer") / "data" / "examples" / name))


def cmd_plan(args: argparse.Namespace) -> int:
    """``rightsizer plan``: decide on a snapshot directory; never acts."""
    if args.config:
        raise ConfigError("live planning needs the Observe adapters; use --snapshot DIR", field="--config")
    snapshot = load_snapshot(args.snapshot)
    policy = read_policy_file(args.policy) if args.policy else Policy()
    at = parse_time(args.at) if args.at else None
    result = make_plan(snapshot, policy, at)
    if args.json:
        _emit_json(result.to_json_dict())
    else:
        print(render_plan(result))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``rightsizer demo``: plan the packaged example snapshot (loopback only, no AWS account needed)."""
    snapshot = load_snapshot(example_snapshot_dir())
    result = make_plan(snapshot, Policy())
    if args.json:
        _emit_json(result.to_json_dict())
    else:
        print(render_plan(result))
    return EXIT_OK


def _emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="rightsizer", description="Stop paying for idle GPUs on EKS.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="decide on a snapshot (never acts)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--snapshot", metavar="DIR", help="a snapshot directory (design §5)")
    src.add_argument("--config", metavar="FILE", help="a config file for live collection")
    p.add_argument("--policy", metavar="FILE", help="policy YAML (overrides the config's policy)")
    p.add_argument("--at", metavar="TIME", help="decision time, RFC 3339 with offset (default: taken_at)")
    p.add_argument("--json", action="store_true", help="print the Plan JSON document")
    p.set_defaults(func=cmd_plan)

    d = sub.add_parser("demo", help="run the main job on the embedded default")
    d.add_argument("--json", action="store_true", help="print the outcome as JSON")
    d.set_defaults(func=cmd_demo)
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
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"rightsizer: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RightsizerError as exc:
        print(f"rightsizer: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return code


if __name__ == "__main__":
    raise SystemExit(main())

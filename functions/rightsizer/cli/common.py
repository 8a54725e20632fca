"""What every ``rightsizer`` sub-command shares: exit codes, times, policy files, JSON output, the deployment a
command reads (``--stack`` or ``--config``) and argparse types."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.policy import Policy, load_policy

if TYPE_CHECKING:
    from rightsizer.services.drain import StepResult

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
#: Every command's --help ends with this (docs/operations.md "Exit codes").
EXIT_CODES = (
    "exit codes: 0 ok; 1 an action or a read failed (or was rolled back); 2 a usage or configuration error"
)


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


def now_on_step(step_seconds: int) -> datetime:
    """Now, floored to a multiple of the query step: range points and subquery points then coincide,
    so a snapshot and a live plan of the same instant see the same samples."""
    now = int(datetime.now(UTC).timestamp())
    return datetime.fromtimestamp(now - now % step_seconds, UTC)


def emit_json(doc: Any) -> None:
    """Print ``doc`` as the one JSON document of a ``--json`` command on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def deployed_config(args: argparse.Namespace, *, with_policy: bool = False) -> Config:
    """``--stack NAME`` (the stack's outputs and parameters; with ``with_policy`` its policy too) or
    ``--config FILE``.

    Raises:
        ConfigError: neither or both given, a missing stack or output, an invalid config file.
    """
    from rightsizer.wiring import config_from_stack

    if bool(args.stack) == bool(args.config):
        raise ConfigError("give exactly one of --stack NAME or --config FILE", field="--stack")
    if args.config and args.region:
        raise ConfigError("--region goes with --stack; a config file names aws.region", field="--region")
    if args.stack:
        return config_from_stack(args.stack, args.region, with_policy=with_policy)
    return load_config(args.config)


def require_table(config: Config, need: str, *, stack: bool = True) -> None:
    """Refuse, before any AWS call, a command that needs the state table when ``config`` names none.

    ``need`` says what the command does with it ("status reads the state table"); the error adds how to
    give it one (``aws.table``, or ``--stack`` when the command takes it).

    Raises:
        ConfigError: ``aws.table`` unset (field ``aws.table``; the CLI exits 2).
    """
    if not config.aws.table:
        how = "set aws.table in the config or pass --stack" if stack else "set aws.table in the config"
        raise ConfigError(f"{need}: {how}", field="aws.table")


def count_arg(text: str) -> int:
    """argparse type for a count of rows (``--failures``, ``--limit``): an integer ≥ 0.

    Raises:
        argparse.ArgumentTypeError: for anything else (argparse then exits 2 naming the option).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give a count of 0 or more")
    return value


def port_arg(text: str) -> int:
    """argparse type for a TCP port (``serve --port``): 0 (any free port) to 65535.

    Raises:
        argparse.ArgumentTypeError: for anything else (argparse then exits 2 naming the option).
    """
    value = count_arg(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535)")
    return value


def percent_arg(text: str) -> float:
    """argparse type for a percentage (``backtest --activity-threshold``): a finite number in [0, 100].

    Raises:
        argparse.ArgumentTypeError: for anything else, ``nan`` and ``inf`` included.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 100.0:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage from 0 to 100")
    return value


def print_progress(result: StepResult) -> None:
    """A workflow step's outcome on stderr (``apply``'s live progress)."""
    print(
        f"drain {result.execution_id}: {result.step} -> {result.next_step or result.status} {result.message}",
        file=sys.stderr,
        flush=True,
    )

"""The user documentation's examples hold (issue 27 item 5).

Before: README's config example restored its GPU node groups on Monday 00:00 (a Sat/Sun 00:00-00:00 period
ends at Monday midnight) while its comment promised the workday; the example now loads, and its timetable
keeps the groups off from Friday 20:00 to Monday 07:00. README's two commands are the Makefile's and the
ones CI runs.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from rightsizer.config import load_config
from rightsizer.domain.periods import schedule_contains

ROOT = Path(__file__).resolve().parents[2]
BERLIN = ZoneInfo("Europe/Berlin")


def config_example() -> str:
    text = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")
    section = text[text.index("## Configuration file") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match, "docs/policy.md 'Configuration file' has a yaml example"
    return match.group(1)


@pytest.mark.parametrize(
    ("local", "off"),
    [
        ("2026-11-06T19:59", False),  # Friday evening: still on
        ("2026-11-06T20:00", True),
        ("2026-11-08T23:00", True),  # Sunday night
        ("2026-11-09T03:00", True),  # Monday before work: still off (was restored at 00:00)
        ("2026-11-09T06:59", True),
        ("2026-11-09T07:00", False),  # restored for the workday
        ("2026-11-10T21:00", True),  # a weeknight
    ],
)
def test_the_config_example_loads_and_restores_gpu_groups_at_monday_seven(
    tmp_path: Path, local: str, off: bool
) -> None:
    (tmp_path / "policy.yaml").write_text("{}\n", encoding="utf-8")
    path = tmp_path / "config.yaml"
    path.write_text(config_example(), encoding="utf-8")
    config = load_config(path)
    [group] = config.offhours.node_groups
    periods = config.offhours.schedules[group.schedule]
    instant = datetime.fromisoformat(local).replace(tzinfo=BERLIN)
    assert schedule_contains(periods, instant) is off


def test_readmes_two_commands_are_make_targets_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test", "test-fast"):
        assert f"make {target}" in readme
        assert re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE), target
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test\b", ci, re.MULTILINE)
    assert len(readme.splitlines()) < 150  # a newcomer's five minutes; the rest is in docs/


def test_every_cli_error_line_the_docs_quote_is_one_the_cli_prints() -> None:
    # operations.md quoted `rightsizer: failed: eks:DescribeCluster <name>: Unable to locate credentials`
    # and exit 1 for a live command without credentials, long after the CLI said (and its test checked)
    # `rightsizer: error: aws: no AWS credentials found: …` and exit 2. Every quoted error line must contain
    # one of the lines tests/integration/test_cli_no_aws.py proves, with the exit code said beside it.
    from tests.integration.test_cli_no_aws import CASES

    proven = {(text, code) for _, code, text in CASES}
    texts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    texts += [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    quoted = []
    for raw in texts:
        text = " ".join(raw.split())  # a quote may wrap lines
        for m in re.finditer(r"`rightsizer: (?:error|failed): ([^`]*)`", text):
            quoted.append((m.group(1), text[m.end() : m.end() + 300]))
    assert quoted, "the docs quote no CLI error line"
    for line, after in quoted:
        matches = [(t, c) for t, c in proven if t in line]
        assert matches, f"docs quote {line!r}: no such line in test_cli_no_aws.CASES"
        said = re.search(r"exit (\d)", after)
        assert said is None or int(said.group(1)) in {c for _, c in matches}, (line, after[:80])

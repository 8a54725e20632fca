"""The house's hard cap: no Python file of the project over 800 lines (README "Style": files under ~500
lines by structure, 800 a cap, never a target). A file that outgrows it is split where its structure
splits (``test_iam.py`` → ``test_iam_resize.py`` + ``tests/support/iam_world.py`` once it reached 850).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAP = 800


def line_counts(*folders: str) -> dict[str, int]:
    """``path`` (relative to the repository) → its number of lines, for every ``*.py`` under ``folders``."""
    counts: dict[str, int] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            if ".venv" in path.parts or ".aws-sam" in path.parts:
                continue
            with path.open("rb") as handle:
                counts[str(path.relative_to(ROOT))] = sum(1 for _ in handle)
    return counts


def test_no_python_file_is_over_the_cap() -> None:
    counts = line_counts("functions", "tests", "benchmarks")
    assert len(counts) > 300  # the walk found the tree
    assert {path: n for path, n in counts.items() if n > CAP} == {}


def test_the_count_is_wc_l() -> None:
    # The figure the cap is quoted in: newline-terminated lines, as `wc -l` counts them.
    assert line_counts("tests/unit")["tests/unit/test_file_size.py"] == len(
        Path(__file__).read_text(encoding="utf-8").splitlines()
    )

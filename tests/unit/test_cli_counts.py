"""Row counts on the read-only commands (``status --failures``, ``history --limit``) are whole numbers ≥ 0."""

from __future__ import annotations

import pytest

from rightsizer.cli import main


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["status", "--config", "x.yaml", "--failures", "-1"], "--failures"),
        (["status", "--config", "x.yaml", "--failures", "ten"], "--failures"),
        (["history", "--config", "x.yaml", "--limit", "-5"], "--limit"),
        (["history", "--config", "x.yaml", "--limit", "2.5"], "--limit"),
    ],
)
def test_a_bad_count_exits_2_naming_the_option(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # WHEN a count is negative or not a whole number THEN argparse exits 2 before anything is read
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert option in capsys.readouterr().err

"""Every number a user types on the command line is bounded (issue 26 item 4): past its bound the
``rightsizer`` command exits 2 naming the option, with no traceback and nothing done — durations (at
most ten years anywhere, a snooze at most 30 days), counts, ports, percentages and times."""

from __future__ import annotations

from pathlib import Path

import pytest

from rightsizer.cli import main

HUGE = "9" * 400


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["serve", "--config", "{config}", "--port", "70000"], "--port"),
        (["serve", "--config", "{config}", "--port", "-1"], "--port"),
        (["serve", "--config", "{config}", "--port", HUGE], "--port"),
        (["history", "--config", "{config}", "--limit", "-5"], "--limit"),
        (["status", "--config", "{config}", "--failures", "ten"], "--failures"),
        (["backtest", "--trace", "{config}", "--step", f"{HUGE}h"], "--step"),
        (["backtest", "--trace", "{config}", "--provision-delay", "99999999999999h"], "--provision-delay"),
        (["backtest", "--trace", "{config}", "--regret-horizon", "8760000000h"], "--regret-horizon"),
        (["backtest", "--trace", "{config}", "--activity-threshold", "nan"], "--activity-threshold"),
        (["backtest", "--trace", "{config}", "--activity-threshold", "1e999"], "--activity-threshold"),
        (["plan", "--snapshot", "{config}", "--at", "99999-01-01T00:00:00Z"], "--at"),
        (["offhours", "status", "--config", "{config}", "--at", f"{HUGE}"], "--at"),
    ],
)
def test_a_number_past_its_bound_is_exit_2_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], names: str
) -> None:
    config = tmp_path / "rightsizer.yaml"
    config.write_text("cluster: {name: prod-eks}\n", encoding="utf-8")
    argv = [a.replace("{config}", str(config)) for a in argv]

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of a bad type
        code = int(exc.code or 0)

    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and names in err, err

"""``rightsizer demo`` without the [demo] extra says what to install and exits 2 (no traceback)."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

import pytest

from rightsizer.cli import main


@pytest.mark.parametrize("absent", ["moto", "flask"])
def test_demo_without_the_extra_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], absent: str
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == absent else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "install gpu-rightsizer[demo]" in err
    assert absent in err
    assert "Traceback" not in err

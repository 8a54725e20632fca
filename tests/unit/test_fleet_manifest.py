"""``rightsizer fleet plan --manifest``: every mistake names the entry (its index), the field and the value.

Before: ``account_id: String should match pattern '^[0-9]{12}$'`` with no entry — in a manifest of hundreds
of clusters, which one? — although both docstrings promised the index; an empty manifest "assessed" 0
clusters with exit 0; ``--concurrency 0`` listed 64 choices. No AWS is reached: these are refused first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rightsizer.cli import main

GOOD = {"account_id": "123456789012", "region": "us-east-1", "cluster": "gpu-a"}


@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"account_id": "12"}, "account_id: String should match pattern '^[0-9]{12}$' (got '12')"),
        ({"prometheus_auth": "oauth"}, "prometheus_auth: Input should be 'none' or 'sigv4' (got 'oauth')"),
        ({"cluster": None}, "cluster: "),
        ({"regoin": "eu-west-1"}, "regoin: "),
    ],
)
def test_a_manifest_mistake_names_the_entry_the_field_and_the_value(
    tmp_path: Path, index: int, change: dict[str, Any], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = [dict(GOOD, cluster=f"gpu-{i}") for i in range(3)]
    entries[index] = {k: v for k, v in {**entries[index], **change}.items() if v is not None}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(entries))
    assert main(["fleet", "plan", "--manifest", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {index}.{needle}" in err, err


@pytest.mark.parametrize(("body", "needle"), [("[]", "lists no cluster"), ("{}", "is a JSON list")])
def test_a_manifest_without_entries_is_refused(
    tmp_path: Path, body: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(body)
    assert main(["fleet", "plan", "--manifest", str(path)]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "65", "-1", "x"])
def test_concurrency_out_of_range_says_the_range(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["fleet", "plan", "--manifest", "m.json", "--concurrency", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--concurrency" in err and "choose from" not in err

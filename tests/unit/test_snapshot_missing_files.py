"""A snapshot file that is missing never makes a replay act on more than the full snapshot would.

``pdbs.json`` was optional and read as "no PodDisruptionBudgets" when absent: an idle node whose pod a
budget protects (``disruptionsAllowed: 0``) became a ``scale_in`` in ``plan --snapshot``. The class: for
every file a snapshot directory may hold, deleting it either is refused (exit 2 naming the file) or plans
no action the whole snapshot does not plan (missing data is never permission).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from rightsizer.adapters.snapshot_dir import OPTIONAL_FILES, REQUIRED_FILES
from rightsizer.cli import main
from tests.builders import const, gpu_node, merge_metrics, node_devices, pdb, pod, pv, pvc, write_snapshot_dir

DEMO = Path(__file__).resolve().parents[2] / "functions" / "rightsizer" / "data" / "examples" / "demo"


def _guarded(root: Path) -> Path:
    """An idle node ``guarded-1`` whose pod a budget protects and a busy one; plus the volumes files, so
    every optional file the builders make is present."""
    nodes = [
        gpu_node(n, instance_type="g5.12xlarge", gpus=4, instance_id=f"i-{n}")
        for n in ("guarded-1", "free-1")
    ]
    pods = [pod("web-0", "guarded-1", labels={"app": "web"})]
    metrics = merge_metrics(node_devices("guarded-1", 4), node_devices("free-1", 4, util=const(95)))
    path = write_snapshot_dir(root, nodes, pods, metrics, pdbs=[pdb("web", "default", {"app": "web"}, 0)])
    (path / "persistentvolumeclaims.json").write_text(json.dumps({"items": [pvc("data", "pv-1")]}))
    (path / "persistentvolumes.json").write_text(json.dumps({"items": [pv("pv-1")]}))
    for name in ("resourceclaims.json", "resourceslices.json", "workloads.json"):
        (path / name).write_text(json.dumps({"items": []}))
    (path / "instances.json").write_text(json.dumps({"Reservations": []}))
    empty = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    (path / "xid.json").write_text(json.dumps({"count": empty, "last": empty}))
    return path


#: Every file a snapshot may hold but its own first (``snapshot.json`` is what makes it one).
FILES = (*REQUIRED_FILES[1:], *OPTIONAL_FILES)
#: (source, file) for every file each source holds: the guarded snapshot holds them all (a test below
#: says so), the packaged demo what a capture of a cluster without volumes or DRA writes.
CASES = [("guarded", name) for name in FILES] + [("demo", n) for n in FILES if (DEMO / n).exists()]


def _plan(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, set[tuple[Any, ...]], str]:
    code = main(["plan", "--snapshot", str(path), "--json"])
    out, err = capsys.readouterr()
    if code != 0:
        return code, set(), err
    return code, {(a["kind"], a["node"]) for a in json.loads(out)["actions"]}, err


def test_the_guarded_snapshot_holds_every_file_a_snapshot_may_hold(tmp_path: Path) -> None:
    path = _guarded(tmp_path / "full")
    assert [name for name in FILES if not (path / name).exists()] == []


@pytest.mark.parametrize(("source", "missing"), CASES)
def test_a_missing_file_is_refused_or_never_permission(
    tmp_path: Path, source: str, missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    full = (
        _guarded(tmp_path / "full") if source == "guarded" else Path(shutil.copytree(DEMO, tmp_path / "full"))
    )
    code, actions, err = _plan(full, capsys)
    assert code == 0, err
    if source == "guarded":
        assert actions == set()  # the budget keeps guarded-1, free-1 is busy
    part = Path(shutil.copytree(full, tmp_path / "part"))
    (part / missing).unlink()
    code, fewer, err = _plan(part, capsys)
    if code == 0:
        assert fewer <= actions, f"without {missing}: {sorted(fewer - actions)} beyond the whole snapshot's"
    else:
        assert code == 2 and missing in err and "required file is missing" in err, err


def test_a_missing_pdbs_file_says_why_it_is_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _guarded(tmp_path / "snap")
    (path / "pdbs.json").unlink()
    assert main(["plan", "--snapshot", str(path)]) == 2
    assert 'no PodDisruptionBudget would protect a pod; re-capture the snapshot, or write {"items": []}' in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("wrong", ["[1]", '"text"', "7"])
@pytest.mark.parametrize(
    "name",
    [f.relative_to(DEMO).as_posix() for f in sorted(DEMO.rglob("*.json")) if f.name != "expected.json"],
)
def test_a_file_of_the_wrong_kind_is_named_in_the_users_words(
    tmp_path: Path,
    name: str,
    wrong: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # snapshot.json as a list said "<root>: Input should be a valid dictionary or instance of _SnapshotFile":
    # a key that is no key and a class the user never wrote. Each file of the wrong kind is refused naming
    # the file (exit 2), or, a metrics answer, makes its nodes unknown and says so; never acted on.
    part = Path(shutil.copytree(DEMO, tmp_path / "snap"))
    (part / name).write_text(wrong)
    code = main(["plan", "--snapshot", str(part), "--json"])
    out, err = capsys.readouterr()
    assert "<root>" not in err and not re.search(r"\b_[A-Z]\w+", err), err
    if name.startswith("metrics/"):
        assert code == 0 and f"{Path(name).name} unusable" in caplog.text, caplog.text
        assert {(a["kind"], a["node"]) for a in json.loads(out)["actions"]} <= DEMO_ACTIONS
    else:
        assert code == 2 and f"{part / name}: " in err, err


DEMO_ACTIONS = {("scale_in", "ip-10-0-83-246.ec2.internal")}

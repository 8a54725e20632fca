"""``plan --snapshot`` reads a snapshot directory as untrusted (issue 26 item 4): a file — or the metrics
folder — that is a symbolic link leaving the directory, anything but a regular file, and a file over the
stated size are refused with exit 2 naming the file, never followed, blocked on or read into memory.

Through the real entry point (``rightsizer plan --snapshot``), on copies of the packaged example snapshot,
one path trick per case; a symbolic link that stays inside the directory is still read.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rightsizer.adapters import snapshot_files
from rightsizer.cli import example_snapshot_dir, main

Trick = Callable[[Path, Path], str]  # (snapshot dir, a folder outside it) -> the file the error names


def _outside_copy(snapshot: Path, outside: Path, name: str) -> str:
    target = outside / name.replace("/", "_")
    shutil.copy(snapshot / name, target)  # a well-formed file: only where it lives is wrong
    (snapshot / name).unlink()
    (snapshot / name).symlink_to(target)
    return name


def _to_dev_zero(snapshot: Path, _outside: Path, name: str) -> str:
    (snapshot / name).unlink()
    (snapshot / name).symlink_to("/dev/zero")
    return name


def _fifo(snapshot: Path, _outside: Path, name: str) -> str:
    (snapshot / name).unlink()
    os.mkfifo(snapshot / name)
    return name


def _directory(snapshot: Path, _outside: Path, name: str) -> str:
    (snapshot / name).unlink()
    (snapshot / name).mkdir()
    return name


def _relative_escape(snapshot: Path, outside: Path, name: str) -> str:
    shutil.copy(snapshot / name, outside / "escaped.json")
    (snapshot / name).unlink()
    (snapshot / name).symlink_to(Path("..") / outside.name / "escaped.json")
    return name


def _metrics_folder_outside(snapshot: Path, outside: Path, _name: str) -> str:
    shutil.move(snapshot / "metrics", outside / "metrics")
    (snapshot / "metrics").symlink_to(outside / "metrics")
    return "metrics/"


def _loop(snapshot: Path, _outside: Path, name: str) -> str:
    (snapshot / name).unlink()
    (snapshot / name).symlink_to(snapshot / name)
    return name


CASES: dict[str, tuple[Callable[[Path, Path, str], str], str, str]] = {
    # case: (trick, file, what stderr says)
    "required file links outside": (_outside_copy, "nodes.json", "outside the snapshot directory"),
    "optional file links outside": (_outside_copy, "pdbs.json", "outside the snapshot directory"),
    "metrics file links outside": (_outside_copy, "metrics/up.json", "outside the snapshot directory"),
    "relative link climbs out": (_relative_escape, "pods.json", "outside the snapshot directory"),
    "link to /dev/zero": (_to_dev_zero, "snapshot.json", "outside the snapshot directory"),
    "metrics link to /dev/zero": (_to_dev_zero, "metrics/DCGM_FI_DEV_GPU_UTIL.json", "outside"),
    "a FIFO": (_fifo, "pods.json", "not a regular file"),
    "a metrics FIFO": (_fifo, "metrics/DCGM_FI_DEV_FB_USED.json", "not a regular file"),
    "a directory": (_directory, "instances.json", "not a regular file"),
    "the metrics folder links outside": (_metrics_folder_outside, "", "outside the snapshot directory"),
    "a symlink loop": (_loop, "nodegroups.json", "nodegroups.json"),
}


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    copy = tmp_path / "snap"
    shutil.copytree(example_snapshot_dir(), copy)
    (tmp_path / "outside").mkdir()
    return copy


@pytest.mark.timeout(60)  # a FIFO opened blocking would hang here
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_path_trick_is_refused_naming_the_file(
    snapshot: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trick, name, says = CASES[case]
    named = trick(snapshot, snapshot.parent / "outside", name)

    code = main(["plan", "--snapshot", str(snapshot), "--json"])

    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert named in captured.err and says in captured.err, captured.err


def test_a_file_over_the_stated_size_is_refused_before_it_is_read(
    snapshot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A sparse file one byte over the limit: refused on its size, never read (no 512 MiB in memory).
    with (snapshot / "pods.json").open("r+b") as handle:
        handle.truncate(snapshot_files.MAX_FILE_BYTES + 1)

    assert main(["plan", "--snapshot", str(snapshot)]) == 2
    err = capsys.readouterr().err
    assert "pods.json" in err and f"over the {snapshot_files.MAX_FILE_BYTES}-byte limit" in err, err


def test_a_link_that_stays_inside_the_directory_is_read(
    snapshot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = main(["plan", "--snapshot", str(snapshot), "--json"]), capsys.readouterr().out
    (snapshot / "archive").mkdir()
    for name in ("nodes.json", "metrics/up.json"):
        moved = snapshot / "archive" / name.replace("/", "_")
        shutil.move(snapshot / name, moved)
        (snapshot / name).symlink_to(moved)
    # the snapshot folder itself may be a link (the operator named it)
    alias = snapshot.parent / "alias"
    alias.symlink_to(snapshot)

    assert (main(["plan", "--snapshot", str(alias), "--json"]), capsys.readouterr().out) == expected
    assert expected[0] == 0

"""Every ``docs/architecture.md §N`` reference in the repository resolves to a section of that document, and
no reference points at the design document that is not in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    suffixes = {".py", ".md", ".yaml", ".yml", ".json", ".toml", ".txt", ".asl", ""}
    return [ROOT / name for name in listed if Path(name).suffix in suffixes and (ROOT / name).is_file()]


def test_every_section_reference_resolves() -> None:
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", DOC.read_text(encoding="utf-8"), re.MULTILINE)}
    assert sections == set(range(1, 11))
    unresolved = []
    for path in _tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number in re.findall(r"docs/architecture\.md §(\d+)", text):
            if int(number) not in sections:
                unresolved.append(f"{path.relative_to(ROOT)}: §{number}")
    assert unresolved == []


def test_no_reference_to_the_design_document_outside_the_repository() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path in _tracked_text_files()
        if path != DOC and re.search(r"\b[Dd]esign §\d", path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert stale == []

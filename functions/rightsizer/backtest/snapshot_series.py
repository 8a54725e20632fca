"""A backtest history from a directory of snapshot directories (``rightsizer backtest --snapshot-series``).

Metrics format 1 snapshots are merged into series re-windowed at every decision step; metrics format 2
snapshots are kept whole and decided at their own instants (``History.recorded``, docs/architecture.md §5).
Nothing here decides.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.adapters.snapshot_files import read_snapshot_file
from rightsizer.backtest.model import Frame, History, Source
from rightsizer.backtest.sources import _rfc, _to_metric_data
from rightsizer.domain.errors import ConfigError, SnapshotError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.usage import GPU_UTIL, PROF_ACTIVE

__all__ = ["read_snapshot_series"]


def _parse_name(name: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(name.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


def read_snapshot_series(directory: str | Path) -> Source:
    """Read a directory of snapshot directories (docs/architecture.md §5) named by their RFC 3339 time.

    Each snapshot is a frame from its time to the next one's (the first also covers its own metric
    window); the metric series of all snapshots are merged per series (labels) and time, so the history
    spans from the first snapshot's window start to the last snapshot. Time between snapshots that no
    window covers has no samples: nodes are ``unknown`` there and never removed.

    Metrics format 1 snapshots (raw samples per step) are merged into series re-windowed at every
    decision step. Metrics format 2 snapshots (what ``rightsizer snapshot`` writes) record facts over
    their own idle window, which cannot be re-windowed: the history keeps them whole
    (``History.recorded``) and the replay decides at each snapshot's instant on that snapshot's own facts,
    as ``plan --snapshot`` does, with the simulated removals applied; their per-step activity maxima
    (every raw sample counted) are merged for the accounting (oracle, regrets, unserved minutes).

    Raises:
        ConfigError: not a directory, no snapshots, a sub-directory name that is not RFC 3339 with an
            offset, snapshots with different step seconds, or snapshots of different metrics formats
            (``field`` ``metrics_format``).
        SnapshotError: a snapshot directory that does not load (names the file and the field).
    """
    root = Path(directory)
    entries = _snapshot_dirs(root)
    snaps = [load_snapshot(path, node_label=_recorded_node_label(path)) for _, path in entries]
    steps = {s.meta.step_seconds for s in snaps}
    if len(steps) != 1:
        raise ConfigError(f"snapshots use different step seconds {sorted(steps)}", source=str(root))
    _names_agree(entries, snaps, steps.pop())
    formats = {s.meta.metrics_format for s in snaps}
    if len(formats) != 1:
        raise ConfigError(
            f"snapshots of metrics formats {sorted(formats)} cannot be replayed as one history (format 1 "
            "is re-windowed from raw samples, format 2 decided on each snapshot's own facts); keep one "
            "format per directory",
            source=str(root),
            field="metrics_format",
        )
    recorded = formats == {2}
    notes: list[str] = []
    merged, merged_ts = _merge_series(entries, snaps, recorded, notes)
    first = snaps[0]
    start = first.meta.taken_at.timestamp() - first.meta.window_seconds
    frames = []
    for k, snap in enumerate(snaps):
        frames.append(
            Frame(
                at=start if k == 0 else snap.meta.taken_at.timestamp(),
                nodes=snap.nodes,
                pods=snap.pods,
                pdbs=snap.pdbs,
                resource_claims=snap.resource_claims,
                inventory=snap.inventory if snap.inventory.known else None,
            )
        )
    if any(not s.inventory.known for s in snaps):
        notes.append("snapshots without nodegroups.json: each node is its own node group there")
    history = History(
        cluster=first.meta.cluster,
        region=first.meta.region,
        start=start,
        end=snaps[-1].meta.taken_at.timestamp(),
        resolution=first.meta.step_seconds,
        frames=tuple(frames),
        metrics=_to_metric_data(merged),
        timestamps=_to_metric_data(merged_ts),
        node_label=first.node_label,
        recorded=tuple(snaps) if recorded else (),
    )
    if recorded:
        notes.append(
            "metrics format 2: each snapshot is decided at its own time on its own facts (its idle "
            "window); nothing is decided between snapshots"
        )
    return Source(
        kind="snapshot-series",
        description=f"{root}: {len(snaps)} snapshots of {first.meta.cluster}",
        history=history,
        inventory="snapshots",
        notes=tuple(dict.fromkeys(notes)),
    )


def _names_agree(entries: list[tuple[datetime, Path]], snaps: list[ClusterSnapshot], step: int) -> None:
    """The series is ordered by directory name and replayed by each snapshot's own ``taken_at``: the two
    must be one time line. A name more than one step from its snapshot's ``taken_at`` (a snapshot copied
    under another time's name), or two directories holding one instant, would replay silently out of
    order or twice; a name a few seconds off (``rightsizer snapshot --out snaps/$(date -u +%FT%TZ)``) is
    the same instant.

    Raises:
        ConfigError: naming the directory, its name's time and its ``taken_at`` (``field`` ``taken_at``).
    """
    seen: dict[datetime, Path] = {}
    for (named, path), snap in zip(entries, snaps, strict=True):
        taken = snap.meta.taken_at
        if abs((taken - named).total_seconds()) > step:
            raise ConfigError(
                f"named {_rfc(named.timestamp())} but taken at {_rfc(taken.timestamp())}; name it by its own time",
                source=str(path),
                field="taken_at",
            )
        if taken in seen:
            raise ConfigError(
                f"taken at {_rfc(taken.timestamp())}, as {seen[taken]} is: a history holds each instant once",
                source=str(path),
                field="taken_at",
            )
        seen[taken] = path


def _snapshot_dirs(root: Path) -> list[tuple[datetime, Path]]:
    """The snapshot directories under ``root`` by time, oldest first (names are RFC 3339 times).

    Raises:
        ConfigError: ``root`` is not a directory, holds none, or a sub-directory is not named by a time.
    """
    if not root.is_dir():
        raise ConfigError("not a directory", source=str(root))
    entries: list[tuple[datetime, Path]] = []
    for child in sorted(root.iterdir()):
        if not child.is_dir():
            continue
        at = _parse_name(child.name)
        if at is None:
            raise ConfigError(
                "snapshot directories are named by their RFC 3339 time (e.g. 2026-11-02T10:00:00Z)",
                source=str(child),
            )
        entries.append((at, child))
    if not entries:
        raise ConfigError("no snapshot directories found", source=str(root))
    return sorted(entries)


_Merged = dict[str, dict[tuple[tuple[str, str], ...], dict[float, float]]]


def _merge_series(
    entries: Sequence[tuple[datetime, Path]],
    snaps: Sequence[ClusterSnapshot],
    recorded: bool,
    notes: list[str],
) -> tuple[_Merged, _Merged]:
    """(metrics, timestamps) of all snapshots merged per series and time. Format 2 (``recorded``): only
    the per-step activity maxima, the one part of its facts that is a history."""
    merged: _Merged = {}
    merged_ts: _Merged = {}
    for (at, _), snap in zip(entries, snaps, strict=True):
        for target, data in ((merged, snap.metrics), (merged_ts, snap.timestamps)):
            for name, md in data.items():
                if recorded and (target is merged_ts or name not in (GPU_UTIL, PROF_ACTIVE)):
                    continue
                per = target.setdefault(name, {})
                if md.problem:
                    notes.append(
                        f"{name} unusable in the snapshot of {_rfc(at.timestamp())}: its window has no samples"
                    )
                    continue
                for s in md.series:
                    points = per.setdefault(tuple(sorted(s.labels.items())), {})
                    points.update(zip(s.times, s.values, strict=True))
    return merged, merged_ts


def _recorded_node_label(directory: Path) -> str | None:
    try:
        meta = json.loads(read_snapshot_file(directory, directory / "snapshot.json"))
    except (OSError, ValueError, SnapshotError):  # load_snapshot says why, naming the file
        return None
    label = meta.get("node_label") if isinstance(meta, dict) else None
    return label if isinstance(label, str) and label else None

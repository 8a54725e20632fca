"""Write a snapshot directory while the cluster is read (``rightsizer snapshot``, docs/architecture.md §5, §8).

``SnapshotDirectoryWriter`` is the ``SnapshotSink`` of ``services.snapshot.record``: every Kubernetes
object is projected (``snapshot_projection.PagedProjection``: only what a decision reads) and appended to
its list file as it arrives, and every metrics answer is projected (the series labels the decision
reads) and written on its own, so the process never holds a whole list or more than one answer — its
memory does not grow with the number of objects
(issue 11 item 7; ``tests/integration/test_snapshot_memory.py``). Nodes are the one kind kept back: their
label keys depend on every pod and PersistentVolume (selectors), so their drafts are spooled to a file in
the staging directory and finished at :meth:`~SnapshotDirectoryWriter.commit`.

Atomic: everything goes to a staging directory beside ``out`` (mode 0700: a snapshot names every node,
pod and instance) that is renamed onto ``out`` at commit, so ``out`` either does not exist or holds a
complete snapshot — never half of one. Any failure before the commit removes the staging directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

from rightsizer.adapters.snapshot_projection import PagedProjection
from rightsizer.domain.errors import ConfigError

__all__ = ["SnapshotDirectoryWriter", "require_free_output"]

_SPOOL: Final = ".nodes.spool.jsonl"
_LIST_HEAD: Final = '{"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": ['


def require_free_output(out: str | Path) -> Path:
    """``out`` as a path, when it does not exist or is an empty directory.

    Raises:
        ConfigError: ``out`` exists and is not an empty directory (names ``--out``).
    """
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} exists and is not an empty directory", field="--out")
    return target


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class SnapshotDirectoryWriter:
    """A snapshot directory at ``out``, written object by object (module docstring).

    Use as a context manager: leaving it without :meth:`commit` (an exception) removes everything.
    ``policy_node_labels``: the label keys the config's ``policy.node_selector`` compares, kept on nodes;
    ``node_label``: config ``prometheus.node_label``, kept on metrics series (``series_label_keys``);
    ``policy_pod_labels``: the pod label keys the policy reads (``showback_team_label``), kept on pods.

    Raises:
        ConfigError: ``out`` exists and is not an empty directory (names ``--out``).
    """

    def __init__(
        self,
        out: str | Path,
        *,
        policy_node_labels: tuple[str, ...] = (),
        node_label: str | None = None,
        policy_pod_labels: tuple[str, ...] = (),
    ) -> None:
        self.target = require_free_output(out)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._staging = Path(
            tempfile.mkdtemp(prefix=f".{self.target.name}.", suffix=".tmp", dir=self.target.parent)
        )
        self._projection = PagedProjection(policy_node_labels, node_label, policy_pod_labels)
        self._lists: dict[str, tuple[IO[str], list[int]]] = {}
        self._done = False

    def __enter__(self) -> SnapshotDirectoryWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._done:
            self.abort()

    # -- SnapshotSink

    def begin(self, path: str) -> None:
        """Start (or, after a restarted list, start over) the kubectl ``List`` document ``path``."""
        old = self._lists.pop(path, None)
        if old is not None:
            old[0].close()
        name = _SPOOL if path == "nodes.json" else path
        file = self._open(name)
        if path != "nodes.json":
            file.write(_LIST_HEAD)
        self._lists[path] = (file, [0])

    def add(self, path: str, item: dict[str, Any]) -> None:
        """Append one object (kubectl form) to the list ``path``, projected (nodes: spooled as drafts)."""
        file, count = self._lists[path]
        if path == "nodes.json":
            file.write(_dump(self._projection.node_draft(item)) + "\n")
        else:
            file.write(("\n" if count[0] == 0 else ",\n") + _dump(self._projection.item(path, item)))
        count[0] += 1

    def put(self, path: str, document: Any) -> None:
        """Write the whole document ``path``, projected; bytes (a Prometheus answer) are decoded first —
        one answer at a time — and bytes that are not JSON are written as ``null`` (an unusable answer)."""
        if isinstance(document, bytes | bytearray):
            try:
                document = json.loads(document)
            except ValueError:
                document = None
        with self._open(path) as fh:
            json.dump(self._projection.document(path, document), fh, indent=2, ensure_ascii=False)
            fh.write("\n")
            _sync(fh)

    def counts(self) -> dict[str, int]:
        """Objects written so far per list document."""
        return {path: count[0] for path, (_, count) in self._lists.items()}

    def commit(self) -> Path:
        """Finish the lists (nodes last, with their final label keys) and rename the directory onto ``out``.

        Returns:
            The snapshot directory.
        """
        nodes = self._lists.pop("nodes.json", None)
        for file, _ in self._lists.values():
            file.write("\n]}\n")
            _sync(file)
            file.close()
        if nodes is not None:
            spool, _ = nodes
            spool.close()
            with (self._staging / _SPOOL).open(encoding="utf-8") as drafts, self._open("nodes.json") as fh:
                fh.write(_LIST_HEAD)
                for k, line in enumerate(drafts):
                    fh.write(
                        ("\n" if k == 0 else ",\n") + _dump(self._projection.node_final(json.loads(line)))
                    )
                fh.write("\n]}\n")
                _sync(fh)
            (self._staging / _SPOOL).unlink()
        # rename(2) replaces an empty directory atomically; a non-empty one was refused at the start.
        os.replace(self._staging, self.target)
        self._done = True
        return self.target

    def abort(self) -> None:
        """Remove everything written so far."""
        for file, _ in self._lists.values():
            file.close()
        self._lists.clear()
        shutil.rmtree(self._staging, ignore_errors=True)
        self._done = True

    # -- plumbing

    def _open(self, relative: str) -> IO[str]:
        path = self._staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("w", encoding="utf-8")


def _sync(fh: IO[Any]) -> None:
    fh.flush()
    os.fsync(fh.fileno())

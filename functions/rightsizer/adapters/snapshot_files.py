"""Reading a snapshot directory's files without following it anywhere else (issue 26).

A snapshot directory comes from someone else more often than not (a bug report, a colleague's capture),
so its files are read as untrusted: a file — or the ``metrics`` folder — that is a symbolic link pointing
outside the directory is refused, so is anything but a regular file (a FIFO would block forever,
``/dev/zero`` would fill memory), and so is a file over ``MAX_FILE_BYTES``. Each refusal is a
``SnapshotError`` naming the file. The checks are made on the opened descriptor (``fstat``), so a file
swapped between check and read is still checked, and a read never takes more than the limit plus one byte.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from rightsizer.domain.errors import SnapshotError

__all__ = ["MAX_FILE_BYTES", "read_snapshot_file"]

#: The largest snapshot file read (bytes): 512 MiB, about ten times the ``pods.json`` of a 10,000-node
#: cluster with 15 pods per node as ``rightsizer snapshot`` projects it. JSON this size already takes
#: several GiB to decode.
MAX_FILE_BYTES: Final = 512 * 1_048_576


def read_snapshot_file(root: Path, path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a file of the snapshot directory ``root``.

    Args:
        root: the snapshot directory (itself may be a symbolic link: the operator named it).
        path: a file under ``root``.
        max_bytes: the largest file accepted.

    Raises:
        FileNotFoundError: ``path`` does not exist (the caller decides whether it was required).
        SnapshotError: ``path`` resolves outside ``root``, is not a regular file, is larger than
            ``max_bytes``, or cannot be read; the message names the file.
    """
    try:
        base, target = root.resolve(), path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise SnapshotError(f"cannot be resolved: {exc}", source=str(path)) from exc
    if not target.is_relative_to(base):
        raise SnapshotError(
            f"is a symbolic link to {target}, outside the snapshot directory {base}; refused",
            source=str(path),
        )
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked right after.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SnapshotError(f"cannot read: {exc.strerror}", source=str(path)) from exc
    info = os.fstat(fd)
    refusal = None
    if not stat.S_ISREG(info.st_mode):
        refusal = "is not a regular file (a device, FIFO, socket or directory); refused"
    elif info.st_size > max_bytes:
        refusal = f"is {info.st_size} bytes, over the {max_bytes}-byte limit of a snapshot file"
    if refusal is not None:
        os.close(fd)
        raise SnapshotError(refusal, source=str(path))
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise SnapshotError(f"is over the {max_bytes}-byte limit of a snapshot file", source=str(path))
    return data

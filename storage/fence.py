"""A replicated log's fence: the oldest leader epoch its member still takes chunks from.

Role: an election fences a quorum of a stream's members at the epoch it is about to write in
etcd before it compares their tails, so that the deposed leader can commit nothing more in its
own epoch while the new one is chosen (docs/REPLICATION.md). The fence must outlive a crash of
the member (a member that forgot it after kill -9 could take the old leader's chunks again), so
it is one small file beside the segments, `fence`, written whole and renamed into place.

Layout (docs/FORMAT.md section 1): the 8-byte file header (magic `LVFN`, version 1), then the
epoch as a little-endian uint64. A missing file is epoch 0 (nothing fenced).

Must not know: who leads, the network, chunks.
Threading: stateless functions; the Log that owns the directory calls them from its thread.
"""

from __future__ import annotations

import struct
from pathlib import Path

from leveret.storage import layout
from leveret.storage.errors import CorruptLogError, io_error

MAGIC = b"LVFN"
NAME = "fence"
_EPOCH = struct.Struct("<Q")


def read(directory: Path) -> int:
    path = directory / NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise io_error(path, exc) from exc
    problem = layout.header_problem(data, MAGIC)
    if problem is None and len(data) != layout.FILE_HEADER_SIZE + _EPOCH.size:
        problem = f"{len(data)} bytes, expected {layout.FILE_HEADER_SIZE + _EPOCH.size}"
    if problem is not None:
        raise CorruptLogError(path, 0, problem)
    return int(_EPOCH.unpack_from(data, layout.FILE_HEADER_SIZE)[0])


def write(directory: Path, epoch: int) -> None:
    """Replace the fence with `epoch`, durably (the file and the directory entry synced)."""
    path = directory / NAME
    try:
        layout.replace_durably(path, layout.file_header(MAGIC) + _EPOCH.pack(epoch))
    except OSError as exc:
        raise io_error(path, exc) from exc

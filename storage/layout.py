"""Directory layout: the file names of a log and the 8-byte header every file starts with.

Role: turn a base offset into `<20 digits>.segment` / `.index` paths, list the segments of a
directory, and write or check file headers (magic + version). See docs/FORMAT.md sections 1-2.

Must not know: chunks, indexes' contents, or any policy. Names come only from integers: a log
never derives a file name from user input.
Threading: stateless functions; safe from any thread.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

FILE_HEADER = struct.Struct("<4sI")
FILE_HEADER_SIZE = FILE_HEADER.size
FORMAT_VERSION = 1
SEGMENT_MAGIC = b"LVSG"
INDEX_MAGIC = b"LVIX"
SEGMENT_SUFFIX = ".segment"
INDEX_SUFFIX = ".index"
_DIGITS = 20


def file_name(base: int, suffix: str) -> str:
    return f"{base:0{_DIGITS}d}{suffix}"


def segment_path(directory: Path, base: int) -> Path:
    return directory / file_name(base, SEGMENT_SUFFIX)


def index_path(directory: Path, base: int) -> Path:
    return directory / file_name(base, INDEX_SUFFIX)


def parse_name(name: str, suffix: str) -> int | None:
    """The base offset encoded in a file name, or None if it is not one of ours."""
    stem = name[: -len(suffix)]
    if not name.endswith(suffix) or len(stem) != _DIGITS or not stem.isdigit():
        return None
    return int(stem)


def list_bases(directory: Path, suffix: str = SEGMENT_SUFFIX) -> list[int]:
    """Sorted base offsets of the files with `suffix` in `directory` (others are ignored)."""
    bases = []
    for name in os.listdir(directory):
        base = parse_name(name, suffix)
        if base is not None:
            bases.append(base)
    bases.sort()
    return bases


def file_header(magic: bytes) -> bytes:
    return FILE_HEADER.pack(magic, FORMAT_VERSION)


def header_problem(data: bytes, magic: bytes) -> str | None:
    """Why `data` (a file's first bytes) is not a valid header for `magic`, or None if it is."""
    if len(data) < FILE_HEADER_SIZE:
        return f"file shorter than its {FILE_HEADER_SIZE}-byte header"
    found, version = FILE_HEADER.unpack_from(data)
    if found != magic:
        return f"bad magic {found!r}, expected {magic!r}"
    if version != FORMAT_VERSION:
        return f"unsupported format version {version}"
    return None


def replace_durably(path: Path, data: bytes) -> None:
    """Replace the file at `path` with `data`, durably: written to a staging file and synced,
    renamed over `path`, and the directory entry synced. Raises OSError."""
    staging = path.with_name(f"{path.name}.new")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staging, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

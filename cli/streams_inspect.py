"""`leveret-streams` inspection commands over a data directory: dump_chunk, dump_index,
verify and log_overview. They call the storage engine's inspection functions (read-only: they
never lock, repair or write) and work with the broker stopped or running.

A stream is named with `--stream NAME [-p VHOST]` and found through the data directory's
metadata database (opened read-only), since folder names never come from queue names; or a
log folder is given directly with `--log-dir`. Presentation only.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES
from leveret.cli.streams_api import Fmt, Formatter, Vhost, emit_rows
from leveret.storage import OffsetSpec, Reader, StorageError, inspect

DataDir = Annotated[Path, typer.Option(
    "--data-dir", envvar="LEVERET_DATA_DIR", help="The broker's data directory.")]
StreamName = Annotated[str | None, typer.Option("--stream", help="The stream's name.")]
LogDir = Annotated[Path | None, typer.Option(
    "--log-dir", help="A log folder, instead of --data-dir and --stream.")]
METADATA = "metadata.sqlite3"


def fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(1)


def _metadata_rows(data_dir: Path) -> list[tuple[str, str, str, str | None]]:
    """(vhost, name, type, storage_id) of every durable queue, read without writing."""
    path = data_dir / METADATA
    if not path.exists():
        fail(f"{data_dir} is not a Leveret data directory (it has no {METADATA})")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return list(db.execute("SELECT vhost, name, type, storage_id FROM queues"))
        finally:
            db.close()
    except sqlite3.Error as exc:
        fail(f"cannot read {path}: {exc}")


def log_directory(data_dir: Path, stream: str | None, vhost: str, log_dir: Path | None) -> Path:
    if log_dir is not None:
        if not log_dir.is_dir():
            fail(f"no log folder at {log_dir}")
        return log_dir
    if stream is None:
        fail("name a stream with --stream (and -p VHOST), or a folder with --log-dir")
    for row_vhost, name, _type, storage_id in _metadata_rows(data_dir):
        if row_vhost == vhost and name == stream and storage_id:
            directory = data_dir / "queues" / storage_id
            if not directory.is_dir():
                fail(f"the files of stream '{stream}' are missing: {directory}")
            return directory
    fail(f"no stream '{stream}' in vhost '{vhost}' in {data_dir}")


def _text(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value


def _show_mapping(data: dict[str, Any], fmt: Formatter) -> None:
    if fmt is Formatter.json:
        typer.echo(json.dumps(_text(data), indent=2))
        return
    rows = [{"field": k, "value": _text(v)} for k, v in data.items()]
    emit_rows(rows, ["field", "value"], fmt)


def _segments(directory: Path) -> list[dict[str, Any]]:
    segments: list[dict[str, Any]] = inspect.summarise(directory)["segments"]
    return segments


def _segment_for(directory: Path, offset: int) -> dict[str, Any]:
    chosen = None
    for segment in _segments(directory):
        if segment["first_offset"] <= offset:
            chosen = segment
    if chosen is None:
        fail(f"offset {offset} is before the first segment of {directory}")
    return chosen


def _guard(action: Any) -> Any:
    try:
        return action()
    except (StorageError, OSError) as exc:
        fail(str(exc))


def dump_chunk(
    offset: Annotated[int, typer.Option("--offset", help="An offset inside the chunk.")],
    data_dir: DataDir = Path("./leveret-data"), stream: StreamName = None, vhost: Vhost = "/",
    log_dir: LogDir = None,
    records: Annotated[bool, typer.Option("--records", help="Also list the chunk's records "
                                          "(offset, size and a preview).")] = False,
    formatter: Fmt = Formatter.table,
) -> None:
    """Dump the header of the chunk that holds an offset: type, first offset, records,
    timestamp, sizes, CRC check and tracking entries.

    Example: leveret-streams dump_chunk --data-dir ./leveret-data --stream invoices-0 --offset 42
    """
    directory = log_directory(data_dir, stream, vhost, log_dir)

    def find() -> dict[str, Any]:
        segment = _segment_for(directory, offset)
        for chunk in inspect.dump_segment(directory / segment["file"]):
            if "error" in chunk:
                fail(f"{segment['file']} at {chunk['position']}: {chunk['error']}")
            if chunk["records"] and chunk["first_offset"] <= offset < (
                    chunk["first_offset"] + chunk["records"]):
                return dict(chunk, segment=segment["file"])
        fail(f"no chunk holds offset {offset} in {directory}")

    chunk = _guard(find)
    if records:
        chunk["record_list"] = _guard(lambda: _records(directory, chunk["first_offset"]))
    _show_mapping(chunk, formatter)


def _records(directory: Path, first: int) -> list[dict[str, Any]]:
    with Reader.open(directory, OffsetSpec.offset(first), chunk_types=STREAM_CHUNK_TYPES) as reader:
        view = reader.read()
    if view is None:
        return []
    return [{"offset": o, "bytes": len(r), "preview": bytes(r[:48]).decode("latin-1")}
            for o, r in view.items()]


def dump_index(
    data_dir: DataDir = Path("./leveret-data"), stream: StreamName = None, vhost: Vhost = "/",
    log_dir: LogDir = None,
    offset: Annotated[int | None, typer.Option(
        "--offset", help="Only the index of the segment that holds this offset.")] = None,
    formatter: Fmt = Formatter.table,
) -> None:
    """Dump index entries: one per chunk, with its first offset, timestamp, file position,
    record count and type.

    Example: leveret-streams dump_index --data-dir ./leveret-data --stream invoices-0
    """
    directory = log_directory(data_dir, stream, vhost, log_dir)

    def entries() -> list[dict[str, Any]]:
        segments = [_segment_for(directory, offset)] if offset is not None else \
            _segments(directory)
        rows = []
        for segment in segments:
            index = segment["file"].replace(".segment", ".index")
            rows += [dict(entry, file=index) for entry in inspect.dump_index(directory / index)]
        return rows

    emit_rows(_guard(entries), ["file", "first_offset", "timestamp_ms", "position",
                                "num_records", "chunk_type", "flags"], formatter)


def verify(
    data_dir: DataDir = Path("./leveret-data"), stream: StreamName = None, vhost: Vhost = "/",
    log_dir: LogDir = None, formatter: Fmt = Formatter.table,
) -> None:
    """Verify every chunk's CRCs, offset continuity and every index entry; exits 1 if
    anything is wrong.

    Example: leveret-streams verify --data-dir ./leveret-data --stream invoices-0
    """
    directory = log_directory(data_dir, stream, vhost, log_dir)
    problems = _guard(lambda: inspect.verify(directory))
    segments = len(_guard(lambda: _segments(directory)))
    if formatter is Formatter.json:
        typer.echo(json.dumps({"directory": str(directory), "segments": segments, "problems": [
            {"path": str(p.path), "position": p.position, "reason": p.reason}
            for p in problems]}, indent=2))
    elif not problems:
        typer.echo(f"No problems found in {directory} ({segments} segments checked)")
    for problem in problems:
        if formatter is Formatter.table:
            typer.echo(str(problem), err=True)
    if problems:
        raise typer.Exit(1)


def log_overview(
    data_dir: DataDir = Path("./leveret-data"), stream: StreamName = None, vhost: Vhost = "/",
    log_dir: LogDir = None, formatter: Fmt = Formatter.table,
) -> None:
    """Summarise a stream's log: offsets, records, bytes, segments and tracking. Without
    --stream or --log-dir, one line per stream of the data directory.

    Example: leveret-streams log_overview --data-dir ./leveret-data --stream invoices-0
    """
    if stream is None and log_dir is None:
        rows = []
        for row_vhost, name, type_, storage_id in _metadata_rows(data_dir):
            folder = data_dir / "queues" / (storage_id or "")
            if type_ != "stream" or not storage_id or not folder.is_dir():
                continue
            summary = _guard(lambda folder=folder: inspect.summarise(folder))
            rows.append({"vhost": row_vhost, "stream": name, **{
                k: summary[k] for k in ("first_offset", "last_offset", "records", "bytes")},
                "segments": len(summary["segments"])})
        emit_rows(rows, ["vhost", "stream", "first_offset", "last_offset", "records",
                         "segments", "bytes"], formatter)
        return
    directory = log_directory(data_dir, stream, vhost, log_dir)
    summary = _guard(lambda: inspect.summarise(directory))
    if formatter is Formatter.json:
        typer.echo(json.dumps(_text(summary), indent=2))
        return
    _show_mapping({k: v for k, v in summary.items() if k not in ("segments", "tracking")},
                  formatter)
    typer.echo("")
    emit_rows(summary["segments"], ["file", "first_offset", "next_offset", "chunks", "bytes",
                                    "first_timestamp_ms", "last_timestamp_ms"], formatter)
    tracking = [{"type": "writer", "name": _text(n), "value": v}
                for n, v in summary["tracking"]["publishers"].items()]
    tracking += [{"type": "offset", "name": _text(n), "value": v}
                 for n, v in summary["tracking"]["consumers"].items()]
    if tracking:
        typer.echo("")
        emit_rows(tracking, ["type", "name", "value"], formatter)


def register(app: typer.Typer) -> None:
    for command in (dump_chunk, dump_index, verify, log_overview):
        app.command(command.__name__)(command)

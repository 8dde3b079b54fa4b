"""The durable metadata store: one embedded SQLite database in the data directory.

It keeps what must survive a restart: vhosts, users, permissions, policies, and the durable
exchanges, queues (with the id of their storage folder) and bindings. The broker writes
through it as the model changes (it is the model's Observer) and reads it once at boot. AMQP
field values in argument tables are stored as typed JSON so that they come back with their
types (timestamps, decimals, byte arrays).

Synchronous; used from the event loop thread only. Each change is one small transaction;
the database runs in WAL mode, so a process crash (kill -9) loses nothing committed.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import sqlite3
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
# A vhost's default_queue_type is NULL in a vhost recorded before version 2 (it then follows
# the server's setting).
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS vhosts (name TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '[]', default_queue_type TEXT);
CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, password_hash TEXT NOT NULL,
    hashing_algorithm TEXT NOT NULL, tags TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS permissions (user TEXT NOT NULL, vhost TEXT NOT NULL,
    configure TEXT NOT NULL, write TEXT NOT NULL, read TEXT NOT NULL, PRIMARY KEY (user, vhost));
CREATE TABLE IF NOT EXISTS policies (vhost TEXT NOT NULL, name TEXT NOT NULL, pattern TEXT NOT NULL,
    apply_to TEXT NOT NULL, priority INTEGER NOT NULL, definition TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS exchanges (vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, internal INTEGER NOT NULL, arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS queues (vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, arguments TEXT NOT NULL, storage_id TEXT,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS bindings (vhost TEXT NOT NULL, source TEXT NOT NULL,
    destination_type TEXT NOT NULL, destination TEXT NOT NULL, routing_key TEXT NOT NULL,
    arguments TEXT NOT NULL, args_key TEXT NOT NULL,
    PRIMARY KEY (vhost, source, destination_type, destination, routing_key, args_key));
"""


class MetastoreError(Exception):
    """The metadata database cannot be opened or written; the message names the file."""


def encode_value(value: Any) -> Any:
    """An AMQP field value as JSON that keeps its type."""
    if isinstance(value, bool) or value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, dict):
        return {"$table": {k: encode_value(v) for k, v in value.items()}}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, datetime.datetime):
        return {"$timestamp": value.timestamp()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytearray):
        return {"$bytearray": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    raise TypeError(f"cannot store a field value of type {type(value).__name__}")


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if "$table" in value:
            return {k: decode_value(v) for k, v in value["$table"].items()}
        if "$timestamp" in value:
            return datetime.datetime.fromtimestamp(value["$timestamp"], tz=datetime.UTC)
        if "$decimal" in value:
            return decimal.Decimal(value["$decimal"])
        if "$bytearray" in value:
            return bytearray(base64.b64decode(value["$bytearray"]))
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"])
    return value


def dump_table(table: dict[str, Any]) -> str:
    return json.dumps({k: encode_value(v) for k, v in table.items()}, sort_keys=True)


def load_table(text: str) -> dict[str, Any]:
    return {k: decode_value(v) for k, v in json.loads(text).items()}


class Metastore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.Error as exc:
            raise MetastoreError(f"cannot open the metadata database {path}: {exc}") from None
        if row is None:
            self._write("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) == 1:
            self._upgrade_from_1()
        elif int(row[0]) != SCHEMA_VERSION:
            raise MetastoreError(
                f"the metadata database {path} has schema version {row[0]}; this Leveret "
                f"reads version {SCHEMA_VERSION}"
            )
        self.fresh = row is None

    def _upgrade_from_1(self) -> None:
        """Version 2 adds the vhosts' default_queue_type column (NULL: not recorded)."""
        self._write("BEGIN")
        self._write("ALTER TABLE vhosts ADD COLUMN default_queue_type TEXT")
        self._write("UPDATE meta SET value = '2' WHERE key = 'schema'")
        self._write("COMMIT")

    def _write(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        try:
            self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise MetastoreError(f"cannot write the metadata database {self.path}: {exc}") from None

    def rows(self, table: str) -> list[sqlite3.Row]:
        self.db.row_factory = sqlite3.Row
        try:
            return list(self.db.execute(f"SELECT * FROM {table}"))
        finally:
            self.db.row_factory = None

    def close(self) -> None:
        self.db.close()

    # -- writes -------------------------------------------------------------------------------

    def put_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str | None = None) -> None:
        self._write(
            "INSERT OR REPLACE INTO vhosts VALUES (?, ?, ?, ?)",
            (name, description, json.dumps(tags or []), default_queue_type),
        )

    def delete_vhost(self, name: str) -> None:
        for table in ("exchanges", "queues", "bindings", "policies", "permissions"):
            self._write(f"DELETE FROM {table} WHERE vhost = ?", (name,))
        self._write("DELETE FROM vhosts WHERE name = ?", (name,))

    def put_user(self, name: str, password_hash: str, algorithm: str, tags: list[str]) -> None:
        self._write(
            "INSERT OR REPLACE INTO users VALUES (?, ?, ?, ?)",
            (name, password_hash, algorithm, json.dumps(tags)),
        )

    def delete_user(self, name: str) -> None:
        self._write("DELETE FROM permissions WHERE user = ?", (name,))
        self._write("DELETE FROM users WHERE name = ?", (name,))

    def put_permission(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self._write(
            "INSERT OR REPLACE INTO permissions VALUES (?, ?, ?, ?, ?)",
            (user, vhost, configure, write, read),
        )

    def delete_permission(self, user: str, vhost: str) -> None:
        self._write("DELETE FROM permissions WHERE user = ? AND vhost = ?", (user, vhost))

    def put_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        apply_to: str,
        priority: int,
        definition: dict[str, Any],
    ) -> None:
        self._write(
            "INSERT OR REPLACE INTO policies VALUES (?, ?, ?, ?, ?, ?)",
            (vhost, name, pattern, apply_to, priority, json.dumps(definition)),
        )

    def delete_policy(self, vhost: str, name: str) -> None:
        self._write("DELETE FROM policies WHERE vhost = ? AND name = ?", (vhost, name))

    def put_exchange(
        self,
        vhost: str,
        name: str,
        type_: str,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        self._write(
            "INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?, ?, ?)",
            (vhost, name, type_, int(auto_delete), int(internal), dump_table(arguments)),
        )

    def delete_exchange(self, vhost: str, name: str) -> None:
        self._write("DELETE FROM exchanges WHERE vhost = ? AND name = ?", (vhost, name))

    def put_queue(
        self,
        vhost: str,
        name: str,
        type_: str,
        auto_delete: bool,
        arguments: dict[str, Any],
        storage_id: str | None,
    ) -> None:
        self._write(
            "INSERT OR REPLACE INTO queues VALUES (?, ?, ?, ?, ?, ?)",
            (vhost, name, type_, int(auto_delete), dump_table(arguments), storage_id),
        )

    def delete_queue(self, vhost: str, name: str) -> None:
        self._write("DELETE FROM queues WHERE vhost = ? AND name = ?", (vhost, name))

    def put_binding(
        self,
        vhost: str,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        args = dump_table(arguments)
        self._write(
            "INSERT OR REPLACE INTO bindings VALUES (?, ?, ?, ?, ?, ?, ?)",
            (vhost, source, destination_type, destination, routing_key, args, args),
        )

    def delete_binding(
        self,
        vhost: str,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        self._write(
            "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination_type = ? AND "
            "destination = ? AND routing_key = ? AND args_key = ?",
            (vhost, source, destination_type, destination, routing_key, dump_table(arguments)),
        )

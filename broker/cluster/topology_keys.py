"""Where the cluster's topology lives in etcd: the key layout and the escaping of names.

Role: build and parse the keys under `/leveret/<cluster>/topology/`:

    vhosts/<v>                      users/<u>                 permissions/<u>/<v>
    policies/<v>/<name>             exchanges/<v>/<name>      queues/<v>/<name>
    bindings/<v>/<source>/<e|q>/<destination>/<digest of routing key and arguments>

Every component is a user's name (any text, `/` and `%` included), so each is percent-encoded:
every UTF-8 byte outside `A-Z a-z 0-9 - . _ ~` becomes `%XX`. An escaped component never holds
a `/`, so `/` always ends a component, and the prefix `queues/<v>/` selects exactly the queues of
vhost `v` (never those of a vhost whose name starts with `v`). The empty name escapes to the
empty component, still delimited by `/`: queue "" of vhost `v` is the key `queues/v/` itself.

It must not know etcd's client, the records' contents or the model. Pure functions: any thread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from leveret.broker.metadata.store import encode_value

Kind = Literal["vhosts", "users", "permissions", "policies", "exchanges", "queues", "bindings"]
KINDS: tuple[Kind, ...] = ("vhosts", "users", "permissions", "policies", "exchanges", "queues",
                           "bindings")
DestinationType = Literal["exchange", "queue"]
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_DEST_CODE: dict[str, str] = {"exchange": "e", "queue": "q"}
_DEST_TYPE: dict[str, DestinationType] = {"e": "exchange", "q": "queue"}


def escape(name: str) -> str:
    """`name` as one key component: percent-encoded UTF-8 (lone surrogates kept, reversibly)."""
    raw = name.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def unescape(component: str) -> str:
    return bytes(_unquote(component)).decode("utf-8", "surrogatepass")


def _unquote(component: str) -> bytearray:
    out = bytearray()
    index = 0
    while index < len(component):
        char = component[index]
        if char == "%":
            out.append(int(component[index + 1:index + 3], 16))
            index += 3
        else:
            out += char.encode("ascii")
            index += 1
    return out


def binding_digest(routing_key: str, arguments: Mapping[str, Any]) -> str:
    """A binding's identity beyond its ends: routing key and arguments, typed (1 != 1.0)."""
    body = json.dumps([routing_key, {k: encode_value(v) for k, v in arguments.items()}],
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def topology_root(cluster: str) -> str:
    return f"/leveret/{escape(cluster)}/topology/"


class TopologyKeys:
    """The keys of one cluster's topology, under `root` (ending in `/`)."""

    def __init__(self, root: str) -> None:
        if not root.endswith("/"):
            raise ValueError(f"a topology root ends with '/': {root!r}")
        self.root = root

    def _key(self, kind: Kind, *names: str) -> bytes:
        return (self.root + kind + "/" + "/".join(escape(n) for n in names)).encode()

    def _scope(self, kind: Kind, *names: str) -> bytes:
        """The prefix of every key of `kind` below `names` (ends in `/`)."""
        return (self.root + kind + "/" + "".join(escape(n) + "/" for n in names)).encode()

    def everything(self) -> bytes:
        return self.root.encode()

    def kind_prefix(self, kind: Kind) -> bytes:
        return self._scope(kind)

    def vhost(self, vhost: str) -> bytes:
        return self._key("vhosts", vhost)

    def user(self, user: str) -> bytes:
        return self._key("users", user)

    def permission(self, user: str, vhost: str) -> bytes:
        return self._key("permissions", user, vhost)

    def permissions_of(self, user: str) -> bytes:
        return self._scope("permissions", user)

    def policy(self, vhost: str, name: str) -> bytes:
        return self._key("policies", vhost, name)

    def exchange(self, vhost: str, name: str) -> bytes:
        return self._key("exchanges", vhost, name)

    def queue(self, vhost: str, name: str) -> bytes:
        return self._key("queues", vhost, name)

    def destination(self, vhost: str, kind: DestinationType, name: str) -> bytes:
        return self.queue(vhost, name) if kind == "queue" else self.exchange(vhost, name)

    def binding(self, vhost: str, source: str, kind: DestinationType, destination: str,
                routing_key: str, arguments: Mapping[str, Any]) -> bytes:
        digest = binding_digest(routing_key, arguments)
        return self._key("bindings", vhost, source, _DEST_CODE[kind], destination) + (
            b"/" + digest.encode())

    def bindings_from(self, vhost: str, source: str) -> bytes:
        return self._scope("bindings", vhost, source)

    def in_vhost(self, kind: Kind, vhost: str) -> bytes:
        """The prefix of the policies, exchanges, queues or bindings of `vhost`."""
        return self._scope(kind, vhost)

    def parse(self, key: bytes) -> tuple[Kind, list[str]] | None:
        """A key's kind and unescaped components (a binding's digest stays as it is); None for
        a key outside this layout."""
        text = key.decode("ascii", "replace")
        if not text.startswith(self.root):
            return None
        kind, _, rest = text[len(self.root):].partition("/")
        if kind not in KINDS:
            return None
        parts = rest.split("/")
        names = [unescape(p) for p in (parts[:-1] if kind == "bindings" else parts)]
        if kind == "bindings":
            names.append(parts[-1])
        return kind, names

    def binding_destination(self, key: bytes) -> tuple[DestinationType, str] | None:
        """The destination (type, name) named by a binding key."""
        parsed = self.parse(key)
        if parsed is None or parsed[0] != "bindings" or len(parsed[1]) != 5:
            return None
        code = escape(parsed[1][2])
        if code not in _DEST_TYPE:
            return None
        return _DEST_TYPE[code], parsed[1][3]

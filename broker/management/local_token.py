"""The local credential of `leveretctl` and `leveret-diagnostics`, as RabbitMQ's Erlang cookie.

At start the node writes a token into its data directory (`.leveret-cli-token`, mode 0600, so
only the account that runs the node, and root, can read it). The management API takes
`Authorization: Bearer <token>` as an administrator with every permission on every vhost, and
only from a loopback address: whoever can read the node's files on its own machine may run the
operator tools with no password typed. On a single node the token is random at each start; a
cluster node derives it from the cluster's shared secret (an HMAC), so the token read on one
node's machine also opens its peers' APIs (`--node`), as the shared cookie does in RabbitMQ.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

TOKEN_FILE = ".leveret-cli-token"
LABEL = b"leveret-cli-token"
USER = "rmq-cli"  # the acting user's name, as rabbitmqctl's "rmq-internal"


def token_for(cluster_secret: str | None) -> str:
    if cluster_secret:
        return hmac.new(cluster_secret.encode(), LABEL, hashlib.sha256).hexdigest()
    return secrets.token_hex(32)


def write_token(data_dir: Path, token: str) -> None:
    """Write the token with owner-only permissions, replacing any previous file at once."""
    path = data_dir / TOKEN_FILE
    temporary = data_dir / (TOKEN_FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover file keeps its mode otherwise
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(temporary, path)


def matches(header: str, token: str | None) -> bool:
    """Whether an Authorization header carries the token (compared in constant time)."""
    scheme, _, given = header.partition(" ")
    return (token is not None and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), token.encode()))

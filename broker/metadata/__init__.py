"""The durable metadata of one node: what must survive a restart.

- `store`: the embedded SQLite database in the data directory (vhosts, users, permissions,
  policies, durable exchanges, queues and bindings).
- `recorder`: the vhosts' observer that records durable changes into the store, and restores
  them at boot.

It must not know the sessions, the cluster or any front end.
"""

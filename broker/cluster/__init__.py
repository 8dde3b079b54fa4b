"""Cluster mode: Leveret nodes coordinated by etcd (issue 14).

`etcd` is the client for etcd's v3 JSON gateway; `lease` keeps a node's etcd lease alive and
says when it is lost. Nothing here runs unless `leveret serve` is given `--etcd`: one node with
SQLite metadata stays the embedded default.
"""

"""Access and administration: users and permissions, and the writes the management API and
definitions make.

- `auth`: users, password hashes, tags and per-vhost permissions, as RabbitMQ models them.
- `admin`: administrative operations on the model and the metadata store (vhosts, users,
  permissions, policies).
- `access_store`: where those writes go: the local metadata store, or the cluster's etcd; queue,
  exchange and binding declarations go through the topology port (`broker/topology/`).
- `definitions`: export and import in RabbitMQ's JSON format.

It must not know the AMQP session, the stream protocol or the HTTP server that call it.
"""

"""Database connections of a process that drives many Sessions at once (ARCHITECTURE §3).

A worker thread waits most of its time: on a model's stream, on a tool, on a person answering an
elicitation. With PostgreSQL the connections come from one bounded pool per process (settings:
XAGENT_DB_POOL_SIZE, XAGENT_WORKER_DB_CONNECTIONS), and a thread hands its connection back before
such a wait, so the number of connections stays bounded whatever the number of Sessions in
flight. A thread that needs the database again takes a connection from the pool (waiting for one
when all are busy, up to XAGENT_DB_POOL_TIMEOUT).

Without a pool (SQLite: a file, not a server connection) handing back is a no-op.
"""

from __future__ import annotations

from django.db import connections


def hand_back_connections() -> None:
    """Before a wait: return this thread's pooled connections, unless a transaction is open (a
    connection inside `atomic` must stay: the wait is then the caller's bug, not ours to hide)."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not connection.settings_dict.get("OPTIONS", {}).get("pool"):
            continue
        if connection.in_atomic_block:
            continue
        connection.close()


def set_pool_size(max_size: int) -> None:
    """Before this process's first connection: bound its pool to `max_size` connections (a Celery
    worker process takes XAGENT_WORKER_DB_CONNECTIONS, the web process XAGENT_DB_POOL_SIZE)."""
    for alias in connections:
        pool = connections.settings[alias].get("OPTIONS", {}).get("pool")
        if isinstance(pool, dict):
            pool["max_size"] = max_size
            pool["min_size"] = min(pool.get("min_size", 1), max_size)

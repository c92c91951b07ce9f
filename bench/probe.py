"""What the in-process scenarios observe: when the model was called, and how many SQL statements
had run by then (every connection of the process, every thread).

Counting through an execute wrapper rather than `connection.queries` keeps the cost to one
integer increment and has no 9000-entry cap; it also sees queries on connections that other
threads (tool runners, watchers) open.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

TRANSACTION_CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")


class QueryCounter:
    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()
        self._installed = False

    def install(self) -> None:
        """Count on every database connection of this process from now on (idempotent)."""
        if self._installed:
            return
        from django.db import connections
        from django.db.backends.signals import connection_created

        connection_created.connect(self._on_connection_created, weak=False)
        for connection in connections.all(initialized_only=True):
            self._wrap(connection)
        self._installed = True

    def _on_connection_created(self, sender, connection, **kwargs):
        self._wrap(connection)

    def _wrap(self, connection) -> None:
        if self._wrapper not in connection.execute_wrappers:
            connection.execute_wrappers.append(self._wrapper)

    def _wrapper(self, execute, sql, params, many, context):
        # Statements that read or write rows; transaction control (SQLite's BEGIN, savepoints)
        # is not a query (PostgreSQL's BEGIN/COMMIT never pass through here at all).
        if not sql.startswith(TRANSACTION_CONTROL):
            with self._lock:
                self.count += 1
        return execute(sql, params, many, context)


@dataclass
class CallLog:
    """One entry per model call: (perf_counter seconds, queries counted so far)."""

    entries: list[tuple[float, int]] = field(default_factory=list)

    def stamp(self) -> None:
        self.entries.append((time.perf_counter(), QUERIES.count))

    def clear(self) -> None:
        self.entries.clear()


QUERIES = QueryCounter()
CALL_LOG = CallLog()
